package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
)

const (
	// topUpEvery is how often the backlog's done rows are counted.
	topUpEvery = 2 * time.Second
	// topUpLag keeps the top-up's count that far behind the clock: a row's
	// updated_at is its outcome transaction's start, so a window that ended
	// at the clock would miss the rows of transactions still running, and
	// never count them (the next window starts after them). The longest
	// lock wait the soak has seen is under 2 s.
	topUpLag = 3 * time.Second
	// topUpBatch is the rows of one InsertMany of the top-up.
	topUpBatch = 1_000
	// topUpInserters insert the counted rows side by side, apart from the
	// count: one InsertMany after another, between counts, ran at about
	// the drain's rate on 2 cores with 8 engines (2,000 backlogged keys),
	// so that the windows, and the backlog's shortfall, grew by the minute.
	// More of them take more of the CPU from the offered load's inserter.
	topUpInserters = 2
)

// topUp keeps the backlogged keys' backlog at its depth, so that the fleet
// runs saturated by the same work for the whole soak: it counts the rows
// of those keys done since its last count and inserts as many rows of
// workflowA, round-robin over acct:0 … acct:backlogged-1, as fair rounds
// drain them, less the rows the offered load inserted over those keys
// meanwhile (its K = 1 keys include them), which join the backlog and
// replace as many. The backlog is short of its depth by the rows done in
// the last topUpLag + topUpEvery, and those counted and not inserted yet.
// added counts the top-up's rows, apart from the offered load.
type topUp struct {
	pool       *pgxpool.Pool
	ctl        *durable.Engine
	f          *fleet
	backlogged int
	offered    *atomic.Int64 // rows the offered load inserted over the backlogged keys
	count      string
	from       time.Time // the start of the next count's window
	seen       int64     // offered at the last count
	added      atomic.Int64

	mu   sync.Mutex
	owed int // rows counted and not inserted yet (negative: the offered load's, ahead of the rows done)
	next int // the key the next row goes to
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

// run counts every topUpEvery, and inserts what it counted with
// topUpInserters goroutines, until ctx ends.
func (t *topUp) run(ctx context.Context) {
	if t.backlogged == 0 {
		return
	}
	var wg sync.WaitGroup
	for range topUpInserters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := t.insert(ctx); err != nil && ctx.Err() == nil {
					t.f.errorf("backlog top-up: %v", err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
	}
	defer wg.Wait()
	tick := time.NewTicker(topUpEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := t.countDone(ctx, time.Now().Add(-topUpLag)); err != nil && ctx.Err() == nil {
			t.f.errorf("backlog top-up: %v", err)
		}
	}
}

// countDone counts the backlogged keys' rows done from the end of the
// last count to to, less the offered load's rows over those keys since
// the last count, into the rows owed.
func (t *topUp) countDone(ctx context.Context, to time.Time) error {
	if !to.After(t.from) {
		return nil
	}
	var n int
	if err := t.pool.QueryRow(ctx, t.count, t.from, to, t.backlogged).Scan(&n); err != nil {
		return fmt.Errorf("count: %w", err)
	}
	t.from = to
	off := t.offered.Load()
	t.mu.Lock()
	t.owed += n - int(off-t.seen)
	t.mu.Unlock()
	t.seen = off
	return nil
}

// insert inserts the rows owed, topUpBatch at a time; rows of a failed
// batch are owed again.
func (t *topUp) insert(ctx context.Context) error {
	for {
		t.mu.Lock()
		n, first := min(max(t.owed, 0), topUpBatch), t.next
		t.owed -= n
		t.next = (t.next + n) % t.backlogged
		t.mu.Unlock()
		if n == 0 {
			return nil
		}
		reqs := make([]durable.InsertRequest, n)
		for i := range reqs {
			reqs[i] = durable.InsertRequest{Workflow: workflowA, State: struct{}{},
				Options: durable.InsertOptions{Key: gate.Identity("acct", fmt.Sprint((first+i)%t.backlogged))}}
		}
		if _, err := t.ctl.InsertMany(ctx, reqs); err != nil {
			t.mu.Lock()
			t.owed += n
			t.mu.Unlock()
			return fmt.Errorf("insert: %w", err)
		}
		t.added.Add(int64(n))
	}
}

// last tops the backlog up once the fleet has stopped: its count needs no
// lag, so what it leaves of the backlog is what the top-up failed to
// replace.
func (t *topUp) last(ctx context.Context) error {
	if t.backlogged == 0 {
		return nil
	}
	if err := t.countDone(ctx, time.Now()); err != nil {
		return err
	}
	return t.insert(ctx)
}

// backlogDepth counts the waiting (ready and blocked) rows of the
// backlogged keys, through instances_live_key_name_key_c (the live rows of a
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
