package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/godurable/godurable/ui"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
)

func TestZZSeed(t *testing.T) {
	if os.Getenv("ZZSEED") == "" {
		t.Skip()
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "DROP SCHEMA IF EXISTS uibench CASCADE")
	require.NoError(t, err)
	_, err = postgres.Migrate(ctx, pool, "uibench")
	require.NoError(t, err)
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: "uibench"})
	require.NoError(t, err)
	_, err = st.SyncLimits(ctx, []gate.Limit{{Name: "stripe", Limit: 2}})
	require.NoError(t, err)
	insert := func(queue string, n int, key func(i int) string) {
		for off := 0; off < n; off += 10_000 {
			batch := make([]store.NewInstance, 0, 10_000)
			for i := off; i < min(n, off+10_000); i++ {
				batch = append(batch, store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Version: 1, Queue: queue,
					Step: "start", State: json.RawMessage(`{"n":1}`), Key: key(i), RunAt: time.Now().Add(-time.Minute)})
			}
			_, err := st.Insert(ctx, batch)
			require.NoError(t, err)
		}
	}
	insert("hot", 50*22, func(i int) string { return fmt.Sprintf("stripe:%d", i%50) })
	for {
		res, err := st.Claim(ctx, store.ClaimRequest{Queue: "hot", Worker: "w", Limit: 1000, Lease: time.Hour})
		require.NoError(t, err)
		if len(res.Claimed) == 0 {
			break
		}
	}
	insert("q", 1_000_000, func(i int) string {
		if i%10 == 0 {
			return fmt.Sprintf("acct:%d", i)
		}
		return ""
	})
	_, err = pool.Exec(ctx, "VACUUM ANALYZE uibench.instances")
	require.NoError(t, err)
}

func TestZZTime(t *testing.T) {
	if os.Getenv("ZZTIME") == "" {
		t.Skip()
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	require.NoError(t, err)
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: "uibench"})
	require.NoError(t, err)
	one, err := st.List(ctx, store.ListFilter{Queue: "hot", Status: store.StatusExecuting, Limit: 1})
	require.NoError(t, err)
	h := ui.Handler(st, ui.Options{})
	for _, path := range []string{"/", "/key?key=stripe:7", "/key?key=acct:500", "/instances", "/instances?key=acct:500",
		"/instances?status=blocked", "/instances?status=failed", "/instances?queue=hot", "/instances/" + one[0].ID} {
		var ds []time.Duration
		for range 8 {
			start := time.Now()
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
			require.Equal(t, 200, w.Code, path)
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		t.Logf("%-32s median %v  min %v  max %v", path, ds[len(ds)/2], ds[0], ds[len(ds)-1])
	}
}
