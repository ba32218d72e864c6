package enginepg

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// ordersTable creates a caller-owned table in the test's schema: the
// "caller's own write" that an instance inserted in the same transaction
// commits or rolls back with.
func ordersTable(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `CREATE TABLE orders (id text PRIMARY KEY)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS orders`) })
}

func ordersCount(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n))
	return n
}

func TestEngineInsertTxCommitsWithTheCallersWrite(t *testing.T) {
	st, pool := pgStore(t)
	ordersTable(t, pool)
	wf := countWorkflow()
	e := engine(t, durable.Config{Store: st}, wf)
	startEngine(t, e)
	ctx := waitCtx(t, 30*time.Second)

	var typedID, namedID string
	var manyIDs []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('A-1')`); err != nil {
			return err
		}
		var err error
		if typedID, err = wf.InsertTx(ctx, e, tx, num{}, durable.InsertOptions{Key: gate.Identity("order", "A-1")}); err != nil {
			return err
		}
		if namedID, err = e.InsertTx(ctx, tx, "count", num{N: 1}, durable.InsertOptions{}); err != nil {
			return err
		}
		manyIDs, err = wf.InsertManyTx(ctx, e, tx, []durable.TypedRequest[num]{{State: num{N: 2}}, {State: num{}}})
		return err
	})
	require.NoError(t, err)
	assert.Equal(t, 1, ordersCount(t, pool))
	for _, id := range append([]string{typedID, namedID}, manyIDs...) {
		n, err := durable.Result[int](ctx, e, id)
		require.NoError(t, err, "a committed instance runs")
		assert.Equal(t, 3, n)
	}
	// The typed handle's plain inserts work on PostgreSQL too.
	ids, err := wf.InsertMany(ctx, e, []durable.TypedRequest[num]{{State: num{N: 2}}})
	require.NoError(t, err)
	n, err := durable.Result[int](ctx, e, ids[0])
	require.NoError(t, err)
	assert.Equal(t, 3, n)
}

func TestEngineInsertTxRolledBackInsertsNothing(t *testing.T) {
	st, pool := pgStore(t)
	ordersTable(t, pool)
	wf := countWorkflow()
	e := engine(t, durable.Config{Store: st}, wf)
	startEngine(t, e)
	ctx := waitCtx(t, 30*time.Second)

	boom := errors.New("the caller's work fails after the insert")
	var id string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('B-1')`); err != nil {
			return err
		}
		var err error
		if id, err = wf.InsertTx(ctx, e, tx, num{}, durable.InsertOptions{}); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.NotEmpty(t, id)
	_, err = e.Get(ctx, id)
	require.ErrorIs(t, err, store.ErrNotFound, "the instance rolled back with the caller's write")
	assert.Equal(t, 0, ordersCount(t, pool))
	assert.Equal(t, 0, count(t, st))
	othersFinish(t, ctx, e)
}

func TestEngineInsertTxValidatesLikeInsert(t *testing.T) {
	st, pool := pgStore(t)
	ordersTable(t, pool)
	wf := countWorkflow()
	e := engine(t, durable.Config{Store: st, Strict: true, Limits: []gate.Limit{{Name: "order", Limit: 2}}}, wf)
	ctx := waitCtx(t, 30*time.Second)

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('C-1')`); err != nil {
			return err
		}
		_, err := e.InsertTx(ctx, tx, "no.such.workflow", num{}, durable.InsertOptions{})
		require.ErrorIs(t, err, durable.ErrUnknownWorkflow)

		// Strict: an identity key captured by the "order" limit is refused.
		_, err = wf.InsertTx(ctx, e, tx, num{}, durable.InsertOptions{Key: gate.Identity("order", "C-1")})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "order")

		_, err = e.InsertTx(ctx, tx, "count", make(chan int), durable.InsertOptions{})
		require.ErrorIs(t, err, durable.ErrEncode)

		_, err = e.InsertTx(ctx, tx, "count", num{}, durable.InsertOptions{ID: "not-a-uuid"})
		require.ErrorIs(t, err, durable.ErrInvalidInput)

		// The refusals sent nothing to the database: the caller's
		// transaction is intact and commits its own write.
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, 1, ordersCount(t, pool))
	assert.Equal(t, 0, count(t, st))

	_, err = e.InsertTx(ctx, nil, "count", num{}, durable.InsertOptions{})
	require.ErrorIs(t, err, durable.ErrInvalidInput, "a nil transaction")

	stranger := countWorkflow()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := stranger.InsertTx(ctx, e, tx, num{}, durable.InsertOptions{})
		return err
	})
	require.ErrorIs(t, err, durable.ErrUnknownWorkflow, "a handle not registered on the engine")
}

func TestStoreInsertTxRefusesRowsNoWorkerCanRun(t *testing.T) {
	st, pool := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	good := store.NewInstance{Workflow: "count", Version: 1, Step: "inc", State: []byte(`{}`)}
	bad := map[string]func(in *store.NewInstance){
		"version 0":     func(in *store.NewInstance) { in.Version = 0 },
		"empty step":    func(in *store.NewInstance) { in.Step = "" },
		"empty name":    func(in *store.NewInstance) { in.Workflow = "" },
		"negative vers": func(in *store.NewInstance) { in.Version = -1 },
	}
	for what, spoil := range bad {
		t.Run(what, func(t *testing.T) {
			in := good
			spoil(&in)
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := st.InsertTx(ctx, tx, []store.NewInstance{good, in})
				return err
			})
			require.ErrorIs(t, err, store.ErrInvalid)
			assert.Equal(t, 0, count(t, st), "nothing of the batch was inserted")
		})
	}
}
