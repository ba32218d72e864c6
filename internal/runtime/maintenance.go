// Maintenance: the reaper, timers and reconciler of one elected engine,
// and the schedule loop.

package runtime

import (
	"context"
	"errors"
	"time"

	"github.com/godurable/godurable/store"
)

func (s *Scheduler) maintenanceLoop() {
	defer s.bgWG.Done()
	e := s.e
	reap := time.NewTicker(e.cfg.ReaperInterval)
	defer reap.Stop()
	reconcile := time.NewTicker(e.cfg.ReconcileInterval)
	defer reconcile.Stop()
	for {
		select {
		case <-s.bgCtx.Done():
			return
		case <-reap.C:
			s.sweep()
		case <-reconcile.C:
			s.reconcile()
		}
	}
}

// sweep fires due await timeouts and reaps expired leases.
func (s *Scheduler) sweep() {
	e := s.e
	fired, err := e.st.FireTimers(s.bgCtx, e.storeNow())
	if err != nil {
		if s.bgCtx.Err() == nil {
			e.outage.fail("fire timers", err)
		}
		return
	}
	reaped, err := e.st.Reap(s.bgCtx, e.storeNow())
	if err != nil {
		if s.bgCtx.Err() == nil {
			e.outage.fail("reap", err)
		}
		return
	}
	e.outage.ok()
	if reaped > 0 {
		e.tel.reaped.Add(context.Background(), int64(reaped))
		e.log.Warn("reaped expired leases", "n", reaped)
	}
	if fired+reaped > 0 {
		s.WakeAll()
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
// over once the lease has expired (see maintenanceLeaseTTL).
func (s *Scheduler) reconcile() {
	e := s.e
	held, err := e.st.AcquireLease(s.bgCtx, store.MaintenanceLease, e.cfg.WorkerID, maintenanceLeaseTTL(e.cfg.ReconcileInterval), e.storeNow())
	if err != nil {
		if s.bgCtx.Err() == nil {
			e.outage.fail("reconcile", err)
		}
		return
	}
	if !held {
		e.outage.ok()
		return
	}
	if _, err := e.reconcile(s.bgCtx); err != nil {
		if s.bgCtx.Err() == nil && !errors.Is(err, context.Canceled) {
			e.outage.fail("reconcile", err)
		}
		return
	}
	e.outage.ok()
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
