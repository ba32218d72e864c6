package durabletest_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

// exampleT stands in for the *testing.T a test function receives (examples
// get none); it turns a failure into a panic.
type exampleT struct{ testing.TB }

func (exampleT) Helper()                      {}
func (exampleT) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (exampleT) Errorf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (exampleT) Cleanup(func())               {}

// Test a workflow that waits for a signal: schedule the signal at a virtual
// time and run until the instance is done. The fake clock jumps; the test
// takes no wall time.
func Example() {
	t := exampleT{} // in a test: func TestApproval(t *testing.T)

	type Request struct {
		Amount int `json:"amount"`
	}
	wf := durable.NewWorkflow[Request]("approval", "submit", durable.WorkflowOptions{}).
		Step("submit", func(ctx steps.Context, r Request) (transitions.Transition, error) {
			return transitions.Await("approved", "decide", r, transitions.Timeout(24*time.Hour)), nil
		}).
		Step("decide", func(ctx steps.Context, r Request) (transitions.Transition, error) {
			sig, ok := ctx.Signal()
			if !ok {
				return transitions.Done("expired"), nil
			}
			var by struct{ By string }
			if err := sig.Decode(&by); err != nil {
				return transitions.Transition{}, err
			}
			return transitions.Done(fmt.Sprintf("%d approved by %s", r.Amount, by.By)), nil
		})

	env := durabletest.New(t, durabletest.Options{}, wf)
	id := env.Insert("approval", Request{Amount: 120}, durable.InsertOptions{})
	env.SignalAfter(2*time.Hour, id, "approved", map[string]string{"By": "alice"})
	env.RunUntilDone(id)

	fmt.Println(env.StepNames(id))
	fmt.Println(durabletest.Result[string](env, id))
	fmt.Println("virtual time passed:", env.Clock.Now().Sub(durabletest.Epoch))
	// Output:
	// [submit decide]
	// 120 approved by alice
	// virtual time passed: 2h0m0s
}

// An Env records the most instances that ever held each key at once, and
// Advance fires await timeouts on the fake clock.
func ExampleEnv() {
	t := exampleT{} // in a test: func TestPrinter(t *testing.T)

	wf := durable.NewWorkflow[int]("print", "print", durable.WorkflowOptions{}).
		Step("print", func(ctx steps.Context, job int) (transitions.Transition, error) {
			// The await releases the printer slot until the page is collected.
			return transitions.Await("collected", "archive", job, transitions.Timeout(time.Hour)), nil
		}).
		Step("archive", func(ctx steps.Context, job int) (transitions.Transition, error) {
			if ctx.TimedOut() {
				return transitions.Done("uncollected"), nil
			}
			return transitions.Done("collected"), nil
		})

	env := durabletest.New(t, durabletest.Options{
		Limits: []gate.Limit{{Name: "printer", Limit: 2}}, // a gate: 2 jobs per printer at once
	}, wf)
	var ids []string
	for job := range 5 {
		ids = append(ids, env.Insert("print", job, durable.InsertOptions{Key: gate.Gate("printer", "lobby")}))
	}
	env.RunUntilIdle()
	fmt.Printf("printer:lobby ran at most %d at once (K=%d)\n",
		env.MaxConcurrency("printer:lobby"), env.Key("printer:lobby").K)

	env.Signal(ids[0], "collected", nil)
	env.Advance(time.Hour) // the other four time out
	var results []string
	for _, id := range ids {
		results = append(results, durabletest.Result[string](env, id))
	}
	fmt.Println(strings.Join(results, " "))
	// Output:
	// printer:lobby ran at most 2 at once (K=2)
	// collected uncollected uncollected uncollected uncollected
}

// Prove that a step is idempotent: crash it after its body ran (the outcome
// is lost, as when the process dies before committing), let its lease expire
// on the fake clock, and check what the outside world saw when it ran again.
func ExampleEnv_CrashDuring() {
	t := exampleT{} // in a test: func TestChargeIsIdempotent(t *testing.T)

	charged := map[string]int{} // the payment provider, by idempotency key
	wf := durable.NewWorkflow[string]("checkout", "charge", durable.WorkflowOptions{}).
		Step("charge", func(ctx steps.Context, order string) (transitions.Transition, error) {
			fmt.Println("charge, attempt", ctx.Attempt())
			charged[order+"/"+ctx.InstanceID()] = 1 // keyed: a second call changes nothing
			return transitions.Done("paid"), nil
		})

	env := durabletest.New(t, durabletest.Options{}, wf)
	env.CrashDuring("charge")
	id := env.Insert("checkout", "order-1", durable.InsertOptions{})
	env.RunUntilDone(id)

	fmt.Println(durabletest.Result[string](env, id), "after", env.Clock.Now().Sub(durabletest.Epoch))
	fmt.Println("charges:", len(charged), "crashes:", env.Crashes())
	// Output:
	// charge, attempt 0
	// charge, attempt 1
	// paid after 30.000001s
	// charges: 1 crashes: 1
}
