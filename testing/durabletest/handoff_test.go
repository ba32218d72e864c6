package durabletest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

// calls is a one-step workflow whose step records, in ran, the name in
// its state.
func calls(ran *[]string) func() []durable.Definition {
	return func() []durable.Definition {
		wf := durable.NewWorkflow[string]("call", "call", durable.WorkflowOptions{})
		wf.Step("call", func(ctx steps.Context, name string) (transitions.Transition, error) {
			*ran = append(*ran, name)
			return transitions.Done(name), nil
		})
		return []durable.Definition{wf}
	}
}

// ticks runs up to max rounds, until one runs nothing, and returns, per round, the
// names its rows ran under: "name" for a row in a slot of its own, "+name"
// for a successor run in its predecessor's slot.
func ticks(t *testing.T, env *durabletest.Env, names map[string]string, max int) []string {
	var out []string
	for range max {
		rep, err := env.Engine.Tick(context.Background())
		require.NoError(t, err)
		if len(rep.Claimed) == 0 {
			return out
		}
		round := ""
		for _, c := range rep.Claimed {
			round += names[c.ID] + " "
		}
		for _, c := range rep.Chained {
			round += "+" + names[c.ID] + " "
		}
		out = append(out, round)
	}
	return out
}

// TestTicksPassSlotsLikeProduction: a busy gate's slot goes from step to
// step as the live scheduler passes it (a commit hands the freed slot to
// the key's next row, with the row after it reserved as its successor;
// both run in that slot in the next round), and a row of better priority
// that arrives meanwhile takes the slot as soon as the chain running in
// it ends: the order a unit test sees is production's.
func TestTicksPassSlotsLikeProduction(t *testing.T) {
	var ran []string
	opts := durabletest.Options{Limits: []gate.Limit{{Name: "api", Limit: 1}}, Queues: map[string]int{"default": 1}}
	onEveryStore(t, opts, calls(&ran), func(t *testing.T, env *durabletest.Env) []string {
		ran = nil
		names := map[string]string{}
		for i := range 6 {
			name := fmt.Sprintf("a%d", i+1)
			names[env.Insert("call", name, durable.InsertOptions{Key: gate.Gate("api", "a"), Priority: 10})] = name
		}
		rounds := ticks(t, env, names, 1)
		require.Equal(t, []string{"a1 "}, rounds)
		names[env.Insert("call", "urgent", durable.InsertOptions{Priority: 0})] = "urgent"
		// a2 was handed the slot and a3 reserved behind it before the
		// urgent row came; then the slot is credited, not handed to a4,
		// and the urgent row goes first.
		rounds = ticks(t, env, names, 100)
		assert.Equal(t, []string{"a2 +a3 ", "urgent ", "a4 ", "a5 +a6 "}, rounds)
		assert.Equal(t, []string{"a1", "a2", "a3", "urgent", "a4", "a5", "a6"}, ran)
		return append(rounds, ran...)
	})
}

// TestCancelOfARowHandedToTheNextTick: a row a commit handed to the
// engine, and the successor reserved behind it, wait for the next round;
// Cancel gives the row back canceled (it never runs), and its successor
// goes back to its key's line.
func TestCancelOfARowHandedToTheNextTick(t *testing.T) {
	var ran []string
	opts := durabletest.Options{Limits: []gate.Limit{{Name: "api", Limit: 1}}, Queues: map[string]int{"default": 1}}
	onEveryStore(t, opts, calls(&ran), func(t *testing.T, env *durabletest.Env) []string {
		ran = nil
		var ids []string
		for i := range 5 {
			ids = append(ids, env.Insert("call", fmt.Sprintf("a%d", i+1), durable.InsertOptions{Key: gate.Gate("api", "a")}))
		}
		_, err := env.Engine.Tick(context.Background())
		require.NoError(t, err)
		require.Equal(t, []string{"a1"}, ran)
		require.Equal(t, store.StatusExecuting, env.Get(ids[1]).Status, "a2 was handed the slot")
		a3, err := env.Store.Get(context.Background(), ids[2])
		require.NoError(t, err)
		require.NotEmpty(t, a3.Worker, "a3 was reserved behind it")
		env.Cancel(ids[1], durable.CancelOptions{})
		assert.Equal(t, store.StatusCanceled, env.Get(ids[1]).Status)
		env.RunUntilIdle()
		assert.Equal(t, store.StatusCanceled, env.Get(ids[1]).Status)
		assert.Equal(t, []string{"a1", "a3", "a4", "a5"}, ran, "a2 never ran")
		return ran
	})
}
