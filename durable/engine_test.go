package durable_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/enginetest"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/transitions"
)

type counter struct {
	N int `json:"n"`
}

func fastRetry(n int) steps.RetryPolicy {
	return steps.RetryPolicy{MaxAttempts: n, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, RandomizationFactor: -1}
}

func newEngine(t *testing.T, cfg durable.Config, defs ...durable.Definition) *durable.Engine {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 10 * time.Millisecond
	}
	if cfg.Store == nil {
		cfg.Store = memory.New(memory.Options{})
	}
	e, err := durable.New(cfg)
	require.NoError(t, err)
	require.NoError(t, e.Register(defs...))
	return e
}

func start(t *testing.T, e *durable.Engine) {
	t.Helper()
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = e.Stop(ctx)
	})
}

func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func counterWorkflow() *durable.Workflow[counter] {
	wf := durable.NewWorkflow[counter]("count", "inc", durable.WorkflowOptions{Retry: fastRetry(3)})
	wf.Step("inc", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		s.N++
		if s.N < 3 {
			return transitions.Next("inc", s), nil
		}
		return transitions.Done(s.N), nil
	})
	return wf
}

func TestEngineRunsToDone(t *testing.T) {
	e := newEngine(t, durable.Config{}, counterWorkflow())
	start(t, e)
	ctx := waitCtx(t)
	id, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Identity("account", "1")})
	require.NoError(t, err)
	n, err := durable.Result[int](ctx, e, id)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	in, err := e.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "account:1", in.Key, "the key persists across steps")
	h, err := e.Store().History(ctx, id)
	require.NoError(t, err)
	require.Len(t, h, 3)
	assert.Equal(t, "done", h[2].Outcome)
}

func TestStressMemoryThreeEngines(t *testing.T) {
	st := memory.New(memory.Options{})
	enginetest.Stress(t, func() store.Store { return st }, enginetest.StressOptions{
		Engines: 3, Instances: 600, AcctKeys: 20, APIKeys: 4, Executors: 8, Timeout: 60 * time.Second,
	})
}

func TestPanicIsCaughtRetriedAndFails(t *testing.T) {
	var logs bytes.Buffer
	var runs atomic.Int32
	wf := durable.NewWorkflow[counter]("boom", "explode", durable.WorkflowOptions{Retry: fastRetry(3)})
	wf.Step("explode", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		runs.Add(1)
		panic("kaboom")
	})
	e := newEngine(t, durable.Config{Logger: textLogger(&logs)}, wf, counterWorkflow())
	start(t, e)
	ctx := waitCtx(t)
	id, err := e.Insert(ctx, "boom", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	other, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	_, err = durable.Result[int](ctx, e, id)
	require.ErrorIs(t, err, durable.ErrFailed)
	assert.Contains(t, err.Error(), "panic: kaboom")
	assert.Equal(t, int32(3), runs.Load(), "MaxAttempts 3: three runs, then stop")
	n, err := durable.Result[int](ctx, e, other)
	require.NoError(t, err, "a panicking workflow does not disturb others")
	assert.Equal(t, 3, n)
	assert.Contains(t, logs.String(), "engine_test.go", "the panic is logged with its stack")
	h, err := e.Store().History(ctx, id)
	require.NoError(t, err)
	require.Len(t, h, 3)
	assert.Equal(t, "panic", h[0].Outcome)
	assert.Equal(t, []int{0, 1, 2}, []int{h[0].Attempt, h[1].Attempt, h[2].Attempt})
}

func TestStateThatDoesNotDecodeFailsOnlyThatInstance(t *testing.T) {
	e := newEngine(t, durable.Config{}, counterWorkflow())
	start(t, e)
	ctx := waitCtx(t)
	bad, err := e.Insert(ctx, "count", map[string]string{"n": "not a number"}, durable.InsertOptions{})
	require.NoError(t, err)
	good, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	in, err := e.Wait(ctx, bad)
	require.NoError(t, err)
	assert.Equal(t, store.StatusFailed, in.Status)
	assert.Contains(t, in.LastError, "decode state")
	assert.Equal(t, 0, in.Attempt, "a decode error is not retried")
	_, err = durable.Result[int](ctx, e, good)
	require.NoError(t, err)
}

func TestInsertRejectsBadInputAndInsertsNothing(t *testing.T) {
	st := memory.New(memory.Options{})
	e := newEngine(t, durable.Config{Store: st, MaxPayloadBytes: 64}, counterWorkflow())
	ctx := waitCtx(t)

	_, err := e.Insert(ctx, "nope", counter{}, durable.InsertOptions{})
	assert.ErrorIs(t, err, durable.ErrUnknownWorkflow)

	_, err = e.InsertMany(ctx, []durable.InsertRequest{
		{Workflow: "count", State: counter{}},
		{Workflow: "count", State: map[string]any{"ch": make(chan int)}},
	})
	assert.ErrorIs(t, err, durable.ErrEncode)

	_, err = e.Insert(ctx, "count", map[string]string{"big": string(make([]byte, 100))}, durable.InsertOptions{})
	assert.ErrorIs(t, err, durable.ErrPayloadTooLarge)

	_, err = e.Insert(ctx, "count", counter{}, durable.InsertOptions{ID: "not-a-uuid"})
	assert.Error(t, err)

	all, err := st.List(ctx, store.ListFilter{Limit: 100})
	require.NoError(t, err)
	assert.Empty(t, all, "a failed insert inserts nothing, not even the valid rows of its batch")
}

func TestStrictModeRefusesPrefixCapture(t *testing.T) {
	ctx := waitCtx(t)
	strict := newEngine(t, durable.Config{Strict: true, Limits: []gate.Limit{{Name: "order", Limit: 5}}}, counterWorkflow())
	_, err := strict.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Identity("order", "42")})
	assert.ErrorIs(t, err, gate.ErrPrefixCapture)
	_, err = strict.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Gate("stripe", "t")})
	assert.ErrorIs(t, err, gate.ErrPrefixCapture, "a gate key with no limit runs at K = 1")
	_, err = strict.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Identity("account", "1")})
	assert.NoError(t, err)

	var logs bytes.Buffer
	lax := newEngine(t, durable.Config{WorkerID: "lax-worker", Limits: []gate.Limit{{Name: "order", Limit: 5}}, Logger: textLogger(&logs)}, counterWorkflow())
	for i := 0; i < 3; i++ {
		_, err = lax.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Identity("order", "42")})
		require.NoError(t, err)
	}
	assert.Equal(t, 1, bytes.Count(logs.Bytes(), []byte("prefix capture")), "warned once per name")
	assert.NotContains(t, logs.String(), "42", "no key ids in logs above debug")
	require.Len(t, lax.Warnings(), 1)
	assert.Equal(t, gate.IdentityCaptured, lax.Warnings()[0].Kind)
}

func TestStrictStartRefusesLimitChangeOnLiveKeys(t *testing.T) {
	ctx := waitCtx(t)
	st := memory.New(memory.Options{})
	first := newEngine(t, durable.Config{Store: st, Limits: []gate.Limit{{Name: "api", Limit: 2}}}, counterWorkflow())
	require.NoError(t, first.Start(ctx))
	require.NoError(t, first.Stop(ctx))
	_, err := first.Store().Insert(ctx, []store.NewInstance{{ID: "6f1c1f8e-8a7e-4c41-9d5a-0b3a1b7f3c11", Workflow: "count", Version: 1, Queue: "other", Step: "inc", State: json.RawMessage(`{}`), Key: "api:1"}})
	require.NoError(t, err)
	second := newEngine(t, durable.Config{Store: st, Strict: true, Limits: []gate.Limit{{Name: "api", Limit: 9}}}, counterWorkflow())
	err = second.Start(ctx)
	require.ErrorIs(t, err, gate.ErrPrefixCapture)
	assert.Contains(t, err.Error(), "1 live")
	ls, err := st.Limits(ctx)
	require.NoError(t, err)
	require.Len(t, ls, 1)
	assert.Equal(t, 2, ls[0].Limit, "a refused change is not stored")

	var logs bytes.Buffer
	lax := newEngine(t, durable.Config{Store: st, Limits: []gate.Limit{{Name: "api", Limit: 9}}, Logger: textLogger(&logs), Queues: map[string]int{"unused": 1}}, counterWorkflow())
	require.NoError(t, lax.Start(ctx))
	require.NoError(t, lax.Stop(ctx))
	assert.Contains(t, logs.String(), "live_instances=1")
	assert.Contains(t, logs.String(), "name=api")
}

func TestSignalErrors(t *testing.T) {
	e := newEngine(t, durable.Config{}, counterWorkflow())
	start(t, e)
	ctx := waitCtx(t)
	err := e.Signal(ctx, "6f1c1f8e-8a7e-4c41-9d5a-0b3a1b7f3c11", "x", nil, durable.SignalOptions{})
	assert.ErrorIs(t, err, store.ErrNotFound)
	id, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	_, err = e.Wait(ctx, id)
	require.NoError(t, err)
	err = e.Signal(ctx, id, "x", nil, durable.SignalOptions{})
	assert.ErrorIs(t, err, store.ErrTerminal)
	assert.ErrorIs(t, e.Cancel(ctx, id, durable.CancelOptions{}), store.ErrTerminal)
}

func TestAwaitSignalAndTimeout(t *testing.T) {
	wf := durable.NewWorkflow[counter]("wait", "park", durable.WorkflowOptions{})
	wf.Step("park", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		return transitions.Await("go", "woke", s, transitions.Timeout(300*time.Millisecond)), nil
	})
	wf.Step("woke", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		if sig, ok := ctx.Signal(); ok {
			var p counter
			if err := sig.Decode(&p); err != nil {
				return transitions.Transition{}, err
			}
			return transitions.Done(p.N), nil
		}
		if ctx.TimedOut() {
			return transitions.Done(-1), nil
		}
		return transitions.Stop("woke with neither signal nor timeout"), nil
	})
	e := newEngine(t, durable.Config{}, wf)
	start(t, e)
	ctx := waitCtx(t)
	early, err := e.Insert(ctx, "wait", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	require.NoError(t, e.Signal(ctx, early, "go", counter{N: 7}, durable.SignalOptions{}), "a signal sent before the await is kept")
	n, err := durable.Result[int](ctx, e, early)
	require.NoError(t, err)
	assert.Equal(t, 7, n)

	// The timeout counts from the flush of the step that awaits, which
	// can come before Insert returns here: the clock starts before Insert.
	began := time.Now()
	late, err := e.Insert(ctx, "wait", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	n, err = durable.Result[int](ctx, e, late)
	require.NoError(t, err)
	assert.Equal(t, -1, n, "the await timed out")
	assert.GreaterOrEqual(t, time.Since(began), 300*time.Millisecond)
}

func TestStopTwiceAndCallsAfterStop(t *testing.T) {
	e := newEngine(t, durable.Config{}, counterWorkflow())
	ctx := waitCtx(t)
	require.NoError(t, e.Start(ctx))
	require.Error(t, e.Start(ctx), "start twice")
	require.NoError(t, e.Stop(ctx))
	require.NoError(t, e.Stop(ctx), "stop twice is harmless")
	_, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{})
	assert.ErrorIs(t, err, durable.ErrStopped)
	assert.ErrorIs(t, e.Signal(ctx, "x", "y", nil, durable.SignalOptions{}), durable.ErrStopped)
	assert.ErrorIs(t, e.Start(ctx), durable.ErrStopped)
}

func TestStopDeadlineReleasesRunningClaims(t *testing.T) {
	started := make(chan struct{}, 1)
	wf := durable.NewWorkflow[counter]("slow", "block", durable.WorkflowOptions{})
	wf.Step("block", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		started <- struct{}{}
		<-ctx.Done()
		return transitions.Transition{}, ctx.Err()
	})
	e := newEngine(t, durable.Config{Queues: map[string]int{"default": 1}}, wf)
	ctx := waitCtx(t)
	require.NoError(t, e.Start(ctx))
	id, err := e.Insert(ctx, "slow", counter{}, durable.InsertOptions{Key: gate.Identity("account", "1")})
	require.NoError(t, err)
	<-started
	stopCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err = e.Stop(stopCtx)
	require.Error(t, err, "the deadline passed with a step running")
	in, err := e.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, store.StatusReady, in.Status, "the cut-short claim went back")
	assert.Equal(t, 0, in.Attempt, "shutdown is not the step's fault")
	info, err := e.Store().KeyInfo(ctx, "account:1")
	require.NoError(t, err)
	assert.Empty(t, info.Holders, "its key is free")
}

func TestErrorHandlerOverride(t *testing.T) {
	var calls atomic.Int32
	wf := durable.NewWorkflow[counter]("custom", "fail", durable.WorkflowOptions{
		OnError: func(ctx steps.Context, err error) (time.Duration, bool) {
			calls.Add(1)
			return time.Millisecond, ctx.Attempt() < 1
		},
	})
	wf.Step("fail", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		return transitions.Transition{}, errors.New("nope")
	})
	e := newEngine(t, durable.Config{}, wf)
	start(t, e)
	ctx := waitCtx(t)
	id, err := e.Insert(ctx, "custom", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	in, err := e.Wait(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, store.StatusFailed, in.Status)
	assert.Equal(t, "nope", in.LastError)
	assert.Equal(t, int32(2), calls.Load())
}

// textLogger logs as text into w without timestamps, so that a search of the
// logs for a number never matches the clock.
func textLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
}

func TestWallClockMemory(t *testing.T) {
	enginetest.WallClock(t, enginetest.WallClockOptions{
		NewStore: func(t *testing.T) store.Store { return memory.New(memory.Options{}) },
	})
}

func TestRegisterAfterStartIsAnError(t *testing.T) {
	e := newEngine(t, durable.Config{}, counterWorkflow())
	start(t, e)
	wf := durable.NewWorkflow[counter]("late", "a", durable.WorkflowOptions{})
	wf.Step("a", func(ctx steps.Context, s counter) (transitions.Transition, error) { return transitions.Done(nil), nil })
	err := e.Register(wf)
	require.ErrorIs(t, err, durable.ErrStarted)
	_, err = e.Insert(t.Context(), "late", counter{}, durable.InsertOptions{})
	require.ErrorIs(t, err, durable.ErrUnknownWorkflow, "a refused registration leaves nothing behind")
}

// slowSyncStore holds Start inside its limit sync until released.
type slowSyncStore struct {
	store.Store
	entered, release chan struct{}
}

func (s *slowSyncStore) SyncKeyLimits(ctx context.Context, ns string, want store.KeyLimits, opts store.SyncOptions) (store.LimitsResult, error) {
	close(s.entered)
	<-s.release
	return s.Store.SyncKeyLimits(ctx, ns, want, opts)
}

func TestStopDuringStartWins(t *testing.T) {
	st := &slowSyncStore{Store: memory.New(memory.Options{}), entered: make(chan struct{}), release: make(chan struct{})}
	e := newEngine(t, durable.Config{Store: st, Limits: []gate.Limit{{Name: "api", Limit: 2}}}, counterWorkflow())
	started := make(chan error, 1)
	go func() { started <- e.Start(context.Background()) }()
	<-st.entered
	require.NoError(t, e.Stop(context.Background()))
	close(st.release)
	require.ErrorIs(t, <-started, durable.ErrStopped, "Start must not bring up an engine stopped meanwhile")
	_, err := e.Insert(context.Background(), "count", counter{}, durable.InsertOptions{})
	require.ErrorIs(t, err, durable.ErrStopped)
	ids, err := st.List(context.Background(), store.ListFilter{})
	require.NoError(t, err)
	require.Empty(t, ids)
}

// A worker whose clock runs ahead of the store's (by an hour here) still
// runs Next, Retry, Sleep and await timeouts on time: their run times are
// delays on the store's clock, not times of the worker's.
func TestRunTimesUseTheStoresClock(t *testing.T) {
	st := memory.New(memory.Options{Clock: func() time.Time { return time.Now().Add(-time.Hour) }})
	var tries atomic.Int32
	wf := durable.NewWorkflow[counter]("skewed", "a", durable.WorkflowOptions{})
	wf.Step("a", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		return transitions.Next("b", s), nil
	})
	wf.Step("b", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		if tries.Add(1) < 2 {
			return transitions.Retry(s, 20*time.Millisecond), nil
		}
		return transitions.Sleep(20*time.Millisecond, "c", s), nil
	})
	wf.Step("c", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		return transitions.Await("never", "d", s, transitions.Timeout(50*time.Millisecond)), nil
	})
	wf.Step("d", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		return transitions.Done(ctx.TimedOut()), nil
	})
	e := newEngine(t, durable.Config{Store: st, ReaperInterval: 20 * time.Millisecond}, wf)
	start(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := e.Insert(ctx, "skewed", counter{}, durable.InsertOptions{Delay: 10 * time.Millisecond})
	require.NoError(t, err)
	timedOut, err := durable.Result[bool](ctx, e, id)
	require.NoError(t, err, "the instance stalled: a run time was taken from the worker's clock")
	require.True(t, timedOut)
}

// TestJitterDrawsRetryDelaysFromConfig: a Config.Jitter source decides the
// jitter of the default retry policy, so retry times are reproducible.
func TestJitterDrawsRetryDelaysFromConfig(t *testing.T) {
	retryAt := func(jitter float64) time.Time {
		clock := fixedClock{}
		st := memory.New(memory.Options{Clock: clock.Now})
		e, err := durable.New(durable.Config{Store: st, Clock: clock, Logger: slog.New(slog.DiscardHandler),
			Jitter: func() float64 { return jitter }})
		require.NoError(t, err)
		wf := durable.NewWorkflow[int]("fails", "s", durable.WorkflowOptions{}) // default policy: 1s ± 20%
		wf.Step("s", func(ctx steps.Context, n int) (transitions.Transition, error) {
			return transitions.Transition{}, errors.New("boom")
		})
		require.NoError(t, e.Register(wf))
		id, err := e.Insert(t.Context(), "fails", 0, durable.InsertOptions{})
		require.NoError(t, err)
		rep, err := e.Tick(t.Context())
		require.NoError(t, err)
		require.Len(t, rep.Outcomes, 1)
		in, err := e.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, 1, in.Attempt)
		return in.RunAt
	}
	start := fixedClock{}.Now()
	assert.Equal(t, start.Add(800*time.Millisecond), retryAt(0), "the low end of 1s ± 20%")
	assert.Equal(t, start.Add(time.Second), retryAt(0.5))
	assert.Equal(t, start.Add(1100*time.Millisecond), retryAt(0.75))
}

// TestInstanceErrorsSayOpAndIDOnce: an error about one instance names the
// operation and the id once (not the engine's and the store's prefix both),
// calls an id that is not a UUID what it is, and still wraps the store's
// sentinel.
func TestInstanceErrorsSayOpAndIDOnce(t *testing.T) {
	ctx := waitCtx(t)
	e := newEngine(t, durable.Config{Store: memory.New(memory.Options{})})
	missing := "6f1c1f8e-8a7e-4c41-9d5a-0b3a1b7f3c11"

	_, err := e.Get(ctx, missing)
	require.ErrorIs(t, err, store.ErrNotFound)
	assert.EqualError(t, err, "durable: get "+missing+": instance not found")
	assert.EqualError(t, e.Cancel(ctx, missing, durable.CancelOptions{}), "durable: cancel "+missing+": instance not found")
	assert.EqualError(t, e.Retry(ctx, missing), "durable: retry "+missing+": instance not found")
	err = e.Signal(ctx, missing, "paid", nil, durable.SignalOptions{})
	require.ErrorIs(t, err, store.ErrNotFound)
	assert.EqualError(t, err, "durable: signal paid to "+missing+": instance not found")

	for _, id := range []string{"", "xyz"} {
		_, err := e.Get(ctx, id)
		require.ErrorIs(t, err, store.ErrNotFound)
		assert.EqualError(t, err, `durable: get: "`+id+`" is not an instance id (a UUID)`)
	}
}

// refusingStore refuses, as invalid data, every Complete batch that holds a
// non-failure outcome of instance id.
type refusingStore struct {
	store.Store
	id string
}

func (r *refusingStore) Complete(ctx context.Context, w string, outs []store.Outcome, now time.Time) ([]store.OutcomeResult, error) {
	for _, o := range outs {
		if o.ID == r.id && o.Kind != store.OutcomeFailed {
			return nil, fmt.Errorf("%w: the test refuses %s", store.ErrInvalid, o.ID)
		}
	}
	return r.Store.Complete(ctx, w, outs, now)
}

// Tick commits through the same path as the live scheduler: a batch the
// store refuses is split, the other outcomes commit, and the refused one
// fails its instance with the store's reason.
func TestTickSplitsARefusedBatch(t *testing.T) {
	rs := &refusingStore{Store: memory.New(memory.Options{})}
	e := newEngine(t, durable.Config{Store: rs, Queues: map[string]int{durable.DefaultQueue: 10}}, counterWorkflow())
	ctx := context.Background()
	var ids []string
	for range 3 {
		id, err := e.Insert(ctx, "count", counter{N: 2}, durable.InsertOptions{})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	rs.id = ids[1]
	rep, err := e.Tick(ctx)
	require.NoError(t, err, "a refused outcome does not fail the whole round")
	require.Len(t, rep.Outcomes, 3)
	for i, id := range ids {
		in, err := e.Get(ctx, id)
		require.NoError(t, err)
		if i == 1 {
			require.Equal(t, store.StatusFailed, in.Status)
			require.Contains(t, in.LastError, "the store refused this step's outcome")
			continue
		}
		require.Equal(t, store.StatusDone, in.Status)
	}
}

// timerlessStore fails every FireTimers.
type timerlessStore struct{ store.Store }

func (timerlessStore) FireTimers(context.Context, time.Time) (int, error) {
	return 0, errors.New("fire timers: refused by the test")
}

// TestReaperRunsWhenTimersFail: the maintenance sweep's steps fail on their
// own: with every timer sweep failing, a dead worker's expired claim is
// still reaped, and the engine runs it.
func TestReaperRunsWhenTimersFail(t *testing.T) {
	mem := memory.New(memory.Options{})
	st := timerlessStore{mem}
	ctx := waitCtx(t)
	_, err := st.Insert(ctx, []store.NewInstance{{ID: store.NewInstanceID(), Workflow: "count", Version: 1,
		Queue: durable.DefaultQueue, Step: "inc", State: json.RawMessage(`{"n":0}`)}})
	require.NoError(t, err)
	res, err := st.Claim(ctx, store.ClaimRequest{Queue: durable.DefaultQueue, Worker: "dead", Limit: 1, Lease: 50 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	e := newEngine(t, durable.Config{Store: st, ReaperInterval: 20 * time.Millisecond}, counterWorkflow())
	start(t, e)
	in, err := e.Wait(ctx, res.Claimed[0].ID)
	require.NoError(t, err)
	require.Equal(t, store.StatusDone, in.Status)
}
