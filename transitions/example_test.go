package transitions_test

import (
	"fmt"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/transitions"
)

type order struct {
	ID   string
	Paid bool
}

// A step returns where the instance goes next, with its new state. The
// engine commits both before anything else happens to the instance.
func ExampleNext() {
	t := transitions.Next("ship", order{ID: "A-1", Paid: true})
	fmt.Println(t.Kind, t.Step, t.State)
	// Output: next ship {A-1 true}
}

// The key persists across steps unless a transition changes it: here the
// order's identity key is swapped for the payment provider's gate from the
// next step on, and then dropped for a step that needs no key.
func ExampleSwitchKey() {
	pay := transitions.Next("charge", order{ID: "A-1"}, transitions.SwitchKey(gate.Gate("stripe", "acct_1")))
	fmt.Println(pay.Kind, pay.Step, "under", pay.KeyChange.Key)

	wrapUp := transitions.Next("notify", order{ID: "A-1", Paid: true}, transitions.ReleaseKey())
	fmt.Println(wrapUp.Kind, wrapUp.Step, "key released:", wrapUp.KeyChange.Key.IsZero())
	// Output:
	// next charge under stripe:acct_1
	// next notify key released: true
}

// Await parks the instance, holding no slot, until the named signal arrives
// or the timeout fires; then the next step runs.
func ExampleAwait() {
	t := transitions.Await("payment.confirmed", "ship", order{ID: "A-1"}, transitions.Timeout(time.Hour))
	fmt.Println(t.Kind, t.Signal, "then", t.Step, "within", t.Timeout)
	// Output: await payment.confirmed then ship within 1h0m0s
}

// Retry runs the same step again after a delay; Done and Stop end the
// instance, with a result or a failure reason.
func ExampleRetry() {
	for _, t := range []transitions.Transition{
		transitions.Retry(order{ID: "A-1"}, 30*time.Second),
		transitions.Done("shipped"),
		transitions.Stop("card declined"),
	} {
		switch t.Kind {
		case transitions.KindRetry:
			fmt.Println(t.Kind, "after", t.Delay)
		case transitions.KindDone:
			fmt.Println(t.Kind, "with", t.Result)
		case transitions.KindStop:
			fmt.Println(t.Kind, "because", t.Reason)
		}
	}
	// Output:
	// retry after 30s
	// done with shipped
	// stop because card declined
}

// With several keys, AddKey, DropKey and ReplaceKey change one key and
// keep the others. Here a sync that holds its account's identity adds the
// payment provider's gate for the charge step, then drops the gate again;
// the account is held throughout. SwitchKey(stripe) instead would have
// replaced every key, the account's too.
func ExampleAddKey() {
	stripe := gate.Gate("stripe", "global")
	charge := transitions.Next("charge", order{ID: "A-1"}, transitions.AddKey(stripe))
	settle := transitions.Next("settle", order{ID: "A-1", Paid: true}, transitions.DropKey(stripe))
	for _, t := range []transitions.Transition{charge, settle} {
		for _, e := range t.KeyEdits {
			fmt.Println(t.Step+":", e.Op, e.Key)
		}
	}
	// Output:
	// charge: add stripe:global
	// settle: drop stripe:global
}
