package enginepg

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

// fakeClock is a clock both engines of a test share; PostgreSQL receives its
// time as every statement's "now".
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func versioned(version int, steps_ ...string) *durable.Workflow[num] {
	wf := durable.NewWorkflow[num]("skew", steps_[0], durable.WorkflowOptions{Version: version})
	for i, name := range steps_ {
		next := ""
		if i+1 < len(steps_) {
			next = steps_[i+1]
		}
		wf.Step(name, func(ctx steps.Context, s num) (transitions.Transition, error) {
			s.N = s.N*10 + version
			if next == "" {
				return transitions.Done(s.N), nil
			}
			return transitions.Next(next, s), nil
		})
	}
	return wf
}

// TestDeploymentSkew runs an old worker (version 1 of "skew" only) and a new
// one (versions 1 and 2, a step "extra" that version 1 does not have, and a
// workflow the old worker has never heard of) on one database, as during a
// rolling deploy. The old worker never claims the workflow or the version it
// does not register: their instances wait, untouched, for the new worker to
// run. Nothing fails.
func TestDeploymentSkew(t *testing.T) {
	st, _ := pgStore(t)
	ctx := waitCtx(t, 60*time.Second)
	clock := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	only := durable.NewWorkflow[num]("only-new", "s", durable.WorkflowOptions{})
	only.Step("s", func(ctx steps.Context, s num) (transitions.Transition, error) { return transitions.Done(42), nil })

	old := engine(t, durable.Config{Store: st, Clock: clock, WorkerID: "old", Lease: time.Hour}, versioned(1, "a", "b"))
	fresh := engine(t, durable.Config{Store: st, Clock: clock, WorkerID: "new", Lease: time.Hour},
		versioned(1, "a", "b"), versioned(2, "a", "extra", "b"), only)

	v1, err := old.Insert(ctx, "skew", num{}, durable.InsertOptions{})
	require.NoError(t, err)
	v2, err := fresh.Insert(ctx, "skew", num{}, durable.InsertOptions{})
	require.NoError(t, err)
	unknown, err := fresh.Insert(ctx, "only-new", num{}, durable.InsertOptions{})
	require.NoError(t, err)
	_, err = old.Insert(ctx, "only-new", num{}, durable.InsertOptions{})
	require.ErrorIs(t, err, durable.ErrUnknownWorkflow)

	startEngine(t, old)
	n, err := durable.Result[int](ctx, old, v1)
	require.NoError(t, err, "the old worker runs what it knows")
	assert.Equal(t, 11, n)
	// A v2 instance, of a version the old worker does not register, is
	// never claimed by it: no hand-back, no history, its state untouched.
	// (A row at a step the worker's version lacks is handed back: see
	// TestCLIHealthHandedBack.)
	in, err := st.Get(ctx, v2)
	require.NoError(t, err)
	assert.Equal(t, store.StatusReady, in.Status)
	assert.Equal(t, "a", in.Step)
	assert.Zero(t, in.Attempt)
	assert.Empty(t, in.LastError)
	assert.Empty(t, in.Worker)
	h, err := st.History(ctx, v2)
	require.NoError(t, err)
	assert.Empty(t, h)
	health, err := old.Health(ctx)
	require.NoError(t, err)
	assert.Empty(t, health.Skipped, "nothing claimed, nothing handed back")
	for _, q := range health.Queues {
		if q.Queue == durable.DefaultQueue {
			assert.Positive(t, q.Ready, "what nobody here can run shows as waiting work")
		}
	}
	in, err = st.Get(ctx, unknown)
	require.NoError(t, err)
	assert.Equal(t, store.StatusReady, in.Status, "a workflow the old worker does not know is never claimed by it")
	assert.Empty(t, in.Worker)
	h, err = st.History(ctx, unknown)
	require.NoError(t, err)
	assert.Empty(t, h)

	startEngine(t, fresh)
	n, err = durable.Result[int](ctx, fresh, unknown)
	require.NoError(t, err)
	assert.Equal(t, 42, n)
	// While both workers run, the new one runs the v2 instance (time
	// passes, as the test's clock drives the pick loops).
	type result struct {
		n   int
		err error
	}
	res := make(chan result, 1)
	go func() {
		n, err := durable.Result[int](ctx, fresh, v2)
		res <- result{n, err}
	}()
	var r result
wait:
	for {
		select {
		case r = <-res:
			break wait
		case <-time.After(100 * time.Millisecond):
			clock.Advance(time.Minute)
		}
	}
	n, err = r.n, r.err
	require.NoError(t, err, "the new worker runs the v2 instance")
	assert.Equal(t, 222, n, "all three steps ran on version 2")
	h, err = st.History(ctx, v2)
	require.NoError(t, err)
	workers := map[string]int{}
	for _, e := range h {
		if e.Outcome != "skipped" {
			workers[e.Worker]++
		}
	}
	assert.Equal(t, map[string]int{"new": 3}, workers)
}
