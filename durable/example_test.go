package durable_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/transitions"
)

// A workflow is a state machine over a Go state type: named steps, each
// returning a transition with the new state. The state is committed after
// every step, so a crash re-runs at most the step that was running.
func Example_defineWorkflow() {
	type Order struct {
		ID     string `json:"id"`
		Items  int    `json:"items"`
		Packed bool   `json:"packed"`
	}
	wf := durable.NewWorkflow[Order]("fulfil", "pack", durable.WorkflowOptions{}).
		Step("pack", func(ctx steps.Context, o Order) (transitions.Transition, error) {
			o.Packed = true
			return transitions.Next("ship", o), nil
		}).
		Step("ship", func(ctx steps.Context, o Order) (transitions.Transition, error) {
			if !o.Packed {
				return transitions.Stop("not packed"), nil
			}
			return transitions.Done(fmt.Sprintf("order %s: %d items shipped", o.ID, o.Items)), nil
		})

	// An in-memory store: nothing survives the process (use store/postgres in production).
	eng, err := durable.New(durable.Config{Store: memory.New(memory.Options{}), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	if err := eng.Register(wf); err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = eng.Stop(ctx) }()

	id, err := eng.Insert(ctx, "fulfil", Order{ID: "A-1", Items: 3}, durable.InsertOptions{})
	if err != nil {
		panic(err)
	}
	msg, err := durable.Result[string](ctx, eng, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(msg)
	// Output: order A-1: 3 items shipped
}

// Insert with a concurrency key: the two syncs of account 7 never run a step
// at the same time (no limit is configured for "account", so K = 1), while
// account 9 runs in parallel with them.
func ExampleEngine_Insert() {
	wf := durable.NewWorkflow[string]("account.sync", "sync", durable.WorkflowOptions{}).
		Step("sync", func(ctx steps.Context, account string) (transitions.Transition, error) {
			return transitions.Done("synced under " + ctx.Key()), nil
		})
	eng, err := durable.New(durable.Config{Store: memory.New(memory.Options{}), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	if err := eng.Register(wf); err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = eng.Stop(ctx) }()

	var ids []string
	for _, account := range []string{"7", "7", "9"} {
		id, err := eng.Insert(ctx, "account.sync", account, durable.InsertOptions{
			Key: gate.Identity("account", account),
		})
		if err != nil {
			panic(err)
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		msg, err := durable.Result[string](ctx, eng, id)
		if err != nil {
			panic(err)
		}
		fmt.Println(msg)
	}
	// Output:
	// synced under account:7
	// synced under account:7
	// synced under account:9
}

// A schedule starts a workflow at every tick of a cron expression, once per
// tick however many engines run it. Here one engine runs "@every 1s"; in
// production it would be "0 9 * * MON-FRI" in TimeZone "Europe/Paris", say,
// on every worker of the fleet.
func Example_schedule() {
	type Digest struct {
		For time.Time `json:"for"`
	}
	wf := durable.NewWorkflow[Digest]("digest", "send", durable.WorkflowOptions{}).
		Step("send", func(ctx steps.Context, d Digest) (transitions.Transition, error) {
			return transitions.Done(fmt.Sprintf("digest sent for a tick on a whole second: %t", d.For.Nanosecond() == 0)), nil
		})
	eng, err := durable.New(durable.Config{
		Store:  memory.New(memory.Options{}),
		Logger: slog.New(slog.DiscardHandler),
		Schedules: []durable.Schedule{{
			Name:     "digest",
			Workflow: "digest",
			Cron:     "@every 1s",
			StateAt:  func(tick time.Time) (any, error) { return Digest{For: tick}, nil },
			Overlap:  durable.OverlapSkip, // a tick while the last digest runs does nothing
		}},
	})
	if err != nil {
		panic(err)
	}
	if err := eng.Register(wf); err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = eng.Stop(ctx) }()

	for {
		scs, err := eng.ListSchedules(ctx)
		if err != nil {
			panic(err)
		}
		if id := scs[0].LastInstance; id != "" {
			msg, err := durable.Result[string](ctx, eng, id)
			if err != nil {
				panic(err)
			}
			fmt.Println(msg)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Output: digest sent for a tick on a whole second: true
}

// A workflow handle inserts states of its own type: passing anything but an
// Invoice does not compile. The handle must be registered on the engine it
// inserts on.
func ExampleWorkflow_Insert() {
	type Invoice struct {
		Number string `json:"number"`
		Cents  int    `json:"cents"`
	}
	send := durable.NewWorkflow[Invoice]("invoice.send", "send", durable.WorkflowOptions{}).
		Step("send", func(ctx steps.Context, inv Invoice) (transitions.Transition, error) {
			return transitions.Done(fmt.Sprintf("sent %s for %d cents", inv.Number, inv.Cents)), nil
		})
	eng, err := durable.New(durable.Config{Store: memory.New(memory.Options{}), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	if err := eng.Register(send); err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = eng.Stop(ctx) }()

	id, err := send.Insert(ctx, eng, Invoice{Number: "INV-7", Cents: 990}, durable.InsertOptions{})
	if err != nil {
		panic(err)
	}
	msg, err := durable.Result[string](ctx, eng, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(msg)
	// Output: sent INV-7 for 990 cents
}

// A step with its own settings takes them as one steps.Options value:
// here a timeout per attempt and a retry policy of its own, which replaces
// the workflow's for this step only.
func ExampleWorkflow_StepWith() {
	type Fetch struct {
		URL string `json:"url"`
	}
	tries := 0
	wf := durable.NewWorkflow[Fetch]("fetch", "get", durable.WorkflowOptions{}).
		StepWith("get", func(ctx steps.Context, f Fetch) (transitions.Transition, error) {
			if tries++; tries < 3 {
				return transitions.Transition{}, fmt.Errorf("fetch %s: unavailable", f.URL)
			}
			return transitions.Done(fmt.Sprintf("fetched %s on attempt %d", f.URL, ctx.Attempt()+1)), nil
		}, steps.Options{
			Timeout: 5 * time.Second,
			Retry:   &steps.RetryPolicy{MaxAttempts: 5, InitialInterval: time.Millisecond, RandomizationFactor: -1},
		})
	eng, err := durable.New(durable.Config{Store: memory.New(memory.Options{}), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	if err := eng.Register(wf); err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = eng.Stop(ctx) }()

	id, err := eng.Insert(ctx, "fetch", Fetch{URL: "https://example.com"}, durable.InsertOptions{})
	if err != nil {
		panic(err)
	}
	msg, err := durable.Result[string](ctx, eng, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(msg)
	// Output: fetched https://example.com on attempt 3
}

// Per-key limits set at run time: the engines' configuration gives the
// stripe gate 5 calls per key, and a billing service sets the limits its
// tenants pay for, one at a time, as `durable limits set` does: a sync of
// its own namespace that keeps what it omits (KeepOmitted). Every engine
// of the fleet runs the next step of a key under the key's stored limit.
func Example_perKeyLimits() {
	eng, err := durable.New(durable.Config{
		Store:  memory.New(memory.Options{}),
		Limits: []gate.Limit{{Name: "stripe", Limit: 5}},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Start(ctx); err != nil { // stores the configured limits
		panic(err)
	}
	defer func() { _ = eng.Stop(ctx) }()

	st := eng.Store()
	for _, tenant := range []gate.Limit{{Name: "stripe:acct_big", Limit: 50, Shards: 5}, {Name: "stripe:acct_mid", Limit: 10}} {
		_, err := st.SyncKeyLimits(ctx, "billing", store.KeyLimits{Limits: []gate.Limit{tenant}}, store.SyncOptions{KeepOmitted: true})
		if err != nil {
			panic(err)
		}
	}
	for _, key := range []string{"stripe:acct_big", "stripe:acct_mid", "stripe:acct_small"} {
		info, err := st.KeyInfo(ctx, key)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: K = %d (limit %s)\n", key, info.K, info.LimitName)
	}
	// Output:
	// stripe:acct_big: K = 50 (limit stripe:acct_big)
	// stripe:acct_mid: K = 10 (limit stripe:acct_mid)
	// stripe:acct_small: K = 5 (limit stripe)
}
