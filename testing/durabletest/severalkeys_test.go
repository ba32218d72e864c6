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
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

// syncJob is one sync of an account.
type syncJob struct {
	Account string `json:"account"`
	N       int    `json:"n"`
}

var stripe = gate.Gate("stripe", "global")

// accountSync syncs an account under its identity (K = 1): fetch, then
// charge, which also needs a slot of the payment provider's gate, then
// settle. change is the key option that takes the charge step to stripe.
func accountSync(change func(acct gate.ConcurrencyKey) []transitions.Option) *durable.Workflow[syncJob] {
	return durable.NewWorkflow[syncJob]("sync", "fetch", durable.WorkflowOptions{}).
		Step("fetch", func(ctx steps.Context, j syncJob) (transitions.Transition, error) {
			return transitions.Next("charge", j, change(gate.Identity("acct", j.Account))...), nil
		}).
		Step("charge", func(ctx steps.Context, j syncJob) (transitions.Transition, error) {
			return transitions.Next("settle", j, transitions.SetKeys(gate.Identity("acct", j.Account))), nil
		}).
		Step("settle", func(ctx steps.Context, j syncJob) (transitions.Transition, error) {
			return transitions.Done(j.N), nil
		})
}

// A step may hold several keys: here the charge step of an account sync
// holds its account's identity (one step per account at once) and a slot
// of the stripe gate (two charges at once, over every account). It runs
// only when both have room. AddKey keeps the account's key; the Env counts
// the step under each key it holds.
func ExampleEnv_severalKeys() {
	t := exampleT{} // in a test: func TestAccountSync(t *testing.T)

	wf := accountSync(func(gate.ConcurrencyKey) []transitions.Option {
		return []transitions.Option{transitions.AddKey(stripe)} // not SwitchKey: that would drop the account
	})
	env := durabletest.New(t, durabletest.Options{Limits: []gate.Limit{{Name: "stripe", Limit: 2}}}, wf)
	for n := range 40 {
		acct := fmt.Sprint(n % 4)
		env.Insert("sync", syncJob{Account: acct, N: n}, durable.InsertOptions{Key: gate.Identity("acct", acct)})
	}
	env.RunUntilIdle()
	for a := range 4 {
		k := fmt.Sprintf("acct:%d", a)
		fmt.Printf("%s: at most %d at once\n", k, env.MaxConcurrency(k))
	}
	fmt.Printf("stripe:global: at most %d at once (K=%d)\n", env.MaxConcurrency("stripe:global"), env.Key("stripe:global").K)
	fmt.Println("steps run:", env.StepsRun())
	// Output:
	// acct:0: at most 1 at once
	// acct:1: at most 1 at once
	// acct:2: at most 1 at once
	// acct:3: at most 1 at once
	// stripe:global: at most 2 at once (K=2)
	// steps run: 120
}

// SwitchKey replaces every key: a sync that holds its account and takes
// the charge step to stripe with SwitchKey drops the account's key, so
// another step of the same account may run beside the charge. With AddKey the account stays
// held. The test counts, round by round, the steps of each account that
// held their slots at once, whatever keys they held.
func TestSeveralKeysSwitchKeyTrap(t *testing.T) {
	run := func(t *testing.T, change func(gate.ConcurrencyKey) []transitions.Option) (perAccount, stripeMax int) {
		env := durabletest.New(t, durabletest.Options{Limits: []gate.Limit{{Name: "stripe", Limit: 2}}}, accountSync(change))
		account := map[string]string{}
		for n := range 40 {
			acct := fmt.Sprint(n % 4)
			id := env.Insert("sync", syncJob{Account: acct, N: n}, durable.InsertOptions{Key: gate.Identity("acct", acct)})
			account[id] = acct
		}
		for round := 0; ; round++ {
			require.Less(t, round, 1000)
			rep, err := env.Engine.Tick(context.Background())
			require.NoError(t, err)
			if len(rep.Claimed) == 0 {
				break
			}
			per := map[string]int{}
			for _, c := range rep.Claimed {
				per[account[c.ID]]++
				perAccount = max(perAccount, per[account[c.ID]])
			}
		}
		for id := range account {
			require.Equal(t, "done", string(env.Get(id).Status))
		}
		return perAccount, env.MaxConcurrency("stripe:global")
	}
	t.Run("AddKey", func(t *testing.T) {
		perAccount, stripeMax := run(t, func(gate.ConcurrencyKey) []transitions.Option {
			return []transitions.Option{transitions.AddKey(stripe)}
		})
		assert.Equal(t, 1, perAccount, "the account's key is kept: one step per account at once")
		assert.LessOrEqual(t, stripeMax, 2)
	})
	t.Run("ReplaceKey", func(t *testing.T) {
		perAccount, stripeMax := run(t, func(acct gate.ConcurrencyKey) []transitions.Option {
			return []transitions.Option{transitions.AddKey(gate.Gate("mail", "eu")), transitions.ReplaceKey(gate.Gate("mail", "eu"), stripe)}
		})
		assert.Equal(t, 1, perAccount, "ReplaceKey changes one key and keeps the account's")
		assert.LessOrEqual(t, stripeMax, 2)
	})
	t.Run("SwitchKey", func(t *testing.T) {
		perAccount, stripeMax := run(t, func(gate.ConcurrencyKey) []transitions.Option {
			return []transitions.Option{transitions.SwitchKey(stripe)}
		})
		// Nothing requires the account to run one step at a time any
		// more; on this deterministic run, it does not.
		assert.Greater(t, perAccount, 1, "SwitchKey drops the account's key: its charge runs beside its other steps")
		assert.LessOrEqual(t, stripeMax, 2)
	})
}

// A crashed step of several keys holds every one of them until it is
// reaped, and the Env counts it under each.
func TestSeveralKeysCrashHoldsEveryKey(t *testing.T) {
	wf := accountSync(func(gate.ConcurrencyKey) []transitions.Option {
		return []transitions.Option{transitions.AddKey(stripe)}
	})
	env := durabletest.New(t, durabletest.Options{Limits: []gate.Limit{{Name: "stripe", Limit: 1}}}, wf)
	env.CrashDuring("charge")
	a := env.Insert("sync", syncJob{Account: "a"}, durable.InsertOptions{Key: gate.Identity("acct", "a")})
	b := env.Insert("sync", syncJob{Account: "b"}, durable.InsertOptions{Key: gate.Identity("acct", "b")})
	env.RunUntilIdle()
	assert.Equal(t, "executing", string(env.Get(a).Status), "a crashed in charge, holding acct:a and stripe")
	assert.Equal(t, []string{"acct:a", "stripe:global"}, env.Get(a).Keys)
	assert.NotEqual(t, "done", string(env.Get(b).Status), "b's charge waits for the stripe slot the crashed claim holds")
	env.RunUntilDone(a)
	env.RunUntilDone(b)
	assert.Equal(t, 1, env.MaxConcurrency("stripe:global"))
	assert.Equal(t, 1, env.MaxConcurrency("acct:a"))
	assert.Equal(t, 1, env.Crashes())
}
