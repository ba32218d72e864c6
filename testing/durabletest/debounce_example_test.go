package durabletest_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

// Debounce a burst of events: the workflow runs once, Period after the
// last event of a burst, and never later than MaxWait after its first.
func ExampleEnv_debounce() {
	t := exampleT{} // in a test: func TestReindexOncePerBurst(t *testing.T)

	var runs []string
	wf := durable.NewWorkflow[string]("reindex", "run", durable.WorkflowOptions{}).
		Step("run", func(ctx steps.Context, last string) (transitions.Transition, error) {
			runs = append(runs, fmt.Sprintf("%s at %s", last, ctx.Now().Sub(durabletest.Epoch)))
			return transitions.Done(last), nil
		})
	env := durabletest.New(t, durabletest.Options{}, wf)
	opts := durable.InsertOptions{Debounce: durable.Debounce{Key: "doc:7", Period: 30 * time.Second, MaxWait: time.Minute}}
	event := func(name string) {
		env.Insert("reindex", name, opts)
		env.Advance(10 * time.Second)
	}

	event("e1") // a burst of three, 10 s apart: one run, 30 s after e3
	event("e2")
	event("e3")
	env.Advance(time.Minute)
	for i := range 8 { // a steady stream, 10 s apart: a run every MaxWait
		event(fmt.Sprintf("s%d", i))
	}
	env.Advance(time.Minute)
	fmt.Println(strings.Join(runs, "\n"))
	// Output:
	// e3 at 50s
	// s5 at 2m30s
	// s7 at 3m10s
}
