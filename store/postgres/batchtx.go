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
	conn    *pgxpool.Conn
	begun   bool
	generic bool // begins on generic plans (see beginGeneric)
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
	// included). A scan with none still runs, its cost raised by
	// PostgreSQL's disable cost past jit_above_cost: JIT is off for the
	// transaction, so that such a statement, short as these are, is not
	// also compiled at every execution (hundreds of milliseconds each).
	sqlNoSeqScan = `SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)`
	// sqlLockTimeout bounds the rest of the transaction's lock waits ($1,
	// e.g. '50ms'; see optimisticLockWait).
	sqlLockTimeout = `SELECT set_config('lock_timeout', $1, true)`
	// sqlNoSeqScanGeneric is sqlNoSeqScan that also makes the transaction's
	// prepared statements run their generic plans from their first
	// execution on, until sqlAutoPlans (see beginGeneric). Under
	// plan_cache_mode = auto, PostgreSQL plans a prepared statement anew at
	// each of its first five executions on a connection before it may
	// settle on the generic plan, and some statements never settle (array
	// parameters make the generic plan look no cheaper), so they are
	// planned at every call:
	//   - the hand-off's reads (CTEs with correlated subqueries) cost more
	//     to plan than to run: a hot gate ran at 1,311 steps/s with 1,146
	//     µs of PostgreSQL CPU per step under auto, and at 2,674 with 424
	//     µs on generic plans (make bench, scenario 3);
	//   - planning the claim's side statements and the flush's statements
	//     took 1-2 ms per plan on a fresh connection: about 90 ms in a
	//     5,000-row keyed run of the peers driver that lasted 500 ms
	//     (pg_stat_statements with track_planning), and the flush's
	//     notification of policy queues was planned at every flush;
	//   - the claim's window (sqlClaimCandidates) never settles either,
	//     and its custom plan costs more to make than to run (1-2 ms
	//     against under 1 ms): every claim would pay it, an idle engine's
	//     first claim of a new row included.
	// A flush's follow-ups (signals, children, inbox) are not on it,
	// except in a hand-off transaction (see complete): a generic plan is
	// made at the first execution, when a fresh table's statistics say
	// little, and make bench's scenario 7 lost about a seventh to
	// sqlRecheckInbox's.
	sqlNoSeqScanGeneric = `SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true)`
	// sqlAutoPlans lets PostgreSQL choose between custom and generic plans
	// again for the rest of the transaction (its default).
	sqlAutoPlans = `SELECT set_config('plan_cache_mode', 'auto', true)`
	sqlCommit    = `COMMIT`
)

func (s *Store) beginBatch(ctx context.Context) (*batchTx, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &batchTx{conn: c}, nil
}

// beginGeneric is beginBatch for a transaction whose statements run their
// generic plans from the first execution on (until sqlAutoPlans).
func (s *Store) beginGeneric(ctx context.Context) (*batchTx, error) {
	t, err := s.beginBatch(ctx)
	if t != nil {
		t.generic = true
	}
	return t, err
}

// send runs b in the transaction, beginning it first if this is the first
// batch, and committing it after b's statements if last is set. Any error
// leaves the transaction to be rolled back by end.
func (t *batchTx) send(ctx context.Context, b *pgx.Batch, last bool) error {
	if !t.begun {
		first := sqlNoSeqScan
		if t.generic {
			first = sqlNoSeqScanGeneric
		}
		b.QueuedQueries = append([]*pgx.QueuedQuery{{SQL: sqlBegin}, {SQL: first}}, b.QueuedQueries...)
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
