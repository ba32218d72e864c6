package ui_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/internal/keystest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/ui"
)

// TestUISeveralKeys: with a gate stripe of K = 1, holder (account:1,
// stripe:t) executes and blocked (account:2, stripe:t) waits for
// stripe:t. The instance page lists every key of a row, the shards an
// executing one holds and the key a blocked one waits for; the key page
// lists holders and waiters with their other keys, and for a key whose
// rows wait for another key, how many and on which; the instance list
// shows every key of a row.
func TestUISeveralKeys(t *testing.T) {
	f := keystest.New(t)
	st, holder, blocked := f.Store, f.Holder, f.Blocked

	srv := httptest.NewServer(ui.Handler(st, ui.Options{}))
	defer srv.Close()
	c := client(t)
	// html/template escapes the ':' of a key in a URL as %3a.
	link := func(key string) string {
		return `<a href="/key?key=` + strings.ReplaceAll(key, ":", "%3a") + `">` + key + `</a>`
	}

	code, body := get(t, c, srv.URL+"/instances/"+blocked)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `id="keys"`)
	assert.Contains(t, body, "<li>"+link("account:2")+" (identity)</li>")
	assert.Contains(t, body, "<li>"+link("stripe:t")+` (gate) <span class="badge hot">blocked on</span></li>`)
	assert.Regexp(t, `id="blocked-on">`+regexp.QuoteMeta(link("stripe:t")), body)

	code, body = get(t, c, srv.URL+"/instances/"+holder)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "<li>"+link("stripe:t")+` (gate) <span class="dim">shard 0</span></li>`)
	assert.NotContains(t, body, `id="blocked-on"`)
	assert.NotContains(t, body, "<th>Key</th>", "a row of several keys lists them as Keys")

	code, body = get(t, c, srv.URL+"/key?key=stripe:t")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "<th>Also holds</th>")
	assert.Contains(t, body, `<td class="also">`+link("account:1")+`</td>`, "the holder's other key")
	assert.Contains(t, body, "<th>Also needs</th>")
	assert.Contains(t, body, `<td class="also">`+link("account:2")+` <span class="badge hot">blocked on stripe:t</span></td>`)
	assert.NotContains(t, body, `id="elsewhere"`)

	code, body = get(t, c, srv.URL+"/key?key=account:2")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `<p id="elsewhere"><strong>1</strong> more row(s) that also need this key wait for another of their keys: blocked on `+
		link("stripe:t")+" (1).")
	assert.Contains(t, body, "another of their keys (blocked on stripe:t (1))", "the verdict says so too")

	code, body = get(t, c, srv.URL+"/instances")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, link("account:2")+", "+link("stripe:t")+` <span class="dim blocked-on">blocked on stripe:t</span>`)
	assert.Contains(t, body, link("account:1")+", "+link("stripe:t")+"</td>")
}

// TestUITimelineKeys: the instance page's step history names every key
// each step ran under, and none for a step that ran under none.
func TestUITimelineKeys(t *testing.T) {
	ctx := context.Background()
	st := memory.New(memory.Options{})
	now := time.Now()
	res, err := st.Insert(ctx, []store.NewInstance{{ID: store.NewInstanceID(), Workflow: "charge", Version: 1, Queue: "default",
		Step: "load", State: json.RawMessage(`{}`)}})
	require.NoError(t, err)
	id := res[0].ID
	for _, h := range []store.HistoryEntry{{Step: "load", Outcome: "next"}, {Step: "charge", Key: "account:1", Also: []string{"region:eu"}, Outcome: "next"}} {
		cl, err := st.Claim(ctx, store.ClaimRequest{Queue: "default", Worker: "worker-1", Limit: 1, Lease: time.Hour, Now: now})
		require.NoError(t, err)
		require.Len(t, cl.Claimed, 1)
		h.Worker, h.StartedAt, h.FinishedAt = "worker-1", now, now.Add(time.Millisecond)
		_, err = st.Complete(ctx, "worker-1", []store.Outcome{{ID: id, Fence: cl.Claimed[0].Fence, Kind: store.OutcomeReady,
			Step: "charge", State: json.RawMessage(`{}`), History: &h}}, now)
		require.NoError(t, err)
	}

	srv := httptest.NewServer(ui.Handler(st, ui.Options{}))
	defer srv.Close()
	code, body := get(t, client(t), srv.URL+"/instances/"+id)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `<strong>charge</strong> #0 → next <span class="keys dim">under <a href="/key?key=account%3a1">account:1</a>, <a href="/key?key=region%3aeu">region:eu</a></span>`)
	assert.Contains(t, body, "<strong>load</strong> #0 → next</span>", "a step without a key names none")
}

// TestUIOneKeyPagesUnchanged: rows of one key get no column or line of
// other keys.
func TestUIOneKeyPagesUnchanged(t *testing.T) {
	f := newFixture(t, memory.New(memory.Options{}))
	srv := httptest.NewServer(ui.Handler(f.st, ui.Options{}))
	defer srv.Close()
	c := client(t)
	code, body := get(t, c, srv.URL+"/key?key="+url.QueryEscape(f.key))
	require.Equal(t, http.StatusOK, code)
	for _, s := range []string{"Also holds", "Also needs", `id="elsewhere"`, "blocked on"} {
		assert.NotContains(t, body, s)
	}
	code, body = get(t, c, srv.URL+"/instances/"+f.waiters[0])
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "<th>Key</th>")
	assert.NotContains(t, body, `id="keys"`)
	assert.NotContains(t, body, `id="blocked-on"`)
}
