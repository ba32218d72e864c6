package durable

import (
	"context"
	"time"

	"github.com/godurable/godurable/internal/runtime"
	"github.com/godurable/godurable/store"
)

// host is the engine as its runtime sees it (see runtime.Host): the
// runtime claims and commits; the engine runs the steps of its registered
// workflows, fires its schedules and reconciles.
type host struct{ e *Engine }

var _ runtime.Host = host{}

func (h host) Execute(ctx context.Context, c store.Claimed) store.Outcome { return h.e.execute(ctx, c) }
func (h host) Workflows() []store.WorkflowVersion                         { return h.e.workflowVersions() }
func (h host) StoreNow() time.Time                                        { return h.e.storeNow() }
func (h host) Flushed()                                                   { h.e.notifyFlushed() }

func (h host) Reconcile(ctx context.Context) (store.ReconcileReport, error) {
	return h.e.reconcile(ctx)
}

func (h host) FireSchedules(ctx context.Context) runtime.ScheduleRound {
	r := h.e.fireSchedules(ctx)
	return runtime.ScheduleRound{Started: r.started, Next: r.next, StoreErr: r.storeErr, Errs: r.errs}
}

// stepStarting reports whether a step may start now (runtime.StepStarting):
// false for a successor whose instance was canceled before it started.
func stepStarting(ctx context.Context) bool { return runtime.StepStarting(ctx) }
