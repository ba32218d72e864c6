package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
)

const (
	// topUpEvery is how often the backlog is topped up.
	topUpEvery = 2 * time.Second
	// topUpLag keeps the top-up's count that far behind the clock: a row's
	// updated_at is its outcome transaction's start, so a window that ended
	// at the clock would miss the rows of transactions still running, and
	// never count them (the next window starts after them). The longest
	// lock wait the soak has seen is under 2 s. The backlog is short of its
	// depth by the rows done in the last topUpLag + topUpEvery at most.
	topUpLag = 3 * time.Second
	// topUpBatch is the rows of one InsertMany of the top-up.
	topUpBatch = 1_000
)

// topUp keeps the backlogged keys' backlog at its depth, so that the fleet
// runs saturated by the same work for the whole soak: it counts the rows
// of those keys done since its last count and inserts as many rows of
// workflowA, round-robin over acct:0 … acct:backlogged-1, as fair rounds
// drain them, less the rows the offered load inserted over those keys
// meanwhile (its K = 1 keys include them), which join the backlog and
// replace as many. added counts the top-up's rows, apart from the offered
// load.
type topUp struct {
	pool       *pgxpool.Pool
	ctl        *durable.Engine
	f          *fleet
	backlogged int
	offered    *atomic.Int64 // rows the offered load inserted over the backlogged keys
	count      string
	from       time.Time // the start of the next count's window
	seen       int64     // offered at the last count
	next       int       // the key the next row goes to
	owed       int       // rows to insert (negative: the offered load's, ahead of the rows done)
	added      atomic.Int64
}

// newTopUp returns the top-up of the backlogged keys' rows done from since
// on, offered counting the offered load's rows over those keys.
func newTopUp(pool *pgxpool.Pool, ctl *durable.Engine, f *fleet, schema string, backlogged int, offered *atomic.Int64, since time.Time) *topUp {
	// The count reads instances_terminal (updated_at, of terminal rows),
	// as the reporter's does: a window of a few seconds, not the table.
	return &topUp{pool: pool, ctl: ctl, f: f, backlogged: backlogged, offered: offered, from: since, count: fmt.Sprintf(`
SELECT count(*) FROM %s.instances
WHERE status = 'done' AND updated_at >= $1 AND updated_at < $2
  AND key_name = 'acct' AND split_part(key, ':', 2)::int < $3`, schema)}
}

// run tops the backlog up every topUpEvery until ctx ends.
func (t *topUp) run(ctx context.Context) {
	tick := time.NewTicker(topUpEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := t.once(ctx, time.Now().Add(-topUpLag)); err != nil && ctx.Err() == nil {
			t.f.errorf("backlog top-up: %v", err)
		}
	}
}

// once counts the backlogged keys' rows done from the end of the last
// count to to and inserts as many, less the offered load's rows over those
// keys since the last count.
func (t *topUp) once(ctx context.Context, to time.Time) error {
	if t.backlogged == 0 || !to.After(t.from) {
		return nil
	}
	var n int
	if err := t.pool.QueryRow(ctx, t.count, t.from, to, t.backlogged).Scan(&n); err != nil {
		return fmt.Errorf("count: %w", err)
	}
	t.from = to
	off := t.offered.Load()
	t.owed += n - int(off-t.seen)
	t.seen = off
	for t.owed > 0 {
		reqs := make([]durable.InsertRequest, min(t.owed, topUpBatch))
		for i := range reqs {
			reqs[i] = durable.InsertRequest{Workflow: workflowA, State: struct{}{},
				Options: durable.InsertOptions{Key: gate.Identity("acct", fmt.Sprint((t.next+i)%t.backlogged))}}
		}
		if _, err := t.ctl.InsertMany(ctx, reqs); err != nil {
			return fmt.Errorf("insert: %w", err) // owed, retried at the next count
		}
		t.next = (t.next + len(reqs)) % t.backlogged
		t.owed -= len(reqs)
		t.added.Add(int64(len(reqs)))
	}
	return nil
}

// backlogDepth counts the waiting (ready and blocked) rows of the
// backlogged keys, through instances_live_key_name_c (the live rows of a
// key name), whose predicate the condition repeats: every live row of the
// K = 1 keys, a second or so at the default sizes, so it runs only before
// and after the soak.
func backlogDepth(ctx context.Context, pool *pgxpool.Pool, schema string, backlogged int) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, fmt.Sprintf(`
SELECT count(*) FROM %s.instances
WHERE key_name = 'acct' AND key IS NOT NULL AND status COLLATE "C" NOT IN ('done', 'failed', 'canceled')
  AND status IN ('ready', 'blocked') AND split_part(key, ':', 2)::int < $1`, schema), backlogged).Scan(&n)
	return n, err
}
