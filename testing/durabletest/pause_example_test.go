package durabletest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

// A paused queue starts no step: its timers still fire on the fake clock
// and make its rows ready, and they wait for the resume.
func ExampleEnv_pauseQueue() {
	t := exampleT{} // in a test: func TestReminderWaitsForThePause(t *testing.T)

	wf := durable.NewWorkflow[string]("remind", "wait", durable.WorkflowOptions{}).
		Step("wait", func(ctx steps.Context, who string) (transitions.Transition, error) {
			return transitions.Sleep(time.Hour, "send", who), nil
		}).
		Step("send", func(ctx steps.Context, who string) (transitions.Transition, error) {
			return transitions.Done("reminded " + who), nil
		})

	env := durabletest.New(t, durabletest.Options{}, wf)
	id := env.Insert("remind", "alice", durable.InsertOptions{})
	env.RunUntilIdle() // "wait" runs and sleeps for an hour
	ctx := context.Background()
	if err := env.Engine.PauseQueue(ctx, "default"); err != nil {
		panic(err)
	}
	env.Advance(2 * time.Hour)
	in := env.Get(id)
	fmt.Println("paused:", in.Status, "at", in.Step, "- steps run:", env.StepsRun())

	if err := env.Engine.ResumeQueue(ctx, "default"); err != nil {
		panic(err)
	}
	env.RunUntilDone(id)
	fmt.Println("resumed:", durabletest.Result[string](env, id), "- steps run:", env.StepsRun())
	// Output:
	// paused: ready at send - steps run: 1
	// resumed: reminded alice - steps run: 2
}
