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
	// lock wait the soak has seen is under 2 s.
	topUpLag = 5 * time.Second
	// topUpBatch is the rows of one InsertMany of the top-up.
	topUpBatch = 1_000
)

// topUp keeps the backlogged keys' backlog at its depth until ctx ends, so
// that the fleet runs saturated by the same work for the whole soak: every
// topUpEvery it counts the rows of those keys done since its last count
// (from since on) and inserts as many rows of workflowA, round-robin over
// acct:0 … acct:backlogged-1, as fair rounds drain them. added counts
// them, apart from the offered load.
func topUp(ctx context.Context, pool *pgxpool.Pool, ctl *durable.Engine, schema string, backlogged int, since time.Time, added *atomic.Int64, f *fleet) {
	if backlogged == 0 {
		return
	}
	// The count reads instances_terminal (updated_at, of terminal rows),
	// as the reporter's does: a window of a few seconds, not the table.
	q := fmt.Sprintf(`
SELECT count(*) FROM %s.instances
WHERE status = 'done' AND updated_at >= $1 AND updated_at < $2
  AND key_name = 'acct' AND split_part(key, ':', 2)::int < $3`, schema)
	tick := time.NewTicker(topUpEvery)
	defer tick.Stop()
	from, next, owed := since, 0, 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		to := time.Now().Add(-topUpLag)
		if !to.After(from) {
			continue
		}
		var n int
		if err := pool.QueryRow(ctx, q, from, to, backlogged).Scan(&n); err != nil {
			if ctx.Err() == nil {
				f.errorf("backlog top-up: count: %v", err)
			}
			continue
		}
		from = to
		owed += n
		for owed > 0 && ctx.Err() == nil {
			reqs := make([]durable.InsertRequest, min(owed, topUpBatch))
			for i := range reqs {
				reqs[i] = durable.InsertRequest{Workflow: workflowA, State: struct{}{},
					Options: durable.InsertOptions{Key: gate.Identity("acct", fmt.Sprint((next+i)%backlogged))}}
			}
			if _, err := ctl.InsertMany(ctx, reqs); err != nil {
				if ctx.Err() == nil {
					f.errorf("backlog top-up: insert: %v", err)
				}
				break // owed is retried at the next tick
			}
			next = (next + len(reqs)) % backlogged
			owed -= len(reqs)
			added.Add(int64(len(reqs)))
		}
	}
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
