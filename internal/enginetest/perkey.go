package enginetest

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

// keyRecorder counts, from inside the step bodies, the steps of each key
// running at once, and the most any step saw when it started after a mark.
type keyRecorder struct {
	mu        sync.Mutex
	cur, peak map[string]int
	mark      time.Time      // steps starting after it count in sinceMark
	sinceMark map[string]int // the most running, a starting step included, when it started after mark
}

func newKeyRecorder() *keyRecorder {
	return &keyRecorder{cur: map[string]int{}, peak: map[string]int{}, sinceMark: map[string]int{}}
}

func (r *keyRecorder) enter(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cur[key]++
	r.peak[key] = max(r.peak[key], r.cur[key])
	if !r.mark.IsZero() && time.Now().After(r.mark) {
		r.sinceMark[key] = max(r.sinceMark[key], r.cur[key])
	}
}

func (r *keyRecorder) exit(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cur[key]--
}

// now returns the running count of key and the most seen since the last resetPeak.
func (r *keyRecorder) now(key string) (cur, peak int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur[key], r.peak[key]
}

func (r *keyRecorder) resetPeak() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.peak {
		r.peak[k] = r.cur[k]
	}
}

func (r *keyRecorder) setMark(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mark = at
	clear(r.sinceMark)
}

func (r *keyRecorder) afterMark(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sinceMark[key]
}

// PerKeyLimitLive checks a per-key limit changed live on engines: two
// engines of 40 executors each run a backlog of the gate key stripe:big
// (the name's limit 5, owned by the engines' namespace) and of
// stripe:small. Saturated at 5, stripe:big's own limit is set to 50 by
// another namespace (as `durable limits set -namespace ops` does): within
// one second 50 of its steps run at once, while stripe:small stays at 5.
// Set back to 5, it binds at the key's next outcome flush: the steps under
// way finish (a successor reserved before the lowering may still take its
// predecessor's slot until that flush), the key drops to 5 within a
// few steps, and from then on no step of the key starts while 5 run, and
// it runs at 5. Counts come from the step bodies, not the store.
func PerKeyLimitLive(t *testing.T, newStore func() store.Store) {
	perKeyLimitLive(t, newStore, false)
}

// PerKeyLimitLiveSeveralKeys is PerKeyLimitLive with every row holding the
// gate key as its other key: each row's first key is an identity of its
// own (acct:i, never busy), so the stripe keys are held through key_holds
// and their rows wait in their lines. Such rows are never reserved as
// successors, so the lowered limit binds at the key's next claim.
func PerKeyLimitLiveSeveralKeys(t *testing.T, newStore func() store.Store) {
	perKeyLimitLive(t, newStore, true)
}

func perKeyLimitLive(t *testing.T, newStore func() store.Store, several bool) {
	const (
		step = 200 * time.Millisecond
		big  = "stripe:big"
	)
	rec := newKeyRecorder()
	wf := durable.NewWorkflow[sleepState]("work", "run", durable.WorkflowOptions{Queue: "mail"})
	wf.Step("run", func(ctx steps.Context, s sleepState) (transitions.Transition, error) {
		for _, k := range ctx.Keys() {
			rec.enter(k)
		}
		time.Sleep(step)
		for _, k := range ctx.Keys() {
			rec.exit(k)
		}
		return transitions.Done(s.N), nil
	})
	var engines []*durable.Engine
	for i := range 2 {
		e, err := durable.New(durable.Config{Store: newStore(), Namespace: "app", WorkerID: fmt.Sprintf("engine-%d", i),
			Queues: map[string]int{"mail": 40}, PollInterval: 50 * time.Millisecond, ReconcileInterval: time.Hour,
			Limits: []gate.Limit{{Name: "stripe", Limit: 5}}, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		require.NoError(t, e.Register(wf))
		engines = append(engines, e)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for _, e := range engines {
			_ = e.Stop(ctx)
		}
	})
	ctx := context.Background()
	insert := func(k gate.ConcurrencyKey, n int) {
		if !several {
			insertWork(t, engines[0], []gate.ConcurrencyKey{k}, n)
			return
		}
		reqs := make([]durable.InsertRequest, n)
		for i := range reqs {
			reqs[i] = durable.InsertRequest{Workflow: "work", State: sleepState{N: i},
				Options: durable.InsertOptions{Keys: []gate.ConcurrencyKey{gate.Identity("acct", fmt.Sprintf("%s-%d", k.ID(), i)), k}}}
		}
		_, err := engines[0].InsertMany(context.Background(), reqs)
		require.NoError(t, err)
	}
	insert(gate.Gate("stripe", "big"), 1000)
	insert(gate.Gate("stripe", "small"), 200)
	for _, e := range engines {
		require.NoError(t, e.Start(ctx))
	}
	ops := newStore()
	setBig := func(k int) {
		t.Helper()
		_, err := ops.SyncKeyLimits(ctx, "ops", store.KeyLimits{Limits: []gate.Limit{{Name: big, Limit: k, Shards: min(k, 5)}}}, store.SyncOptions{})
		require.NoError(t, err)
	}
	waitFor := func(within time.Duration, what string, ok func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !ok() {
			require.Less(t, time.Since(start), within, "waited for %s", what)
			time.Sleep(5 * time.Millisecond)
		}
		return time.Since(start)
	}

	waitFor(10*time.Second, "stripe:big saturated at 5", func() bool { c, _ := rec.now(big); return c == 5 })
	time.Sleep(2 * step)
	_, peak := rec.now(big)
	require.Equal(t, 5, peak, "the name's limit")

	setBig(50)
	took := waitFor(time.Second, "stripe:big at 50 within one second of the raise", func() bool { c, _ := rec.now(big); return c >= 50 })
	t.Logf("stripe:big reached 50 running steps %s after the raise", took)
	time.Sleep(2 * step)
	_, peak = rec.now(big)
	require.Equal(t, 50, peak, "never more than the key's own limit")
	_, small := rec.now("stripe:small")
	require.LessOrEqual(t, small, 5, "the other keys of the name keep its limit")

	lowered := time.Now()
	setBig(5)
	// Back at 5 for a whole step: the count dips for a moment each time
	// a round of chained steps ends together and their successors have
	// yet to start, and on a loaded machine the flush that stops a chain
	// may come a step or two later than the dip.
	took = waitFor(2*time.Second+step, "stripe:big back at 5 for a whole step", func() bool {
		since := time.Now()
		for time.Since(since) < step {
			if c, _ := rec.now(big); c > 5 {
				return false
			}
			time.Sleep(2 * time.Millisecond)
		}
		return true
	})
	t.Logf("stripe:big ran at most 5 steps for a whole step %s after the lowering", took)
	time.Sleep(2 * step) // a step that ended as its successor started may have been the one over
	rec.setMark(time.Now())
	rec.resetPeak()
	time.Sleep(6 * step)
	require.LessOrEqual(t, rec.afterMark(big), 5, "once at 5, no step of the key started over the lowered limit")
	_, peak = rec.now(big)
	require.Equal(t, 5, peak, "the lowered limit binds and is used in full")
	require.Less(t, time.Since(lowered), 10*time.Second)
}
