package durable_test

import (
	"context"
	"fmt"
	"strings"
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

// treeWorkflows are a parent that spawns three children and joins them,
// and a child whose kind (its state's N) is 0: await a signal, 1: sleep
// an hour, 2: run until its context is cancelled (entered is told).
func treeWorkflows(entered chan<- string, joined *atomic.Int64, seen chan<- []steps.Child) (parent, child *durable.Workflow[counter]) {
	child = durable.NewWorkflow[counter]("tree.child", "run", durable.WorkflowOptions{})
	child.Step("run", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		switch s.N {
		case 0:
			return transitions.Await("go", "end", s), nil
		case 1:
			return transitions.Sleep(time.Hour, "end", s), nil
		case 2:
			entered <- ctx.InstanceID()
			<-ctx.Done()
			return transitions.Next("end", s), nil
		}
		return transitions.Done(s.N), nil
	})
	child.Step("end", func(ctx steps.Context, s counter) (transitions.Transition, error) { return transitions.Done(s.N), nil })
	parent = durable.NewWorkflow[counter]("tree.parent", "spawn", durable.WorkflowOptions{})
	parent.Step("spawn", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		var kids []transitions.Child
		for i := range s.N {
			kids = append(kids, transitions.Child{Workflow: "tree.child", State: counter{N: i}})
		}
		return transitions.Spawn(kids, "joined", s), nil
	})
	parent.Step("joined", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		joined.Add(1)
		kids, err := ctx.Children()
		if err != nil {
			return transitions.Transition{}, err
		}
		seen <- kids
		return transitions.Done(len(kids)), nil
	})
	return parent, child
}

// Cancel with Children cancels a parent awaiting its children and every
// child, each by Cancel's rules: the parked ones at once, the running one
// when its step, whose context is cancelled, returns. The parent never
// joins.
func TestCancelTreeCancelsTheParentAndEveryChild(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := waitCtx(t)
		entered := make(chan string, 1)
		var joined atomic.Int64
		parent, child := treeWorkflows(entered, &joined, make(chan []steps.Child, 1))
		e := newEngine(t, durable.Config{Store: st}, parent, child)
		start(t, e)
		pid, err := parent.Insert(ctx, e, counter{N: 3}, durable.InsertOptions{})
		require.NoError(t, err)
		running := <-entered
		var kids []store.Instance
		eventually(t, "the other children park", func() bool {
			kids, err = st.Children(ctx, pid)
			require.NoError(t, err)
			parked := 0
			for _, k := range kids {
				if k.Status == store.StatusAwaiting || (k.Status == store.StatusReady && k.RunAt.After(time.Now())) {
					parked++
				}
			}
			return parked == 2
		})

		require.NoError(t, e.Cancel(ctx, pid, durable.CancelOptions{Children: true}))
		for _, id := range append([]string{pid}, running) {
			in, err := e.Wait(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, store.StatusCanceled, in.Status, id)
		}
		for _, k := range kids {
			in, err := e.Get(ctx, k.ID)
			require.NoError(t, err)
			assert.Equal(t, store.StatusCanceled, in.Status, "child %s", k.ID)
		}
		time.Sleep(50 * time.Millisecond)
		assert.Zero(t, joined.Load(), "a canceled parent never joins")
		require.NoError(t, e.Cancel(ctx, pid, durable.CancelOptions{Children: true}), "a canceled tree: nothing to do, no error")
		err = e.Cancel(ctx, pid, durable.CancelOptions{})
		assert.ErrorIs(t, err, store.ErrTerminal, "without Children, Cancel of a terminal instance is an error as before")
	})
}

// A parent awaiting its children, one of which is canceled, is woken when
// the last of them ends and sees that child canceled.
func TestParentSeesACanceledChild(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := waitCtx(t)
		var joined atomic.Int64
		seen := make(chan []steps.Child, 1)
		parent, child := treeWorkflows(make(chan string, 1), &joined, seen)
		e := newEngine(t, durable.Config{Store: st}, parent, child)
		start(t, e)
		pid, err := parent.Insert(ctx, e, counter{N: 2}, durable.InsertOptions{}) // an awaiting child and a sleeping one
		require.NoError(t, err)
		var kids []store.Instance
		eventually(t, "the children park", func() bool {
			kids, err = st.Children(ctx, pid)
			require.NoError(t, err)
			return len(kids) == 2 && kids[0].Status == store.StatusAwaiting && kids[1].Status == store.StatusReady
		})
		require.NoError(t, e.Signal(ctx, kids[0].ID, "go", nil, durable.SignalOptions{}))
		_, err = e.Wait(ctx, kids[0].ID)
		require.NoError(t, err)
		require.NoError(t, e.Cancel(ctx, kids[1].ID, durable.CancelOptions{}))

		got := <-seen
		require.Len(t, got, 2)
		var statuses []string
		for _, c := range got {
			statuses = append(statuses, c.Status)
		}
		assert.Equal(t, "done canceled", strings.Join(statuses, " "))
		in, err := e.Wait(ctx, pid)
		require.NoError(t, err)
		assert.Equal(t, store.StatusDone, in.Status)
	})
}

// ExampleEngine_Cancel_children cancels a parent and the children it
// spawned.
func ExampleEngine_Cancel_children() {
	ctx := context.Background()
	var joined atomic.Int64
	parent, child := treeWorkflows(make(chan string, 1), &joined, make(chan []steps.Child, 1))
	eng, err := durable.New(durable.Config{Store: memory.New(memory.Options{})}) // in memory; see store/postgres
	if err != nil {
		panic(err)
	}
	if err := eng.Register(parent, child); err != nil {
		panic(err)
	}
	id, err := parent.Insert(ctx, eng, counter{N: 2}, durable.InsertOptions{})
	if err != nil {
		panic(err)
	}
	if _, err := eng.Tick(ctx); err != nil { // the parent spawns its two children
		panic(err)
	}
	if err := eng.Cancel(ctx, id, durable.CancelOptions{Children: true}); err != nil {
		panic(err)
	}
	p, _ := eng.Get(ctx, id)
	fmt.Println("parent:", p.Status)
	kids, _ := eng.Store().Children(ctx, id)
	for _, k := range kids {
		fmt.Println("child:", k.Status)
	}
	// Output:
	// parent: canceled
	// child: canceled
	// child: canceled
}
