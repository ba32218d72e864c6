package durable_test

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

// A burst of debounced inserts runs the workflow once, with the burst's
// last state, Period after the last insert; an insert after it started
// starts a new instance.
func TestDebounce(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := waitCtx(t)
		var mu sync.Mutex
		var ran []int
		var at []time.Time
		wf := durable.NewWorkflow[counter]("reindex", "run", durable.WorkflowOptions{})
		wf.Step("run", func(ctx steps.Context, s counter) (transitions.Transition, error) {
			mu.Lock()
			ran, at = append(ran, s.N), append(at, time.Now())
			mu.Unlock()
			return transitions.Done(s.N), nil
		})
		e := newEngine(t, durable.Config{Store: st}, wf)
		start(t, e)
		// A period well above the burst's 150 ms, so that a loaded machine
		// that stalls between two inserts does not end the burst early.
		const period = time.Second
		opts := durable.InsertOptions{Debounce: durable.Debounce{Key: "doc:1", Period: period, MaxWait: 5 * time.Second}}
		var id string
		var last time.Time
		for n := 1; n <= 5; n++ {
			last = time.Now() // the insert's now is not earlier
			got, err := wf.Insert(ctx, e, counter{N: n}, opts)
			require.NoError(t, err)
			if id == "" {
				id = got
			}
			require.Equal(t, id, got, "one pending instance for the burst")
			time.Sleep(30 * time.Millisecond)
		}
		res, err := durable.Result[int](ctx, e, id)
		require.NoError(t, err)
		assert.Equal(t, 5, res, "the burst's last state")
		mu.Lock()
		require.Equal(t, []int{5}, ran)
		assert.GreaterOrEqual(t, at[0].Sub(last), period, "not before the quiet period's end")
		mu.Unlock()

		again, err := wf.Insert(ctx, e, counter{N: 6}, opts)
		require.NoError(t, err)
		assert.NotEqual(t, id, again, "after the start, a new pending instance")
		res, err = durable.Result[int](ctx, e, again)
		require.NoError(t, err)
		assert.Equal(t, 6, res)

		_, err = wf.Insert(ctx, e, counter{}, durable.InsertOptions{UniqueKey: "u", Debounce: durable.Debounce{Key: "k", Period: time.Second}})
		require.ErrorIs(t, err, durable.ErrInvalidInput)
		_, err = wf.Insert(ctx, e, counter{}, durable.InsertOptions{Debounce: durable.Debounce{Key: "k"}})
		require.ErrorIs(t, err, durable.ErrInvalidInput, "no period")
	})
}
