// Maintenance: the reaper, timers and reconciler of one elected engine,
// and the schedule loop.

package runtime

import (
	"context"
	"errors"
	"time"

	"github.com/godurable/godurable/store"
)

// maintainer keeps the fleet's shared state in order from one engine: it
// fires due await timeouts and reaps expired leases every ReaperInterval,
// and every ReconcileInterval, while this engine holds the fleet's
// maintenance lease, repairs gate counters and deletes rows past their
// retention (Host.Reconcile). Each step runs whatever became of the one
// before it: a failed timer sweep still reaps.
type maintainer struct {
	e *Runtime
	// wake wakes the engine's pick loops after a sweep made rows ready.
	wake func()
}

// run sweeps and reconciles until ctx is done.
func (m *maintainer) run(ctx context.Context) {
	e := m.e
	reap := time.NewTicker(e.cfg.ReaperInterval)
	defer reap.Stop()
	reconcile := time.NewTicker(e.cfg.ReconcileInterval)
	defer reconcile.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-reap.C:
			m.sweep(ctx)
		case <-reconcile.C:
			m.reconcile(ctx)
		}
	}
}

// sweep fires due await timeouts and reaps expired leases, each whatever
// the other did.
func (m *maintainer) sweep(ctx context.Context) {
	e := m.e
	failed := false
	fired, err := e.st.FireTimers(ctx, e.storeNow())
	if err != nil {
		failed = true
		if ctx.Err() == nil {
			e.outage.fail("fire timers", err)
		}
	}
	reaped, err := e.st.Reap(ctx, e.storeNow())
	if err != nil {
		failed = true
		if ctx.Err() == nil {
			e.outage.fail("reap", err)
		}
	}
	if !failed {
		e.outage.ok()
	}
	if reaped > 0 {
		e.tel.reaped.Add(context.Background(), int64(reaped))
		e.log.Warn("reaped expired leases", "n", reaped)
	}
	if fired+reaped > 0 {
		m.wake()
	}
}

// maintenanceLeaseTTL is three sweep intervals, and at least a second, so
// that a slow sweep never lets the lease lapse under its holder.
func maintenanceLeaseTTL(interval time.Duration) time.Duration {
	return max(3*interval, time.Second)
}

// reconcile runs the fleet's reconciler and retention sweep when this
// engine holds the maintenance lease: one engine of the fleet at a time
// sweeps, renewing the lease at each sweep; when it dies, another takes
// over once the lease has expired (see maintenanceLeaseTTL). It reports
// whether this engine held the lease.
func (m *maintainer) reconcile(ctx context.Context) bool {
	e := m.e
	held, err := e.st.AcquireLease(ctx, store.MaintenanceLease, e.cfg.WorkerID, maintenanceLeaseTTL(e.cfg.ReconcileInterval), e.storeNow())
	if err != nil {
		if ctx.Err() == nil {
			e.outage.fail("reconcile", err)
		}
		return false
	}
	if !held {
		e.outage.ok()
		return false
	}
	if _, err := e.reconcile(ctx); err != nil {
		if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
			e.outage.fail("reconcile", err)
		}
		return true
	}
	e.outage.ok()
	return true
}

// scheduleLoop fires the engine's due schedule ticks. It wakes at the next
// tick, and at least every 10 poll intervals to see pauses, resumes and
// ticks other engines recorded.
func (s *Scheduler) scheduleLoop() {
	defer s.bgWG.Done()
	e := s.e
	longest := 10 * e.cfg.PollInterval
	for {
		r := e.fireSchedules(s.bgCtx)
		if s.bgCtx.Err() != nil {
			return
		}
		if r.StoreErr != nil {
			e.outage.fail("schedules", r.StoreErr)
		} else {
			e.outage.ok()
		}
		if r.Errs != nil {
			e.log.Error("schedules: due ticks could not fire; retrying", "err", r.Errs)
		}
		wait := longest
		switch {
		case r.StoreErr != nil:
			wait = e.cfg.PollInterval
		case !r.Next.IsZero():
			wait = min(max(r.Next.Sub(e.cfg.Clock.Now()), time.Millisecond), longest)
		}
		t := time.NewTimer(wait)
		select {
		case <-s.bgCtx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
