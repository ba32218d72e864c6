package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

// TestSignalRacesPark runs 10,000 interleavings of a step parking on a
// signal (Complete with an await outcome) and the signal arriving
// (Signal), started together from concurrent goroutines. Whatever the
// order, no instance may end awaiting while a matching signal sits unconsumed
// in its inbox (the lost wake-up).
func TestSignalRacesPark(t *testing.T) {
	const (
		total = 10_000
		pairs = 4
	)
	e := newEnv(t)
	// A hang (a deadlock the server cannot see) fails the test instead.
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
	defer cancel()
	ins := make([]store.NewInstance, total)
	for i := range ins {
		ins[i] = newInstance("")
	}
	e.insert(ins...)
	var claimed []store.Claimed
	for len(claimed) < total {
		cs := e.claim("w", 1000)
		require.NotEmpty(t, cs)
		claimed = append(claimed, cs...)
	}

	var woke, rechecked atomic.Int64
	park := func(cs []store.Claimed) {
		outs := make([]store.Outcome, len(cs))
		for i, c := range cs {
			outs[i] = store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeAwait, AwaitSignal: "go", Step: "after"}
		}
		res, err := e.s.Complete(ctx, "w", outs, time.Time{})
		if err != nil {
			t.Errorf("park: %v", err)
			return
		}
		for _, r := range res {
			if r.Stale {
				t.Errorf("park %s: stale", r.ID)
			}
		}
	}
	signal := func(c store.Claimed) {
		res, err := e.s.Signal(ctx, store.SignalRequest{InstanceID: c.ID, Name: "go", Payload: json.RawMessage(`{}`)})
		if err != nil {
			t.Errorf("signal %s: %v", c.ID, err)
		}
		if res.Woke {
			woke.Add(1)
		} else {
			rechecked.Add(1)
		}
	}
	// Each lane parks chunks of 1 to 8 instances in one Complete while two
	// other goroutines send their signals, all three started together.
	var wg sync.WaitGroup
	for p := range pairs {
		mine := claimed[p*total/pairs : (p+1)*total/pairs]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(p), 1))
			for len(mine) > 0 {
				chunk := mine[:min(len(mine), 1+rng.IntN(8))]
				mine = mine[len(chunk):]
				order := make([]store.Claimed, len(chunk))
				for i, j := range rng.Perm(len(chunk)) {
					order[i] = chunk[j]
				}
				half := len(order) / 2
				var lane sync.WaitGroup
				lane.Go(func() { park(chunk) })
				lane.Go(func() {
					for _, c := range order[:half] {
						signal(c)
					}
				})
				lane.Go(func() {
					for _, c := range order[half:] {
						signal(c)
					}
				})
				lane.Wait()
			}
		})
	}
	wg.Wait()
	t.Logf("signal woke the parked row %d times; the park found the signal %d times", woke.Load(), rechecked.Load())

	lost := e.scalar(`SELECT count(*) FROM instances i WHERE i.status = 'awaiting' AND EXISTS (
		SELECT 1 FROM signals s WHERE s.instance_id = i.id AND s.name = i.await_signal AND s.consumed_at IS NULL)`)
	require.Zero(t, lost, "instances awaiting with a matching unconsumed signal (lost wake-ups)")
	require.EqualValues(t, total, e.scalar(`SELECT count(*) FROM instances WHERE status = 'ready'`))
	require.Positive(t, woke.Load(), "no interleaving had the signal wake a parked row")
	require.Positive(t, rechecked.Load(), "no interleaving had the park find the signal")
}

// TestConcurrentClaimersNeverExceedK runs 8 workers on separate connections
// against hot K = 1 keys, a sharded gate and keyless rows, with outcomes that
// keep, release and switch keys, park and wake, and release claims, while
// more rows of the K = 1 keys are inserted (behind busy keys they go in
// blocked, and their heal marks the holder or retries: see migration 013).
// It requires no error (no unique violation, no deadlock), never more than
// K rows of a key in flight (seen by the workers and by SQL), and that all
// work drains with no reconciler: no promotion was lost.
func TestConcurrentClaimersNeverExceedK(t *testing.T) {
	const (
		workers = 8
		perKey  = 40
		steps   = 3
		late    = 20 // rows inserted per K = 1 key while the workers run, two at a time
	)
	e := newEnv(t)
	lim := gate.Limit{Name: "api", Limit: 3, Shards: 2}
	_, err := e.s.SyncLimits(e.ctx, []gate.Limit{lim})
	require.NoError(t, err)
	kOf := func(key string) int {
		if gate.NameOf(key) == "api" {
			return lim.Limit
		}
		return 1
	}
	keys := []string{"acct:0", "acct:1", "acct:2", "acct:3", "api:x", "api:y", ""}
	var ins []store.NewInstance
	for _, k := range keys {
		for i := range perKey {
			in := newInstance(k)
			in.Priority = i % 3
			ins = append(ins, in)
		}
	}
	rand.Shuffle(len(ins), func(i, j int) { ins[i], ins[j] = ins[j], ins[i] })
	e.insert(ins...)
	oneKeys := []string{"acct:0", "acct:1", "acct:2", "acct:3"}
	total := len(ins) + late*len(oneKeys)

	var (
		mu       sync.Mutex
		inFlight = map[string]int{}
		maxSeen  = map[string]int{}
		finished atomic.Int64
		errs     = make(chan error, workers+1)
	)
	enter := func(key string) error {
		mu.Lock()
		defer mu.Unlock()
		inFlight[key]++
		maxSeen[key] = max(maxSeen[key], inFlight[key])
		if key != "" && inFlight[key] > kOf(key) {
			return fmt.Errorf("key %s has %d rows in flight, K = %d", key, inFlight[key], kOf(key))
		}
		return nil
	}
	leave := func(key string) {
		mu.Lock()
		inFlight[key]--
		mu.Unlock()
	}

	ctx, cancel := context.WithTimeout(e.ctx, 45*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for w := range workers {
		worker := fmt.Sprintf("w%d", w)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for ctx.Err() == nil && finished.Load() < int64(total) {
				res, err := e.s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: worker, Limit: 4, Lease: time.Minute})
				if err != nil {
					errs <- fmt.Errorf("%s claim: %w", worker, err)
					return
				}
				if len(res.Claimed) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				var outs []store.Outcome
				var release []store.ClaimRef
				for _, c := range res.Claimed {
					if err := enter(c.Key); err != nil {
						errs <- err
						return
					}
				}
				time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
				for _, c := range res.Claimed {
					leave(c.Key)
					o := store.Outcome{ID: c.ID, Fence: c.Fence}
					switch r := rng.IntN(10); {
					case r == 0:
						release = append(release, store.ClaimRef{ID: c.ID, Fence: c.Fence})
						continue
					case c.Attempt >= steps:
						o.Kind = store.OutcomeDone
						finished.Add(1)
					case r == 1 && c.Key != "":
						o.Kind, o.Step, o.Attempt, o.SetKey = store.OutcomeReady, "nokey", c.Attempt+1, true
					case r == 2:
						o.Kind, o.Step, o.Attempt = store.OutcomeAwait, "woken", c.Attempt+1
						o.AwaitSignal = "go"
					default:
						o.Kind, o.Step, o.Attempt = store.OutcomeReady, "next", c.Attempt+1
					}
					if c.Signal != nil {
						o.ConsumeSignal = c.Signal.ID
					}
					outs = append(outs, o)
				}
				if len(release) > 0 {
					if err := e.s.Release(ctx, worker, release, time.Time{}); err != nil {
						errs <- fmt.Errorf("%s release: %w", worker, err)
						return
					}
				}
				if len(outs) > 0 {
					rs, err := e.s.Complete(ctx, worker, outs, time.Time{})
					if err != nil {
						errs <- fmt.Errorf("%s complete: %w", worker, err)
						return
					}
					for i, r := range rs {
						if r.Stale {
							errs <- fmt.Errorf("%s: outcome for %s stale", worker, outs[i].ID)
							return
						}
						if outs[i].Kind == store.OutcomeAwait {
							go func(id string) {
								if _, err := e.s.Signal(ctx, store.SignalRequest{InstanceID: id, Name: "go"}); err != nil && ctx.Err() == nil {
									errs <- fmt.Errorf("signal: %w", err)
								}
							}(outs[i].ID)
						}
					}
				}
			}
		})
	}
	wg.Go(func() {
		for i := 0; i < late/2 && ctx.Err() == nil; i++ {
			for _, k := range oneKeys {
				if _, err := e.s.Insert(ctx, []store.NewInstance{newInstance(k), newInstance(k)}); err != nil {
					errs <- fmt.Errorf("late insert: %w", err)
					return
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	// SQL's view: never more executing rows of a key than K.
	wg.Go(func() {
		for ctx.Err() == nil && finished.Load() < int64(total) {
			rows, err := e.pool.Query(ctx, `SELECT key, count(*) FROM instances
				WHERE status = 'executing' AND key IS NOT NULL GROUP BY key`)
			if err != nil {
				if ctx.Err() == nil {
					errs <- err
				}
				return
			}
			for rows.Next() {
				var k string
				var n int
				if err := rows.Scan(&k, &n); err == nil && n > kOf(k) {
					errs <- fmt.Errorf("SQL sees %d executing rows of %s", n, k)
				}
			}
			rows.Close()
			time.Sleep(2 * time.Millisecond)
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ctx.Err() != nil {
		rows, err := e.pool.Query(e.ctx, `SELECT i.id::text, i.status, coalesce(i.key, ''), i.step, coalesce(i.await_signal, ''),
			(SELECT count(*) FROM signals s WHERE s.instance_id = i.id AND s.consumed_at IS NULL),
			(SELECT count(*) FROM instances x WHERE x.key = i.key AND x.status = 'executing')
			FROM instances i WHERE i.status <> 'done'`)
		require.NoError(t, err)
		for rows.Next() {
			var id, st, key, step, aw string
			var sigs, exec int
			require.NoError(t, rows.Scan(&id, &st, &key, &step, &aw, &sigs, &exec))
			t.Logf("unfinished: %s status=%s key=%q step=%s await=%q unconsumed signals=%d executing rows of key=%d", id, st, key, step, aw, sigs, exec)
		}
		rows.Close()
	}
	require.NoError(t, ctx.Err(), "work did not drain: %d of %d finished (a lost promotion?)", finished.Load(), total)
	require.EqualValues(t, total, e.scalar(`SELECT count(*) FROM instances WHERE status = 'done'`))
	require.Zero(t, e.scalar(`SELECT count(*) FROM key_slots WHERE available <> capacity`),
		"every slot came back without a reconciler")
	t.Logf("max in flight per key: %v", maxSeen)
	for _, k := range []string{"acct:0", "api:x"} {
		require.Equal(t, kOf(k), maxSeen[k], "key %s never reached its K: the test did not contend", k)
	}
}
