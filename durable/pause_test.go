package durable_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/transitions"
)

// A paused queue starts no step on any engine, one started after the pause
// included; a step running at the pause finishes; Health lists the queue
// with its waiting rows; a resume drains it.
func TestPausedQueueStartsNoStepUntilResumed(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := waitCtx(t)
		var started atomic.Int64
		entered, release := make(chan struct{}, 1), make(chan struct{})
		wf := durable.NewWorkflow[counter]("mail.send", "run", durable.WorkflowOptions{Queue: "mail"})
		wf.Step("run", func(ctx steps.Context, s counter) (transitions.Transition, error) {
			started.Add(1)
			if s.N == 1 {
				entered <- struct{}{}
				<-release
			}
			return transitions.Done(s.N), nil
		})
		e := newEngine(t, durable.Config{Store: st, Queues: map[string]int{"mail": 2}}, wf)
		start(t, e)
		long, err := wf.Insert(ctx, e, counter{N: 1}, durable.InsertOptions{})
		require.NoError(t, err)
		<-entered

		require.NoError(t, e.PauseQueue(ctx, "mail"))
		require.NoError(t, e.PauseQueue(ctx, "mail"), "pausing a paused queue is no error")
		time.Sleep(30 * time.Millisecond) // three poll intervals: every claim after this one sees the pause
		var ids []string
		for range 3 {
			id, err := wf.Insert(ctx, e, counter{}, durable.InsertOptions{})
			require.NoError(t, err)
			ids = append(ids, id)
		}
		// An engine started during the pause (a restart) keeps it too.
		other := newEngine(t, durable.Config{Store: st, Queues: map[string]int{"mail": 2}}, wf)
		start(t, other)

		close(release)
		_, err = e.Wait(ctx, long)
		require.NoError(t, err, "the step running at the pause finishes")
		time.Sleep(100 * time.Millisecond)
		assert.Equal(t, int64(1), started.Load(), "no step started during the pause")
		for _, id := range ids {
			in, err := e.Get(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, store.StatusReady, in.Status)
		}
		paused, err := e.PausedQueues(ctx)
		require.NoError(t, err)
		require.Len(t, paused, 1)
		assert.Equal(t, "mail", paused[0].Queue)
		h, err := e.Health(ctx)
		require.NoError(t, err)
		require.Len(t, h.PausedQueues, 1)
		assert.Equal(t, "mail", h.PausedQueues[0].Queue)
		assert.Equal(t, int64(3), h.PausedQueues[0].Ready, "its waiting rows")

		require.NoError(t, other.ResumeQueue(ctx, "mail"))
		for _, id := range ids {
			_, err := e.Wait(ctx, id)
			require.NoError(t, err)
		}
		assert.Equal(t, int64(4), started.Load())
		h, err = e.Health(ctx)
		require.NoError(t, err)
		assert.Empty(t, h.PausedQueues)
	})
}

// ExampleEngine_PauseQueue stops a queue's work fleet-wide without a
// deploy, and resumes it.
func ExampleEngine_PauseQueue() {
	ctx := context.Background()
	eng, err := durable.New(durable.Config{Store: memory.New(memory.Options{})}) // in memory; see store/postgres
	if err != nil {
		panic(err)
	}
	// Stored: every engine of the fleet stops starting steps of mail at
	// its next claim, and a restart keeps it paused.
	if err := eng.PauseQueue(ctx, "mail"); err != nil {
		panic(err)
	}
	h, err := eng.Health(ctx)
	if err != nil {
		panic(err)
	}
	for _, q := range h.PausedQueues {
		fmt.Println("paused:", q.Queue, "waiting:", q.Ready+q.Scheduled+q.Blocked)
	}
	if err := eng.ResumeQueue(ctx, "mail"); err != nil {
		panic(err)
	}
	paused, err := eng.PausedQueues(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("paused after the resume:", len(paused))
	// Output:
	// paused: mail waiting: 0
	// paused after the resume: 0
}
