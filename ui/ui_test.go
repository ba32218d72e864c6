package ui_test

import (
	"context"
	"encoding/json"
	"github.com/godurable/godurable/durable"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/ui"
)

// fixture is a memory store with one gate saturated by a key whose id is
// hostile markup, and an awaiting instance with a signal in its inbox.
type fixture struct {
	st       store.Store
	holder   string
	waiters  []string
	awaiting string
	key      string
}

const hostileKey = `stripe:<script>alert("x")</script>`

func newFixture(t *testing.T, st store.Store) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{st: st, key: hostileKey}
	_, err := st.SyncLimits(ctx, []gate.Limit{{Name: "stripe", Limit: 1, Shards: 1}})
	require.NoError(t, err)
	var nis []store.NewInstance
	for range 3 {
		nis = append(nis, store.NewInstance{ID: store.NewInstanceID(), Workflow: "charge", Version: 1, Queue: "default",
			Step: "start", State: json.RawMessage(`{"amount":42}`), Key: f.key, KeyIntent: gate.GateIntent})
	}
	nis = append(nis, store.NewInstance{ID: store.NewInstanceID(), Workflow: "approve", Version: 1, Queue: "mail",
		Step: "ask", State: json.RawMessage(`{"note":"<b>bold</b>"}`)})
	res, err := st.Insert(ctx, nis)
	require.NoError(t, err)
	now := time.Now()
	cl, err := st.Claim(ctx, store.ClaimRequest{Queue: "default", Worker: "worker-1", Limit: 10, Lease: time.Hour, Now: now})
	require.NoError(t, err)
	require.Len(t, cl.Claimed, 1, "K = 1: one holder")
	f.holder = cl.Claimed[0].ID
	for _, r := range res[:3] {
		if r.ID != f.holder {
			f.waiters = append(f.waiters, r.ID)
		}
	}
	f.awaiting = res[3].ID
	cl, err = st.Claim(ctx, store.ClaimRequest{Queue: "mail", Worker: "worker-1", Limit: 1, Lease: time.Hour, Now: now})
	require.NoError(t, err)
	require.Len(t, cl.Claimed, 1)
	c := cl.Claimed[0]
	_, err = st.Complete(ctx, "worker-1", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeAwait,
		Step: "decide", AwaitSignal: "approval", TimeoutAt: now.Add(time.Hour), State: c.State,
		History: &store.HistoryEntry{Step: "ask", Worker: "worker-1", StartedAt: now, FinishedAt: now.Add(30 * time.Millisecond), Outcome: "await"}}}, now)
	require.NoError(t, err)
	_, err = st.Signal(ctx, store.SignalRequest{InstanceID: f.awaiting, Name: "note", Payload: json.RawMessage(`{"from":"ops"}`)})
	require.NoError(t, err)
	return f
}

// client is a browser-like client: it keeps cookies and does not follow
// redirects, so a test sees each answer.
func client(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, c *http.Client, u string, form url.Values, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t *testing.T, body string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(body)
	require.NotNil(t, m, "the page has a CSRF field")
	return m[1]
}

func TestUIPagesRenderAndEscape(t *testing.T) {
	f := newFixture(t, memory.New(memory.Options{}))
	srv := httptest.NewServer(ui.Handler(f.st, ui.Options{}))
	defer srv.Close()
	c := client(t)

	code, body := get(t, c, srv.URL+"/")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `data-gate="stripe"`)
	assert.Contains(t, body, "saturated")

	code, body = get(t, c, srv.URL+"/key?key="+url.QueryEscape(f.key))
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, body, "<script>alert", "a key id is text, never markup")
	assert.Contains(t, body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;")
	assert.Contains(t, body, f.holder)
	assert.Contains(t, body, f.waiters[0])

	code, body = get(t, c, srv.URL+"/instances?key="+url.QueryEscape(f.key))
	require.Equal(t, http.StatusOK, code)
	assert.NotContains(t, body, "<script>alert")
	for _, id := range append([]string{f.holder}, f.waiters...) {
		assert.Contains(t, body, id)
	}

	code, body = get(t, c, srv.URL+"/instances/"+f.awaiting)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "approval", "the awaited signal")
	assert.Contains(t, body, "&lt;b&gt;bold&lt;/b&gt;", "state is escaped")
	assert.Contains(t, body, `&#34;from&#34;: &#34;ops&#34;`, "the inbox payload, indented")

	code, _ = get(t, c, srv.URL+"/instances/"+uuid.NewString())
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = get(t, c, srv.URL+"/instances?status=bogus")
	assert.Equal(t, http.StatusBadRequest, code)
	code, _ = get(t, c, srv.URL+"/live")
	assert.Equal(t, http.StatusOK, code)
	code, js := get(t, c, srv.URL+"/static/app.js")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, js, "sparkline")
	code, _ = get(t, c, srv.URL+"/static/")
	assert.Equal(t, http.StatusNotFound, code, "no directory listing")
}

// TestUIInstancesScanStopsAndContinues filters by a rare key with a small
// ScanLimit: a page stops after ScanLimit instances, says so, and its link
// continues the scan, so that following the links shows every match once,
// newest first, even through pages with no match.
func TestUIInstancesScanStopsAndContinues(t *testing.T) {
	st := memory.New(memory.Options{})
	const key = `acct:<b>&"1`
	var want []string
	for i := range 13 {
		ni := store.NewInstance{ID: store.NewInstanceID(), Workflow: "w", Version: 1,
			Queue: "default", Step: "s", State: json.RawMessage(`{}`)}
		if i == 0 || i == 1 || i == 2 || i == 11 {
			ni.Key = key
		}
		res, err := st.Insert(context.Background(), []store.NewInstance{ni})
		require.NoError(t, err)
		if ni.Key != "" {
			want = append([]string{res[0].ID}, want...)
		}
	}
	srv := httptest.NewServer(ui.Handler(st, ui.Options{PageSize: 2, ScanLimit: 4}))
	defer srv.Close()
	c := client(t)
	link := regexp.MustCompile(`id="(?:next|scan-on)" href="([^"]*)"`)
	u := srv.URL + "/instances?key=" + url.QueryEscape(key)
	var seen []string
	stopped, empty := 0, 0
	for range 10 {
		code, body := get(t, c, u)
		require.Equal(t, http.StatusOK, code)
		assert.NotContains(t, body, "<b>", "the key is escaped, in the form and the links")
		ids := regexp.MustCompile(`href="/instances/([0-9a-f-]+)"`).FindAllStringSubmatch(body, -1)
		for _, m := range ids {
			seen = append(seen, m[1])
		}
		if strings.Contains(body, `id="scan-stopped"`) {
			stopped++
			assert.Regexp(t, `Looked at the (newest|next) 4 (older )?instances`, body)
			if len(ids) == 0 {
				empty++
			}
		}
		m := link.FindStringSubmatch(body)
		if m == nil {
			break
		}
		u = srv.URL + html.UnescapeString(m[1])
	}
	assert.Equal(t, want, seen, "every match once, newest first")
	assert.Positive(t, stopped, "some page stopped at the scan limit")
	assert.Positive(t, empty, "a page with no match still links on")
}

func TestUIInstancesPageByKeyset(t *testing.T) {
	st := memory.New(memory.Options{})
	var ids []string
	for range 7 {
		res, err := st.Insert(context.Background(), []store.NewInstance{{ID: store.NewInstanceID(), Workflow: "w", Version: 1,
			Queue: "default", Step: "s", State: json.RawMessage(`{}`)}})
		require.NoError(t, err)
		ids = append(ids, res[0].ID)
	}
	srv := httptest.NewServer(ui.Handler(st, ui.Options{PageSize: 3}))
	defer srv.Close()
	c := client(t)
	next := regexp.MustCompile(`id="next" href="[^"]*after=([0-9a-f-]+)"`)
	var seen []string
	u := srv.URL + "/instances"
	for range 5 {
		_, body := get(t, c, u)
		for i := len(ids) - 1; i >= 0; i-- {
			if strings.Contains(body, `/instances/`+ids[i]+`"`) {
				seen = append(seen, ids[i])
			}
		}
		m := next.FindStringSubmatch(body)
		if m == nil {
			break
		}
		u = srv.URL + "/instances?after=" + m[1]
	}
	want := append([]string(nil), ids...)
	for i, j := 0, len(want)-1; i < j; i, j = i+1, j-1 {
		want[i], want[j] = want[j], want[i]
	}
	assert.Equal(t, want, seen, "three pages, newest first, every instance once")
}

func TestUICancelNeedsCSRFAndConfirmation(t *testing.T) {
	f := newFixture(t, memory.New(memory.Options{}))
	srv := httptest.NewServer(ui.Handler(f.st, ui.Options{}))
	defer srv.Close()
	c := client(t)
	status := func() store.Status {
		in, err := f.st.Get(context.Background(), f.waiters[0])
		require.NoError(t, err)
		return in.Status
	}
	cancelURL := srv.URL + "/instances/" + f.waiters[0] + "/cancel"

	// No token at all, and a made-up one: refused, nothing changes.
	resp, _ := post(t, c, cancelURL, url.Values{"confirm": {"yes"}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	resp, _ = post(t, c, cancelURL, url.Values{"confirm": {"yes"}, "csrf": {"forged"}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.NotEqual(t, store.StatusCanceled, status())

	_, page := get(t, c, srv.URL+"/instances/"+f.waiters[0])
	tok := csrfOf(t, page)

	// Another browser (no cookie) with a stolen token: refused.
	resp, _ = post(t, client(t), cancelURL, url.Values{"confirm": {"yes"}, "csrf": {tok}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	// The right browser, but the request comes from another site: refused.
	resp, _ = post(t, c, cancelURL, url.Values{"confirm": {"yes"}, "csrf": {tok}}, "Origin", "https://evil.example")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	resp, _ = post(t, c, cancelURL, url.Values{"confirm": {"yes"}, "csrf": {tok}}, "Sec-Fetch-Site", "cross-site")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	resp, _ = post(t, c, cancelURL, url.Values{"confirm": {"yes"}, "csrf": {tok}}, "Sec-Fetch-Site", "same-site")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a sibling subdomain is another site to this page")
	assert.NotEqual(t, store.StatusCanceled, status())

	// Without confirm: a confirmation page, nothing changes. (Behind a proxy
	// that rewrites Host, a browser's same-origin post carries another
	// Origin: Sec-Fetch-Site is believed.)
	resp, body := post(t, c, cancelURL, url.Values{"csrf": {tok}}, "Sec-Fetch-Site", "same-origin", "Origin", "https://ops.example")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `id="confirm-yes"`)
	assert.NotEqual(t, store.StatusCanceled, status())

	resp, _ = post(t, c, cancelURL, url.Values{"csrf": {csrfOf(t, body)}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "/instances/"+f.waiters[0]+"?did=canceled", resp.Header.Get("Location"))
	assert.Equal(t, store.StatusCanceled, status())
}

func TestUISignalAction(t *testing.T) {
	f := newFixture(t, memory.New(memory.Options{}))
	srv := httptest.NewServer(ui.Handler(f.st, ui.Options{}))
	defer srv.Close()
	c := client(t)
	_, page := get(t, c, srv.URL+"/instances/"+f.awaiting)
	tok := csrfOf(t, page)
	u := srv.URL + "/instances/" + f.awaiting + "/signal"
	resp, _ := post(t, c, u, url.Values{"csrf": {tok}, "name": {"approval"}, "payload": {"{not json"}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	resp, body := post(t, c, u, url.Values{"csrf": {tok}, "name": {"approval"}, "payload": {`{"ok":true}`}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `name="payload" value="{&#34;ok&#34;:true}"`)
	resp, _ = post(t, c, u, url.Values{"csrf": {tok}, "name": {"approval"}, "payload": {`{"ok":true}`}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Location"), "did=signal-woke")
	in, err := f.st.Get(context.Background(), f.awaiting)
	require.NoError(t, err)
	assert.Equal(t, store.StatusReady, in.Status)
}

func TestUIReadOnly(t *testing.T) {
	f := newFixture(t, memory.New(memory.Options{}))
	srv := httptest.NewServer(ui.Handler(f.st, ui.Options{ReadOnly: true}))
	defer srv.Close()
	c := client(t)
	_, body := get(t, c, srv.URL+"/instances/"+f.waiters[0])
	assert.Contains(t, body, `id="read-only"`)
	assert.NotContains(t, body, "<form method=\"post\"")
	assert.NotContains(t, body, `name="csrf"`)
	resp, _ := post(t, c, srv.URL+"/instances/"+f.waiters[0]+"/cancel", url.Values{"confirm": {"yes"}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	in, err := f.st.Get(context.Background(), f.waiters[0])
	require.NoError(t, err)
	assert.NotEqual(t, store.StatusCanceled, in.Status)
}

func TestUIToken(t *testing.T) {
	f := newFixture(t, memory.New(memory.Options{}))
	srv := httptest.NewServer(ui.Handler(f.st, ui.Options{Token: "s3cret", Prefix: "/ops"}))
	defer srv.Close()
	c := client(t)

	code, _ := get(t, c, srv.URL+"/ops/")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = get(t, c, srv.URL+"/ops/?token=wrong")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = get(t, c, srv.URL+"/elsewhere")
	assert.Equal(t, http.StatusNotFound, code, "outside the prefix")

	// The header works.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/ops/instances", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	// ?token= sets the cookie and drops itself from the address.
	resp, err = c.Get(srv.URL + "/ops/key?key=a:1&token=s3cret")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "/ops/key?key=a%3A1", resp.Header.Get("Location"))
	code, body := get(t, c, srv.URL+"/ops/")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `href="/ops/instances"`, "links carry the prefix")

	// A POST needs the token as well as the CSRF field.
	_, page := get(t, c, srv.URL+"/ops/instances/"+f.waiters[0])
	tok := csrfOf(t, page)
	jar := c.Jar
	stranger := client(t)
	u, _ := url.Parse(srv.URL + "/ops/")
	for _, ck := range jar.Cookies(u) {
		if ck.Name == "durable_ui_csrf" {
			stranger.Jar.SetCookies(u, []*http.Cookie{ck})
		}
	}
	r2, _ := post(t, stranger, srv.URL+"/ops/instances/"+f.waiters[0]+"/cancel", url.Values{"csrf": {tok}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusUnauthorized, r2.StatusCode)
}

func TestUILoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "localhost:80": true, "[::1]:9": true, "127.0.0.1": true,
		"0.0.0.0:8080": false, ":8080": false, "10.1.2.3:80": false, "example.com:80": false, "[::]:80": false,
	} {
		assert.Equal(t, want, ui.IsLoopback(addr), addr)
	}
	h := ui.LoopbackHostsOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	for host, want := range map[string]int{"127.0.0.1:1234": http.StatusTeapot, "localhost:1": http.StatusTeapot,
		"evil.example:1234": http.StatusMisdirectedRequest} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		assert.Equal(t, want, w.Code, host)
	}
}

func TestUISecurityHeaders(t *testing.T) {
	srv := httptest.NewServer(ui.Handler(memory.New(memory.Options{}), ui.Options{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'")
	assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	assert.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
}

func TestUIOverviewWithEngineShowsTheLastReconcile(t *testing.T) {
	st := memory.New(memory.Options{})
	e, err := durable.New(durable.Config{Store: st, WorkerID: "w", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	srv := httptest.NewServer(ui.Handler(st, ui.Options{Engine: e}))
	defer srv.Close()
	_, body := get(t, client(t), srv.URL+"/")
	assert.Contains(t, body, "This engine has not swept yet.")

	_, err = e.Reconcile(context.Background())
	require.NoError(t, err)
	// A new handler: the first one serves its snapshot for a refresh interval.
	srv2 := httptest.NewServer(ui.Handler(st, ui.Options{Engine: e}))
	defer srv2.Close()
	_, body = get(t, client(t), srv2.URL+"/")
	assert.Contains(t, body, "Last sweep")
	assert.Contains(t, body, "drift <strong")
}

func TestUIRetryAndBadInput(t *testing.T) {
	st := memory.New(memory.Options{})
	ctx := context.Background()
	res, err := st.Insert(ctx, []store.NewInstance{{ID: store.NewInstanceID(), Workflow: "w", Version: 1, Queue: "default",
		Step: "s", State: json.RawMessage(`{}`)}})
	require.NoError(t, err)
	id := res[0].ID
	cl, err := st.Claim(ctx, store.ClaimRequest{Queue: "default", Worker: "w", Limit: 1, Lease: time.Hour})
	require.NoError(t, err)
	_, err = st.Complete(ctx, "w", []store.Outcome{{ID: id, Fence: cl.Claimed[0].Fence, Kind: store.OutcomeFailed, Error: "card declined"}}, time.Time{})
	require.NoError(t, err)

	srv := httptest.NewServer(ui.Handler(st, ui.Options{}))
	defer srv.Close()
	c := client(t)
	_, page := get(t, c, srv.URL+"/instances/"+id)
	assert.Contains(t, page, "card declined")
	assert.Contains(t, page, `id="retry"`)
	assert.NotContains(t, page, `id="cancel"`, "a failed instance cannot be canceled")
	tok := csrfOf(t, page)

	resp, _ := post(t, c, srv.URL+"/instances/"+id+"/cancel", url.Values{"csrf": {tok}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "cancel of a terminal instance")
	resp, _ = post(t, c, srv.URL+"/instances/"+id+"/explode", url.Values{"csrf": {tok}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, _ = post(t, c, srv.URL+"/instances/"+id+"/retry", url.Values{"csrf": {tok}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	in, err := st.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, store.StatusReady, in.Status)
	resp, _ = post(t, c, srv.URL+"/instances/"+id+"/retry", url.Values{"csrf": {tok}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "retry of a ready instance")

	code, body := get(t, c, srv.URL+"/key?key="+url.QueryEscape("no-colon"))
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "not a concurrency key")
	code, _ = get(t, c, srv.URL+"/key")
	assert.Equal(t, http.StatusOK, code, "the empty form")
}

// A queue's pause and resume from the overview: CSRF-checked, confirmed
// first, refused and hidden in read-only mode, shown at once.
func TestUIPauseQueue(t *testing.T) {
	f := newFixture(t, memory.New(memory.Options{}))
	srv := httptest.NewServer(ui.Handler(f.st, ui.Options{}))
	defer srv.Close()
	c := client(t)
	ctx := context.Background()
	paused := func() []store.QueuePause {
		got, err := f.st.PausedQueues(ctx)
		require.NoError(t, err)
		return got
	}
	_, page := get(t, c, srv.URL+"/")
	assert.Contains(t, page, `action="/queues/pause"`)
	tok := csrfOf(t, page)

	resp, _ := post(t, c, srv.URL+"/queues/pause", url.Values{"queue": {"mail"}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "no CSRF token")
	resp, _ = post(t, c, srv.URL+"/queues/pause", url.Values{"queue": {"mail"}, "confirm": {"yes"}, "csrf": {tok}}, "Sec-Fetch-Site", "cross-site")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "another site")
	resp, body := post(t, c, srv.URL+"/queues/pause", url.Values{"queue": {"mail"}, "csrf": {tok}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `id="confirm-yes"`)
	assert.Contains(t, body, "Pause queue &#34;mail&#34;?")
	assert.Empty(t, paused(), "the confirmation changes nothing")

	resp, _ = post(t, c, srv.URL+"/queues/pause", url.Values{"queue": {"mail"}, "csrf": {csrfOf(t, body)}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "/", resp.Header.Get("Location"))
	require.Len(t, paused(), 1)
	_, page = get(t, c, srv.URL+"/")
	assert.Contains(t, page, `<tr data-queue="mail" class="paused">`, "the overview shows it at once")
	assert.Contains(t, page, `action="/queues/resume"`)

	resp, _ = post(t, c, srv.URL+"/queues/resume", url.Values{"queue": {"mail"}, "csrf": {tok}, "confirm": {"yes"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Empty(t, paused())
	resp, _ = post(t, c, srv.URL+"/queues/stop", url.Values{"queue": {"mail"}, "csrf": {tok}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)

	ro := httptest.NewServer(ui.Handler(f.st, ui.Options{ReadOnly: true}))
	defer ro.Close()
	_, page = get(t, c, ro.URL+"/")
	assert.NotContains(t, page, "/queues/pause")
	assert.NotContains(t, page, `name="csrf"`)
	resp, _ = post(t, c, ro.URL+"/queues/pause", url.Values{"queue": {"mail"}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Empty(t, paused())
}

// spawnTree inserts a parent on queue "tree" that spawned two children,
// and returns the parent's and the children's ids.
func spawnTree(t *testing.T, st store.Store) (string, []string) {
	t.Helper()
	ctx := context.Background()
	ni := func() store.NewInstance {
		return store.NewInstance{ID: store.NewInstanceID(), Workflow: "order", Version: 1, Queue: "tree", Step: "split", State: json.RawMessage(`{}`)}
	}
	parent := ni()
	_, err := st.Insert(ctx, []store.NewInstance{parent})
	require.NoError(t, err)
	cl, err := st.Claim(ctx, store.ClaimRequest{Queue: "tree", Worker: "worker-1", Limit: 1, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, cl.Claimed, 1)
	a, b := ni(), ni()
	_, err = st.Complete(ctx, "worker-1", []store.Outcome{{ID: parent.ID, Fence: cl.Claimed[0].Fence, Kind: store.OutcomeSpawn,
		Step: "joined", State: json.RawMessage(`{}`), Children: []store.NewInstance{a, b}}}, time.Time{})
	require.NoError(t, err)
	return parent.ID, []string{a.ID, b.ID}
}

// The cancel of a parent offers its descendants; checked, they are
// canceled with it.
func TestUICancelTree(t *testing.T) {
	st := memory.New(memory.Options{})
	parent, kids := spawnTree(t, st)
	srv := httptest.NewServer(ui.Handler(st, ui.Options{}))
	defer srv.Close()
	c := client(t)
	_, page := get(t, c, srv.URL+"/instances/"+parent)
	u := srv.URL + "/instances/" + parent + "/cancel"
	resp, body := post(t, c, u, url.Values{"csrf": {csrfOf(t, page)}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `id="confirm-children"`)
	assert.Contains(t, body, "its 2 child(ren)")
	_, leaf := get(t, c, srv.URL+"/instances/"+kids[0])
	_, body2 := post(t, c, srv.URL+"/instances/"+kids[0]+"/cancel", url.Values{"csrf": {csrfOf(t, leaf)}})
	assert.NotContains(t, body2, `id="confirm-children"`, "no descendants: nothing to offer")

	resp, _ = post(t, c, u, url.Values{"csrf": {csrfOf(t, body)}, "confirm": {"yes"}, "children": {"yes"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "/instances/"+parent+"?did=canceled-tree", resp.Header.Get("Location"))
	for _, id := range append([]string{parent}, kids...) {
		in, err := st.Get(context.Background(), id)
		require.NoError(t, err)
		assert.Equal(t, store.StatusCanceled, in.Status, id)
	}
}

// snapshotStore is a store whose Health reports an oldest snapshot.
type snapshotStore struct {
	store.Store
	snap store.SnapshotHealth
}

func (s snapshotStore) Health(ctx context.Context, now time.Time) (store.Health, error) {
	h, err := s.Store.Health(ctx, now)
	h.OldestSnapshot = s.snap
	return h, err
}

// TestUIOverviewShowsAnOldSnapshot: the overview names the oldest
// snapshot kept in the database once it is old (store.SnapshotHealth.Old),
// and nothing otherwise.
func TestUIOverviewShowsAnOldSnapshot(t *testing.T) {
	for _, c := range []struct {
		snap store.SnapshotHealth
		want string
	}{
		{store.SnapshotHealth{Holder: "pid 42 (report, idle in transaction)", Open: 3 * time.Minute, Transactions: 1234},
			"The oldest snapshot in the database, held by pid 42 (report, idle in transaction), has been open 3m0s (1234 transactions since)"},
		{store.SnapshotHealth{Holder: "pid 7 (engine, active)", Open: 2 * time.Millisecond, Transactions: 1}, ""},
	} {
		srv := httptest.NewServer(ui.Handler(snapshotStore{Store: memory.New(memory.Options{}), snap: c.snap}, ui.Options{}))
		_, body := get(t, client(t), srv.URL+"/")
		srv.Close()
		if c.want == "" {
			assert.NotContains(t, body, `id="snapshot"`, "a young snapshot is not shown")
			continue
		}
		assert.Contains(t, body, `id="snapshot"`)
		assert.Contains(t, body, c.want)
	}
}
