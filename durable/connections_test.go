package durable_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
)

// TestEngineHoldsAtMostItsPoolAndOneConnection pins the README's
// connection formula: an engine working its default queue (10 executors)
// through a pool of MaxConns 4 never holds more than 4 + 1 connections
// (the pool's and the one that LISTENs), sampled from pg_stat_activity
// while it runs 300 instances.
func TestEngineHoldsAtMostItsPoolAndOneConnection(t *testing.T) {
	ctx := waitCtx(t)
	schema := pgtest.SchemaOf(pgtest.Pool(t)) // a fresh schema, dropped at cleanup
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	const maxConns = 4
	app := "conn_" + schema
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = postgres.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	e := newEngine(t, durable.Config{Store: st}, counterWorkflow())
	start(t, e)

	watch, err := pgxpool.New(ctx, pgtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(watch.Close)
	var most atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var n int64
			if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err == nil && n > most.Load() {
				most.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	ids := make([]string, 300)
	for i := range ids {
		ids[i], err = e.Insert(ctx, "count", counter{}, durable.InsertOptions{})
		require.NoError(t, err)
	}
	for _, id := range ids {
		in, err := e.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, store.StatusDone, in.Status)
	}
	close(stop)
	<-sampled
	require.Positive(t, most.Load())
	require.LessOrEqual(t, most.Load(), int64(maxConns+1), "connections of the engine's pool and its LISTEN")
}
