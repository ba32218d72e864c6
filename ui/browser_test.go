package ui_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/browsertest"
	"github.com/godurable/godurable/internal/pgstoretest"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/ui"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// scene is a PostgreSQL store an operator might open the page on: a gate
// saturated by one key, a K = 1 key with a waiter, a key whose id is
// markup, a throttled rate limit, a fleet policy, a captured identity key
// and an instance awaiting a signal with a step history and an inbox.
type scene struct {
	st          *postgres.Store
	gateHolders []string // stripe:acme
	gateWaiters []string
	acctHolder  string // account:7
	acctWaiter  string
	awaiting    string
}

// scriptKey is a key id that would run script if a page printed it raw.
const scriptKey = `acct:<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">`

func newScene(t *testing.T) *scene {
	t.Helper()
	ctx := context.Background()
	pool := pgstoretest.Migrated.Pool(t)
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: pgtest.SchemaOf(pool), History: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	sc := &scene{st: st}

	_, err = st.SyncKeyLimits(ctx, "payments", store.KeyLimits{
		Limits:     []gate.Limit{{Name: "stripe", Limit: 2, Shards: 1}},
		RateLimits: []gate.RateLimit{{Name: "api", Limit: 1, Period: time.Hour, Burst: 1}},
	}, store.SyncOptions{})
	require.NoError(t, err)
	_, err = st.SyncConcurrencyPolicies(ctx, "billing", []store.ConcurrencyPolicy{{Queue: "mail", MaxActive: 4}}, store.SyncOptions{})
	require.NoError(t, err)

	ni := func(workflow, queue, key string, intent gate.Intent, state string) store.NewInstance {
		return store.NewInstance{ID: store.NewInstanceID(), Workflow: workflow, Version: 1, Queue: queue, Step: "start",
			State: json.RawMessage(state), Key: key, KeyIntent: intent}
	}
	insert := func(nis ...store.NewInstance) []string {
		res, err := st.Insert(ctx, nis)
		require.NoError(t, err)
		ids := make([]string, len(res))
		for i, r := range res {
			ids[i] = r.ID
		}
		return ids
	}
	stripe := insert(
		ni("charge", "default", "stripe:acme", gate.GateIntent, `{"amount":1200,"currency":"eur"}`),
		ni("charge", "default", "stripe:acme", gate.GateIntent, `{"amount":80,"currency":"eur"}`),
		ni("charge", "default", "stripe:acme", gate.GateIntent, `{"amount":15,"currency":"usd"}`),
		ni("charge", "default", "stripe:acme", gate.GateIntent, `{"amount":9900,"currency":"usd"}`))
	acct := insert(ni("sync", "default", "account:7", gate.Unspecified, `{"account":7}`),
		ni("sync", "default", "account:7", gate.Unspecified, `{"account":7}`))
	insert(ni("sync", "default", scriptKey, gate.Unspecified, `{"account":"<b>x</b>"}`))
	insert(ni("call", "default", "api:partner", gate.GateIntent, `{}`), ni("call", "default", "api:partner", gate.GateIntent, `{}`))
	insert(ni("sync", "other", "stripe:captured", gate.IdentityIntent, `{}`))
	var mail []store.NewInstance
	for i := range 6 {
		mail = append(mail, ni("email", "mail", "", gate.Unspecified, `{"to":"user`+string(rune('a'+i))+`@example.com"}`))
	}
	insert(mail...)
	hook := insert(ni("webhook", "hooks", "", gate.Unspecified, `{"order":"A-1001","items":[{"sku":"X1","qty":2}]}`))[0]

	now := time.Now()
	claim := func(queue string, limit int) []store.Claimed {
		res, err := st.Claim(ctx, store.ClaimRequest{Queue: queue, Worker: "worker-a", Limit: limit, Lease: time.Hour, Now: now})
		require.NoError(t, err)
		return res.Claimed
	}
	held := map[string]bool{}
	for _, c := range claim("default", 20) {
		held[c.ID] = true
	}
	for _, id := range stripe {
		if held[id] {
			sc.gateHolders = append(sc.gateHolders, id)
		} else {
			sc.gateWaiters = append(sc.gateWaiters, id)
		}
	}
	require.Len(t, sc.gateHolders, 2, "K = 2")
	require.True(t, held[acct[0]])
	sc.acctHolder, sc.acctWaiter = acct[0], acct[1]
	claim("mail", 2)

	// The webhook ran two steps, then parked on "paid" with a timeout.
	c := claim("hooks", 1)[0]
	_, err = st.Complete(ctx, "worker-a", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeReady, Step: "verify",
		State: c.State, History: &store.HistoryEntry{Step: "start", Worker: "worker-a", StartedAt: now.Add(-3 * time.Second),
			FinishedAt: now.Add(-2 * time.Second), Outcome: "next"}}}, now.Add(-2*time.Second))
	require.NoError(t, err)
	c = claim("hooks", 1)[0]
	_, err = st.Complete(ctx, "worker-a", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeAwait, Step: "ship",
		AwaitSignal: "paid", TimeoutAt: now.Add(24 * time.Hour), State: c.State,
		History: &store.HistoryEntry{Step: "verify", Worker: "worker-a", StartedAt: now.Add(-2 * time.Second),
			FinishedAt: now.Add(-500 * time.Millisecond), Outcome: "await"}}}, now.Add(-500*time.Millisecond))
	require.NoError(t, err)
	_, err = st.Signal(ctx, store.SignalRequest{InstanceID: hook, Name: "note", Payload: json.RawMessage(`{"from":"support","text":"customer called"}`)})
	require.NoError(t, err)
	sc.awaiting = hook
	return sc
}

func text(t *testing.T, ctx context.Context, css string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(css)))
	require.NoError(t, err, "text of %s", css)
	return s
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	require.NoError(t, err, "evaluate %s", js)
	return v
}

func open(t *testing.T, ctx context.Context, u, waitFor string) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(u), chromedp.WaitVisible(chromedp.CSS(waitFor))), "open %s", u)
}

// TestUIBrowser opens every page in a headless Chromium against PostgreSQL
// and keeps a screenshot of each.
func TestUIBrowser(t *testing.T) {
	sc := newScene(t)
	srv := httptest.NewServer(ui.Handler(sc.st, ui.Options{Refresh: time.Second}))
	defer srv.Close()
	ctx := browsertest.New(t)

	t.Run("overview shows the saturated gate and refreshes", func(t *testing.T) {
		open(t, ctx, srv.URL+"/", `tr[data-gate="stripe"]`)
		row := text(t, ctx, `tr[data-gate="stripe"]`)
		assert.Contains(t, row, "saturated")
		assert.Contains(t, row, "2 / 2", "the fullest key's bar against K")
		assert.True(t, eval[bool](t, ctx, `document.querySelector('tr[data-gate="stripe"]').classList.contains("saturated")`))
		assert.Contains(t, text(t, ctx, "#queues"), "mail")
		assert.Contains(t, text(t, ctx, "#rates"), "api")
		policies := text(t, ctx, "#policies")
		assert.Contains(t, policies, "billing")
		assert.Contains(t, policies, "2 / 4", "mail's active rows against its MaxActive")
		assert.Contains(t, text(t, ctx, "#warnings"), "stripe")
		first := text(t, ctx, "#taken")
		// Two refreshes later the stamp moved and the sparkline has history.
		require.NoError(t, chromedp.Do(ctx, chromedp.Sleep(2500*time.Millisecond)))
		assert.NotEqual(t, first, text(t, ctx, "#taken"), "the timestamp follows the refresh")
		samples := eval[string](t, ctx, `document.querySelector('tr[data-gate="stripe"] svg.spark title').textContent`)
		assert.NotContains(t, samples, "(1 samples)", samples)
		assert.Equal(t, 1, eval[int](t, ctx, `document.querySelectorAll('tr[data-gate="stripe"] svg.spark polyline.active').length`))
		browsertest.Screenshot(t, ctx, "overview")
	})

	t.Run("key page lists the holders and the waiters", func(t *testing.T) {
		open(t, ctx, srv.URL+"/key?key="+url.QueryEscape("stripe:acme"), "#verdict")
		holders := text(t, ctx, "#holders")
		for _, id := range sc.gateHolders {
			assert.Contains(t, holders, id)
		}
		assert.Contains(t, holders, "worker-a")
		assert.Contains(t, text(t, ctx, "#waiting"), "2 waiting row(s), 2 of them blocked")
		assert.Contains(t, text(t, ctx, "#waiters"), sc.gateWaiters[0], "next in line")
		assert.Equal(t, "concurrency", text(t, ctx, "#blocking"))
		browsertest.Screenshot(t, ctx, "key")
	})

	t.Run("a key id holding a script renders as text", func(t *testing.T) {
		open(t, ctx, srv.URL+"/key?key="+url.QueryEscape(scriptKey), "#key-id")
		assert.Equal(t, scriptKey, text(t, ctx, "#key-id"))
		open(t, ctx, srv.URL+"/instances?key="+url.QueryEscape(scriptKey), "#instances")
		assert.Contains(t, text(t, ctx, "#instances"), scriptKey)
		require.NoError(t, chromedp.Do(ctx, chromedp.Sleep(300*time.Millisecond))) // let an onerror fire, if any could
		assert.True(t, eval[bool](t, ctx, `window.__pwned === undefined`), "no script of the key ran")
		assert.Zero(t, eval[int](t, ctx, `document.querySelectorAll('main script, main img').length`))
	})

	t.Run("instances list newest first", func(t *testing.T) {
		open(t, ctx, srv.URL+"/instances", "#instances")
		first := eval[string](t, ctx, `document.querySelector('#instances tbody tr a').textContent`)
		assert.Equal(t, sc.awaiting, first, "the last inserted comes first")
		browsertest.Screenshot(t, ctx, "instances")
	})

	t.Run("a filtered list stops at the scan limit and links on", func(t *testing.T) {
		scan := httptest.NewServer(ui.Handler(sc.st, ui.Options{ScanLimit: 2}))
		defer scan.Close()
		open(t, ctx, scan.URL+"/instances?queue=nowhere", "#scan-stopped")
		assert.Contains(t, text(t, ctx, "#scan-stopped"), "Looked at the newest 2 instances")
		assert.Contains(t, text(t, ctx, "#instances"), "No instances match among those looked at")
		browsertest.Screenshot(t, ctx, "instances-scan-stopped")
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#scan-on")), chromedp.WaitVisible(chromedp.CSS("#scan-stopped"))))
		assert.Contains(t, text(t, ctx, "#scan-stopped"), "Looked at the next 2 older instances")
		assert.Contains(t, eval[string](t, ctx, `location.search`), "after=")
	})

	t.Run("instance page shows the await, the history and the inbox", func(t *testing.T) {
		open(t, ctx, srv.URL+"/instances/"+sc.awaiting, "#timeline")
		assert.Equal(t, "paid", text(t, ctx, "#await"))
		assert.Equal(t, 2, eval[int](t, ctx, `document.querySelectorAll('#timeline li').length`))
		assert.Contains(t, text(t, ctx, "#inbox"), "customer called")
		assert.Contains(t, text(t, ctx, "#state"), `"order": "A-1001"`)
		browsertest.Screenshot(t, ctx, "instance")
	})

	t.Run("pause and resume a queue from the overview", func(t *testing.T) {
		paused := func() []store.QueuePause {
			got, err := sc.st.PausedQueues(context.Background())
			require.NoError(t, err)
			return got
		}
		pause := `tr[data-queue="mail"] button.pause`
		open(t, ctx, srv.URL+"/", pause)
		assert.Contains(t, text(t, ctx, `tr[data-queue="mail"] td.state`), "active")
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(pause)), chromedp.WaitVisible(chromedp.CSS("#confirm-yes"))))
		assert.Contains(t, text(t, ctx, "#confirm"), `Pause queue "mail"?`)
		assert.Empty(t, paused(), "the confirmation changes nothing")
		browsertest.Screenshot(t, ctx, "confirm-pause")
		resume := `tr[data-queue="mail"] button.resume`
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#confirm-yes")), chromedp.WaitVisible(chromedp.CSS(resume))))
		assert.Contains(t, text(t, ctx, `tr[data-queue="mail"] td.state`), "paused")
		require.Len(t, paused(), 1)
		assert.Equal(t, "mail", paused()[0].Queue)
		browsertest.Screenshot(t, ctx, "overview-paused")

		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(resume)), chromedp.WaitVisible(chromedp.CSS("#confirm-yes"))))
		assert.Contains(t, text(t, ctx, "#confirm"), `Resume queue "mail"?`)
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#confirm-yes")), chromedp.WaitVisible(chromedp.CSS(pause))))
		assert.Empty(t, paused())

		ro := httptest.NewServer(ui.Handler(sc.st, ui.Options{ReadOnly: true}))
		defer ro.Close()
		open(t, ctx, ro.URL+"/", `tr[data-queue="mail"]`)
		assert.Zero(t, eval[int](t, ctx, `document.querySelectorAll('#queues form, #queues button').length`), "read-only: no pause button")
	})

	t.Run("cancel a parent with its children from the instance page", func(t *testing.T) {
		parent, kids := spawnTree(t, sc.st)
		open(t, ctx, srv.URL+"/instances/"+parent, "#cancel")
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#cancel")), chromedp.WaitVisible(chromedp.CSS("#confirm-children"))))
		assert.Contains(t, text(t, ctx, "#confirm"), "its 2 child(ren)")
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#confirm-children"))))
		browsertest.Screenshot(t, ctx, "confirm-cancel-tree")
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#confirm-yes")), chromedp.WaitVisible(chromedp.CSS("#done"))))
		assert.Contains(t, text(t, ctx, "#done"), "with every descendant")
		for _, id := range append([]string{parent}, kids...) {
			in, err := sc.st.Get(context.Background(), id)
			require.NoError(t, err)
			assert.Equal(t, store.StatusCanceled, in.Status, id)
		}
	})

	t.Run("cancel from the instance page", func(t *testing.T) {
		id := sc.acctWaiter
		open(t, ctx, srv.URL+"/instances/"+id, "#cancel")
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#cancel")), chromedp.WaitVisible(chromedp.CSS("#confirm-yes"))))
		assert.Contains(t, text(t, ctx, "#confirm"), "Cancel this instance?")
		in, err := sc.st.Get(context.Background(), id)
		require.NoError(t, err)
		require.NotEqual(t, store.StatusCanceled, in.Status, "the confirmation changes nothing")
		browsertest.Screenshot(t, ctx, "confirm-cancel")
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#confirm-yes")), chromedp.WaitVisible(chromedp.CSS("#done"))))
		assert.Equal(t, "canceled", strings.TrimSpace(text(t, ctx, "#status")))
		in, err = sc.st.Get(context.Background(), id)
		require.NoError(t, err)
		assert.Equal(t, store.StatusCanceled, in.Status)
	})
}
