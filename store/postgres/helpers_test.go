package postgres_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/godurable/godurable/internal/pgstoretest"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if os.Getenv(fleetChildEnv) != "" {
		runFleetChild()
	}
	pgtest.Main(m)
}

// env is a migrated store on a fresh schema.
type env struct {
	t      testing.TB
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string
	s      *postgres.Store
}

func newEnv(t testing.TB, opts ...func(*postgres.Options)) *env {
	t.Helper()
	pool := pgstoretest.Migrated.Pool(t)
	schema := pgtest.SchemaOf(pool)
	ctx := context.Background()
	o := postgres.Options{Schema: schema, History: true}
	for _, f := range opts {
		f(&o)
	}
	s, err := postgres.New(ctx, pool, o)
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, err)
	return &env{t: t, ctx: ctx, pool: pool, schema: schema, s: s}
}

func newInstance(key string) store.NewInstance {
	return store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "start",
		State: json.RawMessage(`{"n":1}`), Key: key}
}

func (e *env) insert(ins ...store.NewInstance) []string {
	e.t.Helper()
	res, err := e.s.Insert(e.ctx, ins)
	require.NoError(e.t, err)
	ids := make([]string, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}
	return ids
}

func (e *env) claim(worker string, limit int) []store.Claimed {
	e.t.Helper()
	res, err := e.s.Claim(e.ctx, store.ClaimRequest{Queue: "q", Worker: worker, Limit: limit, Lease: time.Minute})
	require.NoError(e.t, err)
	return res.Claimed
}

func (e *env) get(id string) store.Instance {
	e.t.Helper()
	in, err := e.s.Get(e.ctx, id)
	require.NoError(e.t, err)
	return in
}

func (e *env) complete(worker string, outs ...store.Outcome) []store.OutcomeResult {
	e.t.Helper()
	res, err := e.s.Complete(e.ctx, worker, outs, time.Time{})
	require.NoError(e.t, err)
	return res
}

func done(c store.Claimed) store.Outcome {
	return store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone, Result: json.RawMessage(`{"ok":true}`)}
}

func (e *env) scalar(sql string, args ...any) int64 {
	e.t.Helper()
	var n int64
	require.NoError(e.t, e.pool.QueryRow(e.ctx, sql, args...).Scan(&n))
	return n
}
