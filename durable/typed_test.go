package durable_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

type greeting struct {
	Name string `json:"name"`
}

func greetWorkflow(version int) *durable.Workflow[greeting] {
	return durable.NewWorkflow[greeting]("greet", "hello", durable.WorkflowOptions{Version: version}).
		Step("hello", func(ctx steps.Context, g greeting) (transitions.Transition, error) {
			return transitions.Done("hello " + g.Name), nil
		})
}

func TestWorkflowHandleInsertsTypedStates(t *testing.T) {
	wf := greetWorkflow(1)
	e := newEngine(t, durable.Config{}, wf)
	start(t, e)
	ctx := waitCtx(t)

	id, err := wf.Insert(ctx, e, greeting{Name: "ada"}, durable.InsertOptions{Key: gate.Identity("person", "ada")})
	require.NoError(t, err)
	msg, err := durable.Result[string](ctx, e, id)
	require.NoError(t, err)
	assert.Equal(t, "hello ada", msg)

	ids, err := wf.InsertMany(ctx, e, []durable.TypedRequest[greeting]{
		{State: greeting{Name: "bob"}},
		{State: greeting{Name: "cy"}, Options: durable.InsertOptions{Priority: 1}},
	})
	require.NoError(t, err)
	require.Len(t, ids, 2)
	for i, want := range []string{"hello bob", "hello cy"} {
		msg, err := durable.Result[string](ctx, e, ids[i])
		require.NoError(t, err)
		assert.Equal(t, want, msg)
	}
}

func TestWorkflowHandleRefusesAnEngineItIsNotRegisteredOn(t *testing.T) {
	registered, stranger := greetWorkflow(1), greetWorkflow(1)
	e := newEngine(t, durable.Config{}, registered)
	ctx := waitCtx(t)

	_, err := stranger.Insert(ctx, e, greeting{Name: "x"}, durable.InsertOptions{})
	require.ErrorIs(t, err, durable.ErrUnknownWorkflow, "a definition with the same name but not registered is refused")
	assert.Contains(t, err.Error(), "call Register")

	other := newEngine(t, durable.Config{})
	_, err = registered.InsertMany(ctx, other, []durable.TypedRequest[greeting]{{State: greeting{Name: "x"}}})
	require.ErrorIs(t, err, durable.ErrUnknownWorkflow)

	_, err = registered.Insert(ctx, nil, greeting{}, durable.InsertOptions{})
	require.Error(t, err)

	all, err := e.Store().List(ctx, store.ListFilter{})
	require.NoError(t, err)
	assert.Empty(t, all, "nothing was inserted")
}

func TestWorkflowHandleOfAnOldVersionIsRefused(t *testing.T) {
	v1, v2 := greetWorkflow(1), greetWorkflow(2)
	e := newEngine(t, durable.Config{}, v1, v2)
	ctx := waitCtx(t)

	_, err := v1.Insert(ctx, e, greeting{Name: "old"}, durable.InsertOptions{})
	require.ErrorIs(t, err, durable.ErrNotLatestVersion)
	assert.Contains(t, err.Error(), "version 2")

	id, err := v2.Insert(ctx, e, greeting{Name: "new"}, durable.InsertOptions{})
	require.NoError(t, err)
	inst, err := e.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, 2, inst.Version)
}

func TestInsertTxNeedsAStoreThatInsertsInTransactions(t *testing.T) {
	wf := greetWorkflow(1)
	e := newEngine(t, durable.Config{}, wf) // in-memory store
	ctx := waitCtx(t)

	_, err := e.InsertTx(ctx, nil, "greet", greeting{Name: "x"}, durable.InsertOptions{})
	require.ErrorIs(t, err, durable.ErrNoTxInsert)
	assert.Contains(t, err.Error(), "store/postgres")
	_, err = wf.InsertTx(ctx, e, nil, greeting{Name: "x"}, durable.InsertOptions{})
	require.ErrorIs(t, err, durable.ErrNoTxInsert)
}
