package durabletest_test

import (
	"fmt"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

// A singleton per account: a newer sync cancels the older one that waits
// for its webhook (ConflictCancelOlder), and a report not started yet
// takes the newer request's state (ConflictReplace).
func ExampleEnv_onConflict() {
	t := exampleT{} // in a test: func TestNewerSyncWins(t *testing.T)

	sync := durable.NewWorkflow[int]("sync", "fetch", durable.WorkflowOptions{}).
		Step("fetch", func(ctx steps.Context, page int) (transitions.Transition, error) {
			return transitions.Await("webhook", "done", page), nil
		}).
		Step("done", func(ctx steps.Context, page int) (transitions.Transition, error) {
			return transitions.Done(page), nil
		})
	env := durabletest.New(t, durabletest.Options{}, sync)
	single := durable.InsertOptions{UniqueKey: "sync:acct-7", OnConflict: durable.ConflictCancelOlder}
	older := env.Insert("sync", 1, single)
	env.RunUntilIdle() // the older sync awaits its webhook
	newer := env.Insert("sync", 2, single)
	fmt.Println("older:", env.Get(older).Status, "- newer is another:", newer != older)

	// Replace: the state of an instance that has not started (nothing ran
	// since the inserts: the Env runs steps only when asked).
	later := durable.InsertOptions{UniqueKey: "sync:acct-8", OnConflict: durable.ConflictReplace}
	first := env.Insert("sync", 10, later)
	again := env.Insert("sync", 11, later)
	fmt.Println("replaced in place:", again == first, string(env.Get(first).State))
	// Output:
	// older: canceled - newer is another: true
	// replaced in place: true 11
}
