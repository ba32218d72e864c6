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

// Cancel a parent and the children it spawned: none of them runs again,
// and the parent never joins.
func ExampleEnv_Cancel_children() {
	t := exampleT{} // in a test: func TestOrderCancelStopsItsShipments(t *testing.T)

	ship := durable.NewWorkflow[int]("ship", "wait", durable.WorkflowOptions{}).
		Step("wait", func(ctx steps.Context, parcel int) (transitions.Transition, error) {
			return transitions.Await("picked", "done", parcel, transitions.Timeout(24*time.Hour)), nil
		}).
		Step("done", func(ctx steps.Context, parcel int) (transitions.Transition, error) {
			return transitions.Done(parcel), nil
		})
	order := durable.NewWorkflow[int]("order", "split", durable.WorkflowOptions{}).
		Step("split", func(ctx steps.Context, parcels int) (transitions.Transition, error) {
			var kids []transitions.Child
			for i := range parcels {
				kids = append(kids, transitions.Child{Workflow: "ship", State: i})
			}
			return transitions.Spawn(kids, "joined", parcels), nil
		}).
		Step("joined", func(ctx steps.Context, parcels int) (transitions.Transition, error) {
			return transitions.Done("shipped"), nil
		})

	env := durabletest.New(t, durabletest.Options{}, order, ship)
	id := env.Insert("order", 2, durable.InsertOptions{})
	env.RunUntilIdle() // the order spawns two shipments, which await their pick-up
	env.Cancel(id, durable.CancelOptions{Children: true})
	env.Advance(48 * time.Hour) // no timeout fires for a canceled shipment

	fmt.Println("order:", env.Get(id).Status, env.StepNames(id))
	kids, _ := env.Store.Children(context.Background(), id)
	for _, k := range kids {
		fmt.Println("shipment:", k.Status)
	}
	// Output:
	// order: canceled [split]
	// shipment: canceled
	// shipment: canceled
}
