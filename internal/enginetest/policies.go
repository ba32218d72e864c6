package enginetest

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

// Gauge tracks how many steps run at once, overall and per key, from
// outside the store, and the highest counts seen.
type Gauge struct {
	mu             sync.Mutex
	cur, peak      int
	curKey, peakKy map[string]int
	started        int
}

// NewGauge returns an empty gauge.
func NewGauge() *Gauge { return &Gauge{curKey: map[string]int{}, peakKy: map[string]int{}} }

// Enter records a step starting under key.
func (g *Gauge) Enter(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.started++
	g.cur++
	g.peak = max(g.peak, g.cur)
	g.curKey[key]++
	g.peakKy[key] = max(g.peakKy[key], g.curKey[key])
}

// Exit records a step under key ending.
func (g *Gauge) Exit(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cur--
	g.curKey[key]--
}

// Reset forgets the peaks (the current counts stay).
func (g *Gauge) Reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.peak = g.cur
	for k := range g.peakKy {
		g.peakKy[k] = g.curKey[k]
	}
}

// Peak returns the most steps seen at once and the most of any one key.
func (g *Gauge) Peak() (all, perKey int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range g.peakKy {
		perKey = max(perKey, n)
	}
	return g.peak, perKey
}

// Started returns how many steps started.
func (g *Gauge) Started() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.started
}

// FakeClock is a durable.Clock the test moves.
type FakeClock struct{ ns atomic.Int64 }

// NewFakeClock returns a clock at t.
func NewFakeClock(t time.Time) *FakeClock {
	c := &FakeClock{}
	c.ns.Store(t.UnixNano())
	return c
}

// Now returns the fake time.
func (c *FakeClock) Now() time.Time { return time.Unix(0, c.ns.Load()).UTC() }

// Advance moves the clock forward by d.
func (c *FakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

type sleepState struct {
	N int `json:"n"`
}

// fleet starts n engines of cfg (each with its own store from newStore,
// executors on queue "mail", a worker id and a silent logger), running one
// workflow "work" whose step calls onStart (when set) and then sleeps for
// step (real time) inside the gauge.
func fleet(t *testing.T, newStore func() store.Store, n, executors int, cfg durable.Config, g *Gauge, step time.Duration, onStart func(steps.Context)) []*durable.Engine {
	t.Helper()
	wf := durable.NewWorkflow[sleepState]("work", "run", durable.WorkflowOptions{Queue: "mail"})
	wf.Step("run", func(ctx steps.Context, s sleepState) (transitions.Transition, error) {
		if onStart != nil {
			onStart(ctx)
		}
		g.Enter(ctx.Key())
		time.Sleep(step)
		g.Exit(ctx.Key())
		return transitions.Done(s.N), nil
	})
	var engines []*durable.Engine
	for i := range n {
		c := cfg
		c.Store = newStore()
		c.Queues = map[string]int{"mail": executors}
		c.WorkerID = fmt.Sprintf("engine-%d", i)
		c.Logger = slog.New(slog.DiscardHandler)
		e, err := durable.New(c)
		require.NoError(t, err)
		require.NoError(t, e.Register(wf))
		engines = append(engines, e)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, e := range engines {
			_ = e.Stop(ctx)
		}
	})
	return engines
}

func insertWork(t *testing.T, e *durable.Engine, keys []gate.ConcurrencyKey, n int) []string {
	t.Helper()
	reqs := make([]durable.InsertRequest, n)
	for i := range reqs {
		reqs[i] = durable.InsertRequest{Workflow: "work", State: sleepState{N: i}, Options: durable.InsertOptions{Key: keys[i%len(keys)]}}
	}
	ids, err := e.InsertMany(context.Background(), reqs)
	require.NoError(t, err)
	return ids
}

// waitDone waits for the instances ids to be done within timeout.
func waitDone(t *testing.T, e *durable.Engine, ids []string, timeout time.Duration) {
	t.Helper()
	late := waitEnded(t, e, ids, timeout)
	require.Empty(t, late, "%d instances not done after %s", len(late), timeout)
}

// waitEnded waits for the instances ids until timeout: each one that ends
// by then must be done. It returns the others, as they are at the timeout.
func waitEnded(t *testing.T, e *durable.Engine, ids []string, timeout time.Duration) []durable.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var late []durable.Instance
	for _, id := range ids {
		in, err := e.Wait(ctx, id)
		if err != nil && ctx.Err() != nil { // past the timeout: the row as it is now
			in, err = e.Get(context.Background(), id)
			require.NoError(t, err)
			if in.Status != store.StatusDone {
				late = append(late, in)
			}
			continue
		}
		require.NoError(t, err)
		require.Equal(t, store.StatusDone, in.Status)
	}
	return late
}

// MaxActiveAcrossEngines runs three engines of 10 executors each on one
// queue whose stored policy allows 4 at once (2 per key): the fleet never
// runs more, and a policy raised while it runs takes effect without a
// restart.
func MaxActiveAcrossEngines(t *testing.T, newStore func() store.Store) {
	g := NewGauge()
	engines := fleet(t, newStore, 3, 10, durable.Config{Namespace: "mailers", PollInterval: 5 * time.Millisecond,
		ReconcileInterval: time.Hour, Limits: []gate.Limit{{Name: "tenant", Limit: 10}}}, g, 15*time.Millisecond, nil)
	ctx := context.Background()
	_, err := engines[0].SyncConcurrencyPolicies(ctx, []store.ConcurrencyPolicy{{Queue: "mail", MaxActive: 4, MaxActivePerKey: 2}}, store.SyncOptions{})
	require.NoError(t, err)
	keys := []gate.ConcurrencyKey{gate.Gate("tenant", "a"), gate.Gate("tenant", "b"), gate.Gate("tenant", "c"), {}}
	ids := insertWork(t, engines[0], keys, 60)
	for _, e := range engines {
		require.NoError(t, e.Start(ctx))
	}
	waitDone(t, engines[0], ids, 60*time.Second)
	all, perKey := g.Peak()
	require.Equal(t, 4, all, "30 executors, MaxActive 4: the fleet runs exactly 4 at its peak")
	require.LessOrEqual(t, perKey, 4)
	g.mu.Lock()
	for k, n := range g.peakKy {
		if k != "" {
			require.LessOrEqual(t, n, 2, "key %s ran %d at once, MaxActivePerKey 2", k, n)
		}
	}
	g.mu.Unlock()

	// A raised budget applies from the next claim, fleet-wide.
	g.Reset()
	_, err = engines[1].SyncConcurrencyPolicies(ctx, []store.ConcurrencyPolicy{{Queue: "mail", MaxActive: 9}}, store.SyncOptions{})
	require.NoError(t, err)
	ids = insertWork(t, engines[2], keys, 90)
	waitDone(t, engines[0], ids, 60*time.Second)
	all, _ = g.Peak()
	require.LessOrEqual(t, all, 9)
	require.Greater(t, all, 4, "the raised MaxActive is in force without a restart")

	// Another namespace cannot take the queue over.
	other, err := durable.New(durable.Config{Store: newStore(), Namespace: "intruders", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	_, err = other.SyncConcurrencyPolicies(ctx, []store.ConcurrencyPolicy{{Queue: "mail", MaxActive: 100}}, store.SyncOptions{})
	require.ErrorIs(t, err, store.ErrNamespaceConflict)
}

// RateAcrossEngines runs three engines sharing a fake clock against one
// rate limit of 20 per second (burst 10) for 10 seconds of that clock: they
// start at most 20 × 10 + 10 steps, and close to that many. The clock runs
// four times faster than real time, so that a slow claim (a loaded
// machine) does not let the bucket overflow its burst unused.
func RateAcrossEngines(t *testing.T, newStore func() store.Store, start time.Time) {
	const (
		rate  = 20
		burst = 10
		span  = 10 * time.Second
	)
	clock := NewFakeClock(start)
	g := NewGauge()
	engines := fleet(t, newStore, 3, 4, durable.Config{Clock: clock, PollInterval: 5 * time.Millisecond, ReconcileInterval: time.Hour,
		Limits:     []gate.Limit{{Name: "api", Limit: 1000}},
		RateLimits: []gate.RateLimit{{Name: "api", Limit: rate, Burst: burst}}}, g, 0, nil)
	ctx := context.Background()
	keys := make([]gate.ConcurrencyKey, 10)
	for i := range keys {
		keys[i] = gate.Gate("api", fmt.Sprint(i))
	}
	insertWork(t, engines[0], keys, 400)
	for _, e := range engines {
		require.NoError(t, e.Start(ctx))
	}
	for elapsed := time.Duration(0); elapsed < span; elapsed += 10 * time.Millisecond {
		time.Sleep(2500 * time.Microsecond)
		clock.Advance(10 * time.Millisecond)
	}
	// The clock stops at start + span: let the engines catch up.
	time.Sleep(200 * time.Millisecond)
	for prev := -1; prev != g.Started(); {
		prev = g.Started()
		time.Sleep(100 * time.Millisecond)
	}
	limit := rate*int(span/time.Second) + burst
	started := g.Started()
	t.Logf("%d steps started in %s of fake time at %d/s, burst %d (bound %d)", started, span, rate, burst, limit)
	require.LessOrEqual(t, started, limit)
	require.GreaterOrEqual(t, started, limit*3/5, "the rate limit is reached, not just respected")
}
