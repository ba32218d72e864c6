package durabletest_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

type order struct {
	Charges int `json:"charges"`
	Shipped bool
}

// payments counts what the outside world saw: one entry per charge call,
// with the attempt it ran at.
type payments struct{ calls []int }

func orderFlow(p *payments) *durable.Workflow[order] {
	wf := durable.NewWorkflow[order]("order", "charge", durable.WorkflowOptions{})
	wf.Step("charge", func(ctx steps.Context, o order) (transitions.Transition, error) {
		p.calls = append(p.calls, ctx.Attempt())
		o.Charges++
		return transitions.Next("ship", o), nil
	})
	wf.Step("ship", func(ctx steps.Context, o order) (transitions.Transition, error) {
		o.Shipped = true
		return transitions.Done(o), nil
	})
	return wf
}

func TestCrashReRunsTheStepOnceMore(t *testing.T) {
	var p *payments
	flows := func() []durable.Definition {
		p = &payments{}
		return []durable.Definition{orderFlow(p)}
	}
	onEveryStore(t, durabletest.Options{}, flows, func(t *testing.T, env *durabletest.Env) []string {
		env.CrashDuring("charge")
		id := env.Insert("order", order{}, durable.InsertOptions{Key: gate.Identity("customer", "c1")})

		env.RunUntilIdle()
		require.Equal(t, []int{0}, p.calls, "the crashed body ran to its end")
		in := env.Get(id)
		assert.Equal(t, store.StatusExecuting, in.Status, "the lost claim holds until its lease expires")
		assert.Equal(t, []string{id}, holders(env.Key("customer:c1")), "and keeps its key")
		assert.Empty(t, env.History(id), "a crashed run commits no history")

		env.Advance(30 * time.Second)
		assert.Equal(t, []int{0}, p.calls, "not reaped while the lease (30s) holds")

		out := durabletest.Result[order](env, env.RunUntilDone(id).ID)
		assert.Equal(t, []int{0, 1}, p.calls, "the step ran exactly once more, at attempt 1")
		assert.Equal(t, order{Charges: 1, Shipped: true}, out, "state is as if the step ran once: the crashed run's state was lost")
		rerun := durabletest.Epoch.Add(30*time.Second + time.Microsecond)
		assert.True(t, rerun.Equal(env.Clock.Now()), "re-run as the lease ends: %s", env.Clock.Now())
		h := env.History(id)
		require.Len(t, h, 2)
		assert.Equal(t, "charge", h[0].Step)
		assert.Equal(t, 1, h[0].Attempt, "the history shows the re-run's attempt")
		assert.True(t, rerun.Equal(h[0].StartedAt), "%s", h[0].StartedAt)
		assert.Equal(t, "ship", h[1].Step)
		assert.Equal(t, 0, h[1].Attempt, "the next step starts at attempt 0")
		assert.Equal(t, 1, env.Crashes())
		assert.EqualValues(t, 1, env.Engine.StaleOutcomes(), "the lost outcome counts as stale")
		assert.Empty(t, env.Key("customer:c1").Holders)
		return append(transcript(env, id), fmt.Sprint(p.calls))
	})
}

func TestCrashFreesAGateSlotForTheNextInstance(t *testing.T) {
	var p *payments
	flows := func() []durable.Definition {
		p = &payments{}
		return []durable.Definition{orderFlow(p)}
	}
	opts := durabletest.Options{Limits: []gate.Limit{{Name: "psp", Limit: 1}}, Lease: 10 * time.Second}
	onEveryStore(t, opts, flows, func(t *testing.T, env *durabletest.Env) []string {
		env.CrashDuring("charge")
		env.CrashDuring("charge")
		first := env.Insert("order", order{}, durable.InsertOptions{Key: gate.Gate("psp", "stripe")})
		second := env.Insert("order", order{}, durable.InsertOptions{Key: gate.Gate("psp", "stripe")})

		env.RunUntilDone(second)
		assert.Equal(t, store.StatusDone, env.Get(first).Status)
		assert.Equal(t, []int{0, 1, 2, 0}, p.calls, "the first instance crashed twice, then the second ran")
		assert.True(t, durabletest.Epoch.Add(20*time.Second+2*time.Microsecond).Equal(env.Clock.Now()), "two leases of 10s: %s", env.Clock.Now())
		assert.Equal(t, 1, env.MaxConcurrency("psp:stripe"), "the gate held through the crashes")
		assert.Equal(t, 2, env.Crashes())
		assert.Empty(t, env.Key("psp:stripe").Holders, "the reconciler repaired the crashed claims' slot")
		return append(transcript(env, first, second), fmt.Sprint(p.calls))
	})
}

func TestACrashThatNeverHappensFailsTheTest(t *testing.T) {
	rec := &errorsT{TB: t}
	t.Run("test", func(t *testing.T) {
		rec.TB = t
		p := &payments{}
		env := durabletest.New(rec, durabletest.Options{}, orderFlow(p))
		env.CrashDuring("chrage") // misspelt
		env.CrashDuring("ship")
		env.RunUntilDone(env.Insert("order", order{}, durable.InsertOptions{}))
		assert.Equal(t, 1, env.Crashes(), "ship crashed")
	})
	require.Len(t, rec.errs, 1, "reported when the test ends")
	assert.Contains(t, rec.errs[0], `CrashDuring("chrage"): 1 crash(es) never happened`)
}

func holders(info durabletest.KeyInfo) []string {
	var ids []string
	for _, h := range info.Holders {
		ids = append(ids, h.ID)
	}
	return ids
}

func TestACrashedClaimCountsAsAHolderUntilReaped(t *testing.T) {
	p := &payments{}
	env := durabletest.New(t, durabletest.Options{Limits: []gate.Limit{{Name: "psp", Limit: 2}}}, orderFlow(p))
	env.CrashDuring("charge")
	crashed := env.Insert("order", order{}, durable.InsertOptions{Key: gate.Gate("psp", "adyen")})
	env.RunUntilIdle()
	assert.Equal(t, 1, env.MaxConcurrency("psp:adyen"))

	next := env.Insert("order", order{}, durable.InsertOptions{Key: gate.Gate("psp", "adyen")})
	env.RunUntilIdle()
	assert.Equal(t, store.StatusDone, env.Get(next).Status, "the gate's second slot was free")
	assert.Equal(t, 2, env.MaxConcurrency("psp:adyen"), "the crashed claim held a slot while the next order ran")

	env.RunUntilDone(crashed)
	assert.Equal(t, []int{0, 0, 1}, p.calls)
	assert.Equal(t, 2, env.MaxConcurrency("psp:adyen"))
}
