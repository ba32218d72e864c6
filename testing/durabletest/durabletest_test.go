package durabletest_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

type job struct {
	Done []string `json:"done"`
}

func pipeline() *durable.Workflow[job] {
	wf := durable.NewWorkflow[job]("pipeline", "a", durable.WorkflowOptions{})
	wf.Step("a", func(ctx steps.Context, s job) (transitions.Transition, error) {
		s.Done = append(s.Done, "a")
		return transitions.Next("b", s), nil
	})
	wf.Step("b", func(ctx steps.Context, s job) (transitions.Transition, error) {
		s.Done = append(s.Done, "b")
		return transitions.Await("approve", "c", s, transitions.Timeout(time.Hour)), nil
	})
	wf.Step("c", func(ctx steps.Context, s job) (transitions.Transition, error) {
		if ctx.TimedOut() {
			s.Done = append(s.Done, "timeout")
		} else {
			s.Done = append(s.Done, "approved")
		}
		return transitions.Next("d", s, transitions.ReleaseKey()), nil
	})
	wf.Step("d", func(ctx steps.Context, s job) (transitions.Transition, error) {
		s.Done = append(s.Done, "d:"+ctx.Key())
		return transitions.Done(s.Done), nil
	})
	return wf
}

func TestKeysSerializeAndGatesCap(t *testing.T) {
	env := durabletest.New(t, durabletest.Options{Limits: []gate.Limit{{Name: "api", Limit: 3}}}, pipeline())
	var ids []string
	for i := 0; i < 5; i++ {
		ids = append(ids, env.Insert("pipeline", job{}, durable.InsertOptions{Key: gate.Identity("account", "1")}))
		ids = append(ids, env.Insert("pipeline", job{}, durable.InsertOptions{Key: gate.Gate("api", "x")}))
	}
	env.RunUntilIdle()
	assert.Equal(t, 1, env.MaxConcurrency("account:1"), "K = 1 for an unconfigured name")
	assert.Equal(t, 3, env.MaxConcurrency("api:x"), "a gate runs up to its limit")
	// Every instance is parked on the await, holding no slot.
	for _, id := range ids {
		in := env.Get(id)
		assert.Equal(t, store.StatusAwaiting, in.Status)
	}
	info := env.Key("account:1")
	assert.Empty(t, info.Holders, "an await releases the slot")
	for _, id := range ids {
		env.Signal(id, "approve", nil)
	}
	env.RunUntilIdle()
	for _, id := range ids {
		assert.Equal(t, []string{"a", "b", "approved", "d:"}, durabletest.Result[[]string](env, id), "the wrap-up ran without the key")
	}
}

func TestAdvanceFiresTimeoutsAndScheduledSignals(t *testing.T) {
	env := durabletest.New(t, durabletest.Options{}, pipeline())
	timeout := env.Insert("pipeline", job{}, durable.InsertOptions{})
	signalled := env.Insert("pipeline", job{}, durable.InsertOptions{})
	env.SignalAfter(30*time.Minute, signalled, "approve", nil)
	env.RunUntilIdle()
	assert.Equal(t, store.StatusAwaiting, env.Get(timeout).Status)
	env.Advance(59 * time.Minute)
	assert.Equal(t, store.StatusAwaiting, env.Get(timeout).Status, "not yet")
	assert.Equal(t, store.StatusDone, env.Get(signalled).Status, "the scheduled signal fired at +30m")
	env.Advance(2 * time.Minute)
	assert.Equal(t, []string{"a", "b", "timeout", "d:"}, durabletest.Result[[]string](env, timeout))
	assert.Equal(t, durabletest.Epoch.Add(61*time.Minute), env.Clock.Now())
}

func TestRunUntilDoneJumpsToTimers(t *testing.T) {
	wf := durable.NewWorkflow[int]("sleeper", "nap", durable.WorkflowOptions{})
	wf.Step("nap", func(ctx steps.Context, n int) (transitions.Transition, error) {
		if n == 3 {
			return transitions.Done(ctx.Now()), nil
		}
		return transitions.Sleep(24*time.Hour, "nap", n+1), nil
	})
	env := durabletest.New(t, durabletest.Options{}, wf)
	id := env.Insert("sleeper", 0, durable.InsertOptions{})
	env.RunUntilDone(id)
	assert.Equal(t, durabletest.Epoch.Add(72*time.Hour), durabletest.Result[time.Time](env, id).UTC())
	assert.Equal(t, []string{"nap", "nap", "nap", "nap"}, env.StepNames(id))
}

func TestRetriesWithBackoffOnTheFakeClock(t *testing.T) {
	wf := durable.NewWorkflow[int]("flaky", "call", durable.WorkflowOptions{
		Retry: steps.RetryPolicy{MaxAttempts: 5, InitialInterval: time.Second, Multiplier: 2, RandomizationFactor: -1},
	})
	wf.Step("call", func(ctx steps.Context, n int) (transitions.Transition, error) {
		if ctx.Attempt() < 3 {
			return transitions.Transition{}, fmt.Errorf("429 on attempt %d", ctx.Attempt())
		}
		return transitions.Done(ctx.Attempt()), nil
	})
	env := durabletest.New(t, durabletest.Options{}, wf)
	id := env.Insert("flaky", 0, durable.InsertOptions{})
	env.RunUntilDone(id)
	assert.Equal(t, 3, durabletest.Result[int](env, id))
	assert.Equal(t, durabletest.Epoch.Add(7*time.Second), env.Clock.Now(), "1s + 2s + 4s of backoff")
	h := env.History(id)
	require.Len(t, h, 4)
	assert.Equal(t, "429 on attempt 0", h[0].Error)
}

func TestRunStepInIsolation(t *testing.T) {
	env := durabletest.New(t, durabletest.Options{}, pipeline())
	tr, err := durabletest.RunStep(env, pipeline(), "c", job{}, durabletest.StepOptions{TimedOut: true, Key: "account:1"})
	require.NoError(t, err)
	assert.Equal(t, transitions.KindNext, tr.Kind)
	assert.Equal(t, "d", tr.Step)
	require.NotNil(t, tr.KeyChange)
	assert.True(t, tr.KeyChange.Key.IsZero(), "c releases the key")
	assert.Equal(t, []string{"timeout"}, tr.State.(job).Done)
}

func TestDeterministic(t *testing.T) {
	run := func() []string {
		env := durabletest.New(t, durabletest.Options{Queues: map[string]int{"default": 2}}, pipeline())
		var ids []string
		for i := 0; i < 6; i++ {
			ids = append(ids, env.Insert("pipeline", job{}, durable.InsertOptions{Key: gate.Identity("account", fmt.Sprint(i%2))}))
		}
		env.RunUntilIdle()
		var order []string
		for r := 0; r < 3; r++ {
			env.Signal(ids[r], "approve", nil)
		}
		env.Advance(2 * time.Hour)
		for i, id := range ids {
			for _, h := range env.History(id) {
				order = append(order, fmt.Sprintf("%d:%s@%s", i, h.Step, h.StartedAt.Sub(durabletest.Epoch)))
			}
		}
		return order
	}
	assert.Equal(t, run(), run())
}

func TestSpawnJoinsChildren(t *testing.T) {
	child := durable.NewWorkflow[int]("square", "run", durable.WorkflowOptions{})
	child.Step("run", func(ctx steps.Context, n int) (transitions.Transition, error) {
		if n < 0 {
			return transitions.Stop("negative"), nil
		}
		return transitions.Done(n * n), nil
	})
	parent := durable.NewWorkflow[[]int]("fanout", "spawn", durable.WorkflowOptions{})
	parent.Step("spawn", func(ctx steps.Context, ns []int) (transitions.Transition, error) {
		var kids []transitions.Child
		for _, n := range ns {
			kids = append(kids, transitions.Child{Workflow: "square", State: n, Key: gate.Identity("tenant", "t1")})
		}
		return transitions.Spawn(kids, "sum", ns), nil
	})
	parent.Step("sum", func(ctx steps.Context, ns []int) (transitions.Transition, error) {
		kids, err := ctx.Children()
		if err != nil {
			return transitions.Transition{}, err
		}
		sum, failed := 0, 0
		for _, k := range kids {
			if k.Status != "done" {
				failed++
				continue
			}
			var v int
			if err := k.Decode(&v); err != nil {
				return transitions.Transition{}, err
			}
			sum += v
		}
		return transitions.Done([]int{sum, failed}), nil
	})
	env := durabletest.New(t, durabletest.Options{}, parent, child)
	id := env.Insert("fanout", []int{1, 2, 3, -1}, durable.InsertOptions{})
	env.RunUntilIdle()
	assert.Equal(t, []int{14, 1}, durabletest.Result[[]int](env, id))
	assert.Equal(t, 1, env.MaxConcurrency("tenant:t1"), "children carry their own keys")
}

func TestUnknownVersionIsLeftForAnotherWorker(t *testing.T) {
	v1 := durable.NewWorkflow[int]("versioned", "s", durable.WorkflowOptions{Version: 1})
	v1.Step("s", func(ctx steps.Context, n int) (transitions.Transition, error) { return transitions.Done("v1"), nil })
	v2 := durable.NewWorkflow[int]("versioned", "s", durable.WorkflowOptions{Version: 2})
	v2.Step("s", func(ctx steps.Context, n int) (transitions.Transition, error) { return transitions.Done("v2"), nil })

	newer := durabletest.New(t, durabletest.Options{}, v1, v2)
	id := newer.Insert("versioned", 0, durable.InsertOptions{})
	newer.RunUntilIdle()
	assert.Equal(t, "v2", durabletest.Result[string](newer, id), "new instances start on the highest version")

	// An old worker that only knows v1 never claims a v2 instance.
	older := durabletest.New(t, durabletest.Options{}, v1)
	_, err := older.Store.Insert(t.Context(), []store.NewInstance{{ID: "6f1c1f8e-8a7e-4c41-9d5a-0b3a1b7f3c11", Workflow: "versioned", Version: 2, Queue: "default", Step: "s", State: []byte("0"), RunAt: durabletest.Epoch}})
	require.NoError(t, err)
	older.RunUntilIdle()
	in := older.Get("6f1c1f8e-8a7e-4c41-9d5a-0b3a1b7f3c11")
	assert.Equal(t, store.StatusReady, in.Status)
	assert.Empty(t, in.LastError, "never claimed, never handed back")
	assert.Equal(t, 0, in.Attempt, "skew costs no attempt")
}

// errorsT records the errors a durabletest Env reports instead of failing.
type errorsT struct {
	testing.TB
	errs []string
}

func (e *errorsT) Errorf(format string, args ...any) {
	e.errs = append(e.errs, fmt.Sprintf(format, args...))
}

func TestTransitionToUnknownStepFailsAtOnceAndIsFlagged(t *testing.T) {
	var runs int
	wf := durable.NewWorkflow[job]("typo", "a", durable.WorkflowOptions{})
	wf.Step("a", func(ctx steps.Context, s job) (transitions.Transition, error) {
		runs++
		return transitions.Next("bee", s), nil // there is no step "bee"
	})
	wf.Step("b", func(ctx steps.Context, s job) (transitions.Transition, error) { return transitions.Done("ok"), nil })
	rec := &errorsT{TB: t}
	env := durabletest.New(rec, durabletest.Options{}, wf)
	id := env.Insert("typo", job{}, durable.InsertOptions{})
	in := env.RunUntilDone(id)
	require.Equal(t, store.StatusFailed, in.Status)
	require.Equal(t, 1, runs, "a programming error is not retried: the step ran once")
	require.Contains(t, in.LastError, `unknown step "bee"`)
	require.Contains(t, in.LastError, "steps: a, b")
	require.Len(t, rec.errs, 1, "durabletest flags the invalid transition on the first run")
	require.Contains(t, rec.errs[0], `unknown step "bee"`)
	h := env.History(id)
	require.Len(t, h, 1)
	require.Equal(t, durable.OutcomeInvalidTransition, h[0].Outcome)
}

// A step that returns a state JSON cannot encode (a NaN float) is a
// programming error like a transition to an unknown step: the instance
// fails on the first run, and durabletest fails the test naming the step.
func TestUnencodableStateFailsAtOnceAndIsFlagged(t *testing.T) {
	type reading struct {
		Value float64 `json:"value"`
	}
	var runs int
	wf := durable.NewWorkflow[reading]("measure", "read", durable.WorkflowOptions{})
	wf.Step("read", func(ctx steps.Context, s reading) (transitions.Transition, error) {
		runs++
		s.Value = math.NaN()
		return transitions.Next("store", s), nil
	})
	wf.Step("store", func(ctx steps.Context, s reading) (transitions.Transition, error) { return transitions.Done("ok"), nil })
	rec := &errorsT{TB: t}
	env := durabletest.New(rec, durabletest.Options{}, wf)
	id := env.Insert("measure", reading{}, durable.InsertOptions{})
	in := env.RunUntilDone(id)
	require.Equal(t, store.StatusFailed, in.Status)
	require.Equal(t, 1, runs, "not retried: the step's side effects ran once")
	require.Contains(t, in.LastError, `step "read"`)
	require.Contains(t, in.LastError, "NaN")
	require.Len(t, rec.errs, 1, "durabletest flags it on the first run")
	require.Contains(t, rec.errs[0], `at step "read"`)
	require.Contains(t, rec.errs[0], "cannot be encoded")
	h := env.History(id)
	require.Len(t, h, 1)
	require.Equal(t, durable.OutcomeInvalidTransition, h[0].Outcome)
}

func TestInsertManyInsertsInOrder(t *testing.T) {
	env := durabletest.New(t, durabletest.Options{}, pipeline())
	ids := env.InsertMany(
		durable.InsertRequest{Workflow: "pipeline", State: job{Done: []string{"first"}}, Options: durable.InsertOptions{Key: gate.Identity("account", "1")}},
		durable.InsertRequest{Workflow: "pipeline", State: job{Done: []string{"second"}}, Options: durable.InsertOptions{Key: gate.Identity("account", "1")}},
		durable.InsertRequest{Workflow: "pipeline", State: job{Done: []string{"later"}}, Options: durable.InsertOptions{Delay: time.Hour}},
	)
	require.Len(t, ids, 3)
	assert.Equal(t, []string{"first"}, durabletest.State[job](env, ids[0]).Done)
	assert.Equal(t, []string{"second"}, durabletest.State[job](env, ids[1]).Done)
	env.RunUntilIdle()
	assert.Equal(t, store.StatusAwaiting, env.Get(ids[0]).Status)
	assert.Equal(t, store.StatusAwaiting, env.Get(ids[1]).Status)
	assert.Equal(t, 1, env.MaxConcurrency("account:1"))
	assert.Equal(t, []string{"a", "b"}, env.StepNames(ids[0]))
	assert.Empty(t, env.StepNames(ids[2]), "the delayed row waits for its time")
	env.Advance(time.Hour)
	assert.Equal(t, []string{"a", "b"}, env.StepNames(ids[2]))
}

// flakyTrace runs instances whose step fails twice under the default retry
// policy (1s, 2s ± 20% jitter) and returns when each step ran.
func flakyTrace(t *testing.T, opts durabletest.Options) []string {
	wf := durable.NewWorkflow[int]("flaky", "call", durable.WorkflowOptions{})
	wf.Step("call", func(ctx steps.Context, n int) (transitions.Transition, error) {
		if ctx.Attempt() < 2 {
			return transitions.Transition{}, fmt.Errorf("503 on attempt %d", ctx.Attempt())
		}
		return transitions.Done(n), nil
	})
	env := durabletest.New(t, opts, wf)
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, env.Insert("flaky", i, durable.InsertOptions{}))
	}
	var trace []string
	for i, id := range ids {
		env.RunUntilDone(id)
		for _, h := range env.History(id) {
			trace = append(trace, fmt.Sprintf("%d:%d@%s", i, h.Attempt, h.StartedAt.Sub(durabletest.Epoch)))
		}
	}
	return append(trace, "end@"+env.Clock.Now().Sub(durabletest.Epoch).String())
}

func TestRetryJitterIsSeeded(t *testing.T) {
	first := flakyTrace(t, durabletest.Options{})
	require.Len(t, first, 10, "3 instances × 3 runs, and the end time")
	assert.Equal(t, first, flakyTrace(t, durabletest.Options{}), "the same test gives the same virtual times")
	assert.Equal(t, first, flakyTrace(t, durabletest.Options{Seed: 1}), "the default seed is 1")
	other := flakyTrace(t, durabletest.Options{Seed: 7})
	assert.NotEqual(t, first, other, "another seed, other retry times")
	assert.Equal(t, other, flakyTrace(t, durabletest.Options{Seed: 7}))
}
