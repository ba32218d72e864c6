package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// batchTx is a READ COMMITTED transaction driven by batches: its BEGIN
// travels with the first batch and its COMMIT with the last, so that a
// transaction of n dependent steps costs n round trips (pgx.Tx would add
// one for the COMMIT).
type batchTx struct {
	conn  *pgxpool.Conn
	begun bool
}

const (
	sqlBegin = `BEGIN ISOLATION LEVEL READ COMMITTED`
	// sqlNoSeqScan keeps the planner on the indexes for the rest of the
	// transaction. The hot statements join a batch (unnest of arrays) to
	// instances by id; with the statistics of a table whose statuses churn by
	// the thousand per second, the planner can judge a sequential scan of the
	// whole table cheaper than one index probe per batch row, which is then
	// thousands of times slower. Every statement of these transactions has
	// an index path (TestHotPathPlansUseIndexes checks it, generic plans
	// included).
	sqlNoSeqScan = `SELECT set_config('enable_seqscan', 'off', true)`
	// sqlGenericPlans makes the rest of the transaction run the generic
	// plans of its prepared statements. The hand-off's reads (CTEs with
	// correlated subqueries) kept being planned anew at every call under
	// plan_cache_mode = auto (array parameters make the generic plan look no
	// cheaper), and planning them cost more CPU than running them: a hot
	// gate ran at 1,311 steps/s with 1,146 µs of PostgreSQL CPU per step
	// under auto, and at 2,674 with 424 µs on generic plans (make bench,
	// scenario 3). Only transactions that hand slots off take it: taken by
	// every hot transaction, it cost scenario 7 (await + signal) about a
	// tenth, for no gain on plain work.
	sqlGenericPlans = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`
	// sqlLockTimeout bounds the rest of the transaction's lock waits ($1,
	// e.g. '50ms'; see optimisticLockWait).
	sqlLockTimeout = `SELECT set_config('lock_timeout', $1, true)`
	sqlCommit      = `COMMIT`
)

func (s *Store) beginBatch(ctx context.Context) (*batchTx, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &batchTx{conn: c}, nil
}

// send runs b in the transaction, beginning it first if this is the first
// batch, and committing it after b's statements if last is set. Any error
// leaves the transaction to be rolled back by end.
func (t *batchTx) send(ctx context.Context, b *pgx.Batch, last bool) error {
	if !t.begun {
		b.QueuedQueries = append([]*pgx.QueuedQuery{{SQL: sqlBegin}, {SQL: sqlNoSeqScan}}, b.QueuedQueries...)
		t.begun = true
	}
	if last {
		b.Queue(sqlCommit)
	}
	return t.conn.SendBatch(ctx, b).Close()
}

// q is the transaction's connection, for steps that need their own calls.
func (t *batchTx) q() querier { return t.conn }

// end rolls back a transaction still open (after an error) and releases
// the connection. Deferred by every user.
func (t *batchTx) end() {
	if status := t.conn.Conn().PgConn().TxStatus(); status != 'I' && !t.conn.Conn().IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := t.conn.Exec(ctx, "ROLLBACK")
		cancel()
		if err != nil {
			// The pool destroys a connection left in a transaction.
			_ = t.conn.Conn().Close(context.Background())
		}
	}
	t.conn.Release()
}
