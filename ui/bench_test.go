package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/pgstoretest"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/ui"
)

// BenchmarkPages measures each page on a schema holding UI_BENCH_READY
// ready rows (default 1,000,000; a tenth of them keyed, each key its own),
// 50 saturated gate keys with 20 blocked rows each and 500 executing rows:
//
//	go test ./ui -run '^$' -bench BenchmarkPages -benchtime 20x
//
// The overview must stay under 100 ms: it is one store Health call
// (bounded as store.Health documents) and the stored queue policies. The
// pages filtered by key or queue look at ui.DefaultScanLimit instances at
// most; list-unbounded-* are the same filters without that bound.
func BenchmarkPages(b *testing.B) {
	ready := 1_000_000
	if v := os.Getenv("UI_BENCH_READY"); v != "" {
		var err error
		ready, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	ctx := context.Background()
	pool := pgstoretest.Migrated.Pool(b)
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: pgtest.SchemaOf(pool), History: true})
	require.NoError(b, err)
	b.Cleanup(func() { _ = st.Close() })
	_, err = st.SyncLimits(ctx, []gate.Limit{{Name: "stripe", Limit: 2}})
	require.NoError(b, err)

	insert := func(queue string, n int, key func(i int) string) {
		for off := 0; off < n; off += 10_000 {
			batch := make([]store.NewInstance, 0, 10_000)
			for i := off; i < min(n, off+10_000); i++ {
				batch = append(batch, store.NewInstance{ID: store.NewInstanceID(), Workflow: "wf", Version: 1, Queue: queue,
					Step: "start", State: json.RawMessage(`{"n":1}`), Key: key(i), RunAt: time.Now().Add(-time.Minute)})
			}
			_, err := st.Insert(ctx, batch)
			require.NoError(b, err)
		}
	}
	insert("hot", 50*22, func(i int) string { return fmt.Sprintf("stripe:%d", i%50) })
	for {
		res, err := st.Claim(ctx, store.ClaimRequest{Queue: "hot", Worker: "w", Limit: 1000, Lease: time.Hour})
		require.NoError(b, err)
		if len(res.Claimed) == 0 {
			break
		}
	}
	insert("busy", 500, func(int) string { return "" })
	_, err = st.Claim(ctx, store.ClaimRequest{Queue: "busy", Worker: "w", Limit: 500, Lease: time.Hour})
	require.NoError(b, err)
	insert("q", ready, func(i int) string {
		if i%10 == 0 {
			return fmt.Sprintf("acct:%d", i)
		}
		return ""
	})
	_, err = pool.Exec(ctx, "VACUUM ANALYZE instances")
	require.NoError(b, err)

	h := ui.Handler(st, ui.Options{})
	one, err := st.List(ctx, store.ListFilter{Queue: "hot", Status: store.StatusExecuting, Limit: 1})
	require.NoError(b, err)
	require.Len(b, one, 1)
	// Where the by-key page stopped (the key's only row is among the oldest
	// of queue q), to bench the page its link leads to.
	stopped, err := st.ListPage(ctx, store.ListFilter{Key: "acct:500", Newest: true, Limit: 51, ScanLimit: ui.DefaultScanLimit})
	require.NoError(b, err)
	require.True(b, stopped.ScanStopped)
	recent := fmt.Sprintf("acct:%d", ready/10*10-10) // among the newest rows
	for name, path := range map[string]string{
		"overview":                   "/",
		"key":                        "/key?key=" + url.QueryEscape("stripe:7"),
		"instances":                  "/instances",
		"instances-by-key":           "/instances?key=" + url.QueryEscape("acct:500"),
		"instances-by-key-recent":    "/instances?key=" + url.QueryEscape(recent),
		"instances-by-key-scan-on":   "/instances?key=" + url.QueryEscape("acct:500") + "&after=" + stopped.Next,
		"instances-by-key-status":    "/instances?status=ready&key=" + url.QueryEscape("acct:500"),
		"instances-by-status":        "/instances?status=blocked",
		"instances-by-queue":         "/instances?queue=busy",
		"instances-by-queue-hot":     "/instances?queue=hot",
		"instances-by-queue-missing": "/instances?queue=nowhere",
		"instances-by-workflow":      "/instances?workflow=wf",
		"instance":                   "/instances/" + one[0].ID,
		"instances-second-page":      "/instances?after=" + one[0].ID,
		"instances-failed-empty":     "/instances?status=failed",
	} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
				if w.Code != http.StatusOK {
					b.Fatalf("%s: %d %s", path, w.Code, w.Body.String())
				}
			}
		})
	}
	// The store's list as the key and queue pages read it before
	// ListFilter.ScanLimit: the primary key backwards until a page of
	// matches or the end of the table, which for a rare key or queue is the
	// whole table.
	for name, f := range map[string]store.ListFilter{
		"list-unbounded-by-key":   {Key: "acct:500", Newest: true, Limit: 51},
		"list-unbounded-by-queue": {Queue: "busy", Newest: true, Limit: 51},
	} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				_, err := st.List(ctx, f)
				require.NoError(b, err)
			}
		})
	}
}
