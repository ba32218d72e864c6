package durable_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

// A nil Config.Store is an error that says what to pass, not a silent
// in-memory store in production.
func TestStoreIsRequired(t *testing.T) {
	_, err := durable.New(durable.Config{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Config.Store is nil")
	assert.Contains(t, err.Error(), "memory.New")
}

// A step defined twice is an error at Register; StepWith's options are one
// value, so there is no second Options to refuse.
func TestDefinitionMistakesFailRegister(t *testing.T) {
	run := func(ctx steps.Context, c counter) (transitions.Transition, error) { return transitions.Done(c.N), nil }
	twice := durable.NewWorkflow[counter]("twice", "a", durable.WorkflowOptions{}).Step("a", run).Step("a", run)
	e := newEngine(t, durable.Config{})
	err := e.Register(twice)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `step "a" is defined twice`)

	with := durable.NewWorkflow[counter]("with", "a", durable.WorkflowOptions{}).
		Step("a", run).StepWith("a", run, steps.Options{Retry: new(fastRetry(2))})
	err = e.Register(with)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `step "a" is defined twice`)

	require.NoError(t, e.Register(durable.NewWorkflow[counter]("fine", "a", durable.WorkflowOptions{}).
		StepWith("a", run, steps.Options{Retry: new(fastRetry(2))})))
}

// A key built from bad user data (an empty id) does not panic: Insert, a
// transition and a schedule refuse it with an error that wraps
// gate.ErrInvalidKey, and nothing is inserted.
func TestInvalidKeysAreErrorsWhereUsed(t *testing.T) {
	ctx := waitCtx(t)
	userID := "" // as read from a request that lacked it
	bad := gate.Identity("account", userID)
	require.ErrorIs(t, bad.Err(), gate.ErrInvalidKey)

	switched := durable.NewWorkflow[counter]("switch", "a", durable.WorkflowOptions{})
	switched.Step("a", func(ctx steps.Context, c counter) (transitions.Transition, error) {
		return transitions.Next("b", c, transitions.SwitchKey(bad)), nil
	})
	switched.Step("b", func(ctx steps.Context, c counter) (transitions.Transition, error) { return transitions.Done(c.N), nil })
	e := newEngine(t, durable.Config{}, counterWorkflow(), switched)
	start(t, e)

	_, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: bad})
	require.ErrorIs(t, err, gate.ErrInvalidKey)
	all, err := e.Store().List(ctx, store.ListFilter{})
	require.NoError(t, err)
	assert.Empty(t, all, "nothing inserted")

	id, err := e.Insert(ctx, "switch", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	in, err := e.Wait(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, store.StatusFailed, in.Status, "a transition to an invalid key is a programming error")
	assert.Contains(t, in.LastError, "invalid concurrency key")

	_, err = durable.New(durable.Config{Store: e.Store(), Schedules: []durable.Schedule{
		{Name: "s", Workflow: "count", Cron: "@daily", Key: bad}}})
	require.ErrorIs(t, err, gate.ErrInvalidKey)
}

// A Timeout on a transition other than Await is refused at the
// transition: the instance fails at once, naming the mistake, instead of
// the timeout being silently dropped.
func TestTimeoutOnlyOnAwait(t *testing.T) {
	ctx := waitCtx(t)
	wf := durable.NewWorkflow[counter]("sleepy", "a", durable.WorkflowOptions{})
	wf.Step("a", func(ctx steps.Context, c counter) (transitions.Transition, error) {
		return transitions.Sleep(time.Millisecond, "b", c, transitions.Timeout(time.Second)), nil
	})
	wf.Step("b", func(ctx steps.Context, c counter) (transitions.Transition, error) { return transitions.Done(c.N), nil })
	e := newEngine(t, durable.Config{}, wf)
	start(t, e)
	id, err := e.Insert(ctx, "sleepy", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	in, err := e.Wait(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, store.StatusFailed, in.Status)
	assert.Equal(t, 0, in.Attempt, "no retry")
	assert.Contains(t, in.LastError, "has a Timeout, which only an Await takes")
	_, err = durable.Result[int](context.Background(), e, id)
	assert.True(t, errors.Is(err, durable.ErrFailed))
}
