package durable_test

import (
	"context"
	"strings"
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

// Insert refuses keys it cannot hold before anything reaches the store,
// with an error wrapping ErrInvalidInput that says what is wrong.
func TestInsertKeysRefused(t *testing.T) {
	env := durabletest.New(t, durabletest.Options{}, counterWorkflow())
	acct, stripe := gate.Identity("acct", "1"), gate.Gate("stripe", "global")
	for _, c := range []struct {
		name string
		opts durable.InsertOptions
		msg  string
	}{
		{"Key and Keys", durable.InsertOptions{Key: acct, Keys: []gate.ConcurrencyKey{stripe}}, "both Key and Keys are set"},
		{"five keys", durable.InsertOptions{Keys: []gate.ConcurrencyKey{acct, stripe, gate.Key("a", "1"), gate.Key("b", "1"), gate.Key("c", "1")}},
			"5 concurrency keys, at most 4"},
		{"a key twice", durable.InsertOptions{Keys: []gate.ConcurrencyKey{acct, stripe, gate.Gate("acct", "1")}}, `key "acct:1" given twice`},
		{"the zero key", durable.InsertOptions{Keys: []gate.ConcurrencyKey{acct, {}}}, "key #1 is the zero key"},
		{"an invalid key", durable.InsertOptions{Keys: []gate.ConcurrencyKey{acct, gate.Gate("stripe", "")}}, "key #1: invalid concurrency key"},
	} {
		_, err := env.Engine.Insert(context.Background(), "count", counter{}, c.opts)
		require.Error(t, err, c.name)
		assert.ErrorIs(t, err, durable.ErrInvalidInput, c.name)
		assert.Contains(t, err.Error(), c.msg, c.name)
	}
	_, err := env.Engine.Insert(context.Background(), "count", counter{}, durable.InsertOptions{Keys: []gate.ConcurrencyKey{gate.Gate("stripe", "")}})
	assert.ErrorIs(t, err, gate.ErrInvalidKey, "an invalid key's error says so")
	all, err := env.Store.List(context.Background(), store.ListFilter{})
	require.NoError(t, err)
	assert.Empty(t, all, "nothing inserted")
	assert.Equal(t, 4, durable.MaxKeys)
}

// Strict mode refuses a key that the prefix-capture check warns about
// wherever it is in Keys, not only first.
func TestInsertKeysCheckedEach(t *testing.T) {
	env := durabletest.New(t, durabletest.Options{Strict: true, Limits: []gate.Limit{{Name: "stripe", Limit: 2}}}, counterWorkflow())
	_, err := env.Engine.Insert(context.Background(), "count", counter{},
		durable.InsertOptions{Keys: []gate.ConcurrencyKey{gate.Identity("acct", "1"), gate.Gate("mail", "eu")}})
	require.Error(t, err, "a gate without a limit, second in the list")
	assert.Contains(t, err.Error(), "mail")
	_, err = env.Engine.Insert(context.Background(), "count", counter{},
		durable.InsertOptions{Keys: []gate.ConcurrencyKey{gate.Identity("acct", "1"), gate.Gate("stripe", "global")}})
	require.NoError(t, err)
}

// An instance of several keys shows them all (the first as Key), its step
// sees them all, and a Tick reports them all; a transition's key edits
// give the next step its keys.
func TestSeveralKeysSeen(t *testing.T) {
	acct, stripe, mail := gate.Identity("acct", "1"), gate.Gate("stripe", "global"), gate.Gate("mail", "eu")
	var seen [][]string
	var first []string
	wf := durable.NewWorkflow[counter]("keys", "a", durable.WorkflowOptions{})
	record := func(ctx steps.Context) {
		seen = append(seen, ctx.Keys())
		first = append(first, ctx.Key())
	}
	wf.Step("a", func(ctx steps.Context, c counter) (transitions.Transition, error) {
		record(ctx)
		return transitions.Next("b", c, transitions.AddKey(mail), transitions.DropKey(stripe)), nil
	})
	wf.Step("b", func(ctx steps.Context, c counter) (transitions.Transition, error) {
		record(ctx)
		return transitions.Next("c", c, transitions.ReplaceKey(mail, stripe), transitions.AddKey(gate.Key("x", "1"))), nil
	})
	wf.Step("c", func(ctx steps.Context, c counter) (transitions.Transition, error) {
		record(ctx)
		return transitions.Next("d", c, transitions.SetKeys(mail)), nil
	})
	wf.Step("d", func(ctx steps.Context, c counter) (transitions.Transition, error) {
		record(ctx)
		return transitions.Next("e", c, transitions.ReleaseKey()), nil
	})
	wf.Step("e", func(ctx steps.Context, c counter) (transitions.Transition, error) {
		record(ctx)
		return transitions.Done(0), nil
	})
	env := durabletest.New(t, durabletest.Options{Limits: []gate.Limit{{Name: "stripe", Limit: 2}, {Name: "mail", Limit: 3}}}, wf)
	id := env.Insert("keys", counter{}, durable.InsertOptions{Keys: []gate.ConcurrencyKey{stripe, acct}})
	in := env.Get(id)
	assert.Equal(t, "acct:1", in.Key, "the identity is first")
	assert.Equal(t, []string{"acct:1", "stripe:global"}, in.Keys)

	rep, err := env.Engine.Tick(context.Background())
	require.NoError(t, err)
	require.Len(t, rep.Claimed, 1)
	assert.Equal(t, "acct:1", rep.Claimed[0].Key)
	assert.Equal(t, []string{"acct:1", "stripe:global"}, rep.Claimed[0].Keys)
	assert.Equal(t, []string{"acct:1", "mail:eu"}, env.Get(id).Keys, "AddKey(mail), DropKey(stripe)")

	env.RunUntilDone(id)
	assert.Equal(t, [][]string{
		{"acct:1", "stripe:global"},
		{"acct:1", "mail:eu"},
		{"acct:1", "stripe:global", "x:1"},
		{"mail:eu"},
		nil,
	}, seen)
	assert.Equal(t, []string{"acct:1", "acct:1", "acct:1", "mail:eu", ""}, first)
	hist, err := env.Store.History(context.Background(), id)
	require.NoError(t, err)
	var ran [][]string
	for _, h := range hist {
		if h.Key != "" {
			ran = append(ran, append([]string{h.Key}, h.Also...))
		}
	}
	assert.Equal(t, seen[:4], ran, "each step's history row keeps every key it ran under")
	in = env.Get(id)
	assert.Empty(t, in.Keys)
	assert.Empty(t, in.Key)
	for _, k := range []string{"acct:1", "stripe:global", "mail:eu", "x:1"} {
		assert.Equal(t, 1, env.MaxConcurrency(k), k)
	}
}

// A blocked instance of several keys says which key it waits for.
func TestSeveralKeysBlockedOn(t *testing.T) {
	acct, stripe := gate.Identity("acct", "1"), gate.Gate("stripe", "global")
	wf := durable.NewWorkflow[counter]("hold", "a", durable.WorkflowOptions{})
	wf.Step("a", func(ctx steps.Context, c counter) (transitions.Transition, error) { return transitions.Done(0), nil })
	env := durabletest.New(t, durabletest.Options{Limits: []gate.Limit{{Name: "stripe", Limit: 1}}}, wf)
	// The first crashes holding stripe:global until its lease ends; the
	// second, with the account too, finds the gate full and waits for it.
	env.CrashDuring("a")
	holder := env.Insert("hold", counter{}, durable.InsertOptions{Key: stripe})
	env.RunUntilIdle()
	require.Equal(t, store.StatusExecuting, env.Get(holder).Status)
	id := env.Insert("hold", counter{}, durable.InsertOptions{Keys: []gate.ConcurrencyKey{acct, stripe}})
	env.RunUntilIdle()
	in := env.Get(id)
	require.Equal(t, store.StatusBlocked, in.Status)
	assert.Equal(t, "stripe:global", in.BlockedOn)
	assert.Equal(t, "acct:1", in.Key)
	assert.Empty(t, env.Get(holder).BlockedOn, "only a blocked instance waits on a key")
	assert.Equal(t, store.StatusDone, env.RunUntilDone(id).Status)
	assert.Empty(t, env.Get(id).BlockedOn)
	assert.Equal(t, 1, env.MaxConcurrency("stripe:global"))
}

// A key edit that cannot apply is a programming error: the instance fails
// at once, without retries, and says why.
func TestKeyEditsRefused(t *testing.T) {
	acct, stripe := gate.Identity("acct", "1"), gate.Gate("stripe", "global")
	for _, c := range []struct {
		name string
		opt  transitions.Option
		msg  string
	}{
		{"drop a key not held", transitions.DropKey(stripe), "DropKey(stripe:global): the instance does not hold it (keys: acct:1)"},
		{"add a key held", transitions.AddKey(gate.Key("acct", "1")), "AddKey(acct:1): the instance already holds it"},
		{"add an invalid key", transitions.AddKey(gate.Gate("stripe", "")), "invalid concurrency key"},
		{"a fifth key", transitions.SetKeys(acct, stripe, gate.Key("a", "1"), gate.Key("b", "1"), gate.Key("c", "1")), "5 concurrency keys, at most 4"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wf := durable.NewWorkflow[counter]("edit", "a", durable.WorkflowOptions{Retry: fastRetry(3)})
			wf.Step("a", func(ctx steps.Context, s counter) (transitions.Transition, error) {
				return transitions.Next("b", s, c.opt), nil
			})
			wf.Step("b", func(ctx steps.Context, s counter) (transitions.Transition, error) { return transitions.Done(0), nil })
			var tb recordingTB
			tb.TB = t
			env := durabletest.New(&tb, durabletest.Options{Limits: []gate.Limit{{Name: "stripe", Limit: 2}}}, wf)
			id := env.Insert("edit", counter{}, durable.InsertOptions{Key: acct})
			in := env.RunUntilDone(id)
			assert.Equal(t, store.StatusFailed, in.Status)
			assert.Equal(t, 0, in.Attempt, "no retry")
			assert.Contains(t, in.LastError, c.msg)
			assert.Equal(t, []string{"acct:1"}, in.Keys, "the keys are unchanged")
			assert.True(t, tb.programmingError, "durabletest reports the programming error")
		})
	}
}

// recordingTB notes durabletest's report of a programming error instead
// of failing the test with it.
type recordingTB struct {
	testing.TB
	programmingError bool
}

func (r *recordingTB) Errorf(format string, args ...any) {
	if strings.Contains(format, "programming error") {
		r.programmingError = true
		return
	}
	r.TB.Errorf(format, args...)
}

// Children take several keys as inserts do; keys a child cannot hold fail
// the parent at once, as a wrong key edit does.
func TestChildKeys(t *testing.T) {
	acct, stripe := gate.Identity("acct", "1"), gate.Gate("stripe", "global")
	for _, c := range []struct {
		name  string
		child transitions.Child
		msg   string // "": the spawn succeeds
	}{
		{"several keys", transitions.Child{Workflow: "leaf", Keys: []gate.ConcurrencyKey{stripe, acct}}, ""},
		{"Key and Keys", transitions.Child{Workflow: "leaf", Key: acct, Keys: []gate.ConcurrencyKey{stripe}}, "both Key and Keys are set"},
		{"a key twice", transitions.Child{Workflow: "leaf", Keys: []gate.ConcurrencyKey{acct, gate.Key("acct", "1")}}, `key "acct:1" given twice`},
		{"an invalid key", transitions.Child{Workflow: "leaf", Key: gate.Identity("acct", "")}, "invalid concurrency key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var leafKeys []string
			leaf := durable.NewWorkflow[counter]("leaf", "a", durable.WorkflowOptions{})
			leaf.Step("a", func(ctx steps.Context, s counter) (transitions.Transition, error) {
				leafKeys = ctx.Keys()
				return transitions.Done(0), nil
			})
			parent := durable.NewWorkflow[counter]("parent", "a", durable.WorkflowOptions{Retry: fastRetry(3)})
			parent.Step("a", func(ctx steps.Context, s counter) (transitions.Transition, error) {
				return transitions.Spawn([]transitions.Child{c.child}, "b", s), nil
			})
			parent.Step("b", func(ctx steps.Context, s counter) (transitions.Transition, error) { return transitions.Done(0), nil })
			tb := &recordingTB{TB: t}
			env := durabletest.New(tb, durabletest.Options{Limits: []gate.Limit{{Name: "stripe", Limit: 2}}}, leaf, parent)
			id := env.Insert("parent", counter{}, durable.InsertOptions{})
			in := env.RunUntilDone(id)
			if c.msg == "" {
				assert.Equal(t, store.StatusDone, in.Status, in.LastError)
				assert.Equal(t, []string{"acct:1", "stripe:global"}, leafKeys)
				return
			}
			assert.Equal(t, store.StatusFailed, in.Status)
			assert.Equal(t, 0, in.Attempt, "no retry")
			assert.Contains(t, in.LastError, c.msg)
			assert.True(t, tb.programmingError)
		})
	}
}

// A Transition built by hand with a KeyChange and no KeyEdits still
// replaces every key, as SwitchKey does.
func TestKeyChangeWithoutEdits(t *testing.T) {
	var keys []string
	wf := durable.NewWorkflow[counter]("byhand", "a", durable.WorkflowOptions{})
	wf.Step("a", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		return transitions.Transition{Kind: transitions.KindNext, Step: "b", State: s,
			KeyChange: &transitions.KeyChange{Key: gate.Gate("stripe", "global")}}, nil
	})
	wf.Step("b", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		keys = ctx.Keys()
		return transitions.Done(0), nil
	})
	env := durabletest.New(t, durabletest.Options{Limits: []gate.Limit{{Name: "stripe", Limit: 2}}}, wf)
	id := env.Insert("byhand", counter{}, durable.InsertOptions{Keys: []gate.ConcurrencyKey{gate.Identity("acct", "1"), gate.Gate("mail", "eu")}})
	assert.Equal(t, store.StatusDone, env.RunUntilDone(id).Status)
	assert.Equal(t, []string{"stripe:global"}, keys)
}
