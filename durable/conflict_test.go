package durable_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

// The singleton modes of a unique key: CancelOlder cancels the running
// holder by Cancel's rules (its step keeps the key until it returns) and
// inserts; Replace gives a holder that has not started the new state, and
// is refused with a typed error once it has started.
func TestOnConflict(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := waitCtx(t)
		entered := make(chan int, 4)
		wf := durable.NewWorkflow[counter]("sync", "run", durable.WorkflowOptions{})
		wf.Step("run", func(ctx steps.Context, s counter) (transitions.Transition, error) {
			entered <- s.N
			if s.N == 1 {
				<-ctx.Done() // the older run, until its cancel
				return transitions.Transition{}, ctx.Err()
			}
			return transitions.Done(s.N), nil
		})
		e := newEngine(t, durable.Config{Store: st}, wf)
		start(t, e)
		opts := durable.InsertOptions{Key: gate.Identity("acct", "1"), UniqueKey: "sync:acct:1"}
		old, err := wf.Insert(ctx, e, counter{N: 1}, opts)
		require.NoError(t, err)
		require.Equal(t, 1, <-entered)

		skip, err := wf.Insert(ctx, e, counter{N: 9}, opts)
		require.NoError(t, err)
		assert.Equal(t, old, skip, "Skip: the holder's id")

		_, err = wf.Insert(ctx, e, counter{N: 9}, durable.InsertOptions{UniqueKey: "sync:acct:1", OnConflict: durable.ConflictReplace})
		require.ErrorIs(t, err, store.ErrStarted, "the holder runs: its state is its steps'")
		var ce *store.ConflictError
		require.True(t, errors.As(err, &ce))
		assert.Equal(t, old, ce.Holder)
		assert.Equal(t, store.StatusExecuting, ce.Status)

		opts.OnConflict = durable.ConflictCancelOlder
		newer, err := wf.Insert(ctx, e, counter{N: 2}, opts)
		require.NoError(t, err)
		require.NotEqual(t, old, newer)
		in, err := e.Wait(ctx, old)
		require.NoError(t, err)
		assert.Equal(t, store.StatusCanceled, in.Status)
		got, err := durable.Result[int](ctx, e, newer)
		require.NoError(t, err)
		assert.Equal(t, 2, got, "the newer run, after the older one's step returned")

		// Replace before the holder starts: its queue is paused.
		require.NoError(t, e.PauseQueue(ctx, "default"))
		ropts := durable.InsertOptions{UniqueKey: "digest", OnConflict: durable.ConflictReplace}
		first, err := wf.Insert(ctx, e, counter{N: 3}, ropts)
		require.NoError(t, err)
		second, err := wf.Insert(ctx, e, counter{N: 4}, ropts)
		require.NoError(t, err)
		assert.Equal(t, first, second, "replaced, not inserted")
		require.NoError(t, e.ResumeQueue(ctx, "default"))
		got, err = durable.Result[int](ctx, e, first)
		require.NoError(t, err)
		assert.Equal(t, 4, got, "it ran with the last state")

		_, err = wf.Insert(ctx, e, counter{}, durable.InsertOptions{OnConflict: durable.ConflictReplace})
		require.ErrorIs(t, err, durable.ErrInvalidInput, "no unique key")
		_, err = e.InsertMany(ctx, []durable.InsertRequest{
			{Workflow: "sync", State: counter{}, Options: ropts}, {Workflow: "sync", State: counter{}, Options: ropts}})
		require.ErrorIs(t, err, durable.ErrInvalidInput, "one key replaced twice in a batch")
	})
}
