package durable_test

import (
	"context"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/transitions"
)

// A state the step returns that JSON cannot encode fails the instance on
// its first run, under the default retry policy, with an ERROR log.
func TestUnencodableStateFailsAtOnce(t *testing.T) {
	type reading struct {
		Value float64 `json:"value"`
	}
	ctx := waitCtx(t)
	var logs logBuffer
	var runs sync.Map
	wf := durable.NewWorkflow[reading]("measure", "read", durable.WorkflowOptions{})
	wf.Step("read", func(ctx steps.Context, s reading) (transitions.Transition, error) {
		n, _ := runs.LoadOrStore(ctx.InstanceID(), new(int))
		*n.(*int)++
		if s.Value < 0 {
			return transitions.Done(math.Inf(1)), nil // an unencodable result
		}
		s.Value = math.NaN()
		return transitions.Next("read", s), nil
	})
	e := newEngine(t, durable.Config{Logger: textLogger(&logs)}, wf)
	start(t, e)
	for _, v := range []float64{0, -1} {
		id, err := e.Insert(ctx, "measure", reading{Value: v}, durable.InsertOptions{})
		require.NoError(t, err)
		in, err := e.Wait(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, store.StatusFailed, in.Status)
		assert.Equal(t, 0, in.Attempt, "no retry")
		n, _ := runs.Load(id)
		assert.Equal(t, 1, *n.(*int), "the step ran once")
		assert.Contains(t, in.LastError, `step "read" of measure v1 returned a`)
		assert.Contains(t, in.LastError, "cannot be encoded")
		_, err = durable.Result[string](ctx, e, id)
		require.ErrorIs(t, err, durable.ErrFailed)
	}
	errs := linesWith(logs.String(), "level=ERROR", "a programming error")
	require.Len(t, errs, 2, "%s", logs.String())
	assert.Contains(t, errs[0], "NaN")
	assert.Contains(t, errs[1], "+Inf")
}

// A Stop's reason is the instance's last error and its history row's error.
func TestStopReasonInHistory(t *testing.T) {
	ctx := waitCtx(t)
	st := memory.New(memory.Options{})
	wf := durable.NewWorkflow[counter]("charge", "call", durable.WorkflowOptions{})
	wf.Step("call", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		return transitions.Stop("card declined"), nil
	})
	e := newEngine(t, durable.Config{Store: st}, wf)
	start(t, e)
	id, err := e.Insert(ctx, "charge", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	in, err := e.Wait(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "card declined", in.LastError)
	h, err := st.History(context.Background(), id)
	require.NoError(t, err)
	require.Len(t, h, 1)
	assert.Equal(t, "stop", h[0].Outcome)
	assert.Equal(t, "card declined", h[0].Error)
}
