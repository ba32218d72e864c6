package runtime

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
)

// timersDown fails every FireTimers call.
type timersDown struct{ store.Store }

func (timersDown) FireTimers(context.Context, time.Time) (int, error) {
	return 0, errors.New("timers unavailable")
}

// reconcileCounter counts the reconciles its runtime ran.
type reconcileCounter struct {
	testHost
	n int
}

func (h *reconcileCounter) Reconcile(context.Context) (store.ReconcileReport, error) {
	h.n++
	return store.ReconcileReport{}, nil
}

// maintenanceRuntime is newTestRuntime's runtime as worker, with host h.
func maintenanceRuntime(t *testing.T, st store.Store, worker string, h Host) *Runtime {
	rt, _ := newTestRuntime(t, st, 0)
	rt.cfg.WorkerID, rt.h = worker, h
	return rt
}

// A sweep reaps expired leases even when firing timers fails, and wakes
// the pick loops for the rows it made ready.
func TestSweepReapsWhenTimersFail(t *testing.T) {
	ctx := context.Background()
	mem := memory.New(memory.Options{})
	rt, ids := newTestRuntime(t, mem, 1)
	_, err := mem.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "gone", Limit: 1, Lease: time.Millisecond})
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)
	rt.st = timersDown{mem}
	woken := 0
	(&maintainer{e: rt, wake: func() { woken++ }}).sweep(ctx)
	in, err := mem.Get(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, store.StatusReady, in.Status, "the expired claim was reaped")
	require.Equal(t, 1, woken)
	require.True(t, rt.outage.isDown.Load(), "the timers' failure is an outage")
}

// One engine of a fleet reconciles at a time: the one that holds the
// maintenance lease; another takes over once it lapses.
func TestOneMaintainerReconcilesAtATime(t *testing.T) {
	ctx := context.Background()
	mem := memory.New(memory.Options{})
	ha, hb := &reconcileCounter{}, &reconcileCounter{}
	a := &maintainer{e: maintenanceRuntime(t, mem, "a", ha), wake: func() {}}
	b := &maintainer{e: maintenanceRuntime(t, mem, "b", hb), wake: func() {}}
	require.True(t, a.reconcile(ctx))
	require.False(t, b.reconcile(ctx))
	require.True(t, a.reconcile(ctx), "its holder renews the lease")
	require.Equal(t, 2, ha.n)
	require.Zero(t, hb.n)
}
