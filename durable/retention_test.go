package durable_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/transitions"
)

// TestWorkflowRetention: a workflow's own retention deletes its terminal
// instances at the reconciler's sweep once they are older than it, and
// leaves other workflows' (kept for Config.Retention) and its live ones;
// Register refuses a retention longer than Config.Retention or negative.
func TestWorkflowRetention(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := waitCtx(t)
		short := durable.NewWorkflow[counter]("short", "end", durable.WorkflowOptions{Retention: time.Millisecond}).
			Step("end", func(ctx steps.Context, s counter) (transitions.Transition, error) {
				if s.N < 0 {
					return transitions.Await("never", "end", s), nil
				}
				return transitions.Done(s.N), nil
			})
		kept := durable.NewWorkflow[counter]("kept", "end", durable.WorkflowOptions{}).
			Step("end", func(ctx steps.Context, s counter) (transitions.Transition, error) { return transitions.Done(s.N), nil })
		e := newEngine(t, durable.Config{Store: st}, short, kept)
		start(t, e)
		var done, others []string
		for i := range 5 {
			id, err := e.Insert(ctx, "short", counter{N: i}, durable.InsertOptions{})
			require.NoError(t, err)
			done = append(done, id)
			id, err = e.Insert(ctx, "kept", counter{N: i}, durable.InsertOptions{})
			require.NoError(t, err)
			others = append(others, id)
		}
		parked, err := e.Insert(ctx, "short", counter{N: -1}, durable.InsertOptions{})
		require.NoError(t, err)
		for _, id := range append(append([]string{}, done...), others...) {
			_, err := e.Wait(ctx, id)
			require.NoError(t, err)
		}
		require.Eventually(t, func() bool {
			in, err := e.Get(ctx, parked)
			return err == nil && in.Status == store.StatusAwaiting
		}, 5*time.Second, 5*time.Millisecond)
		time.Sleep(20 * time.Millisecond)

		rep, err := e.Reconcile(ctx)
		require.NoError(t, err)
		require.Equal(t, len(done), rep.InstancesDeleted)
		for _, id := range done {
			_, err := e.Get(ctx, id)
			require.ErrorIs(t, err, store.ErrNotFound)
		}
		for _, id := range append(others, parked) {
			_, err := e.Get(ctx, id)
			require.NoError(t, err)
		}
	})

	e, err := durable.New(durable.Config{Store: memory.New(memory.Options{}), Retention: time.Hour})
	require.NoError(t, err)
	long := durable.NewWorkflow[counter]("long", "end", durable.WorkflowOptions{Retention: 2 * time.Hour}).
		Step("end", func(ctx steps.Context, s counter) (transitions.Transition, error) { return transitions.Done(s.N), nil })
	require.ErrorContains(t, e.Register(long), "longer than Config.Retention")
	negative := durable.NewWorkflow[counter]("negative", "end", durable.WorkflowOptions{Retention: -time.Second}).
		Step("end", func(ctx steps.Context, s counter) (transitions.Transition, error) { return transitions.Done(s.N), nil })
	require.ErrorContains(t, e.Register(negative), "negative")
}
