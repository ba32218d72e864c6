// Leases: heartbeats that extend every claim not yet committed, and the
// watchdog that stops a step whose lease this engine can no longer vouch for.

package runtime

import (
	"time"

	"github.com/godurable/godurable/store"
)

func (s *Scheduler) heartbeatLoop() {
	defer s.bgWG.Done()
	e := s.e
	out := newRetrier(e.outage, "heartbeat")
	tick := time.NewTicker(e.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-s.bgCtx.Done():
			return
		case <-tick.C:
		case <-s.beat:
		}
		refs := s.held()
		if len(refs) == 0 {
			continue
		}
		sent := time.Now()
		res, err := e.st.Heartbeat(s.bgCtx, e.cfg.WorkerID, refs, e.cfg.Lease, e.storeNow())
		if err != nil {
			if s.bgCtx.Err() == nil {
				out.fail(err) // the ticker paces the next attempt
			}
			continue
		}
		out.ok()
		s.renewed(refs, res, sent.Add(e.cfg.Lease))
	}
}

// renewed applies a heartbeat's answer (see claims.renewed) and gives
// back the reservations queued after the claims found canceled.
func (s *Scheduler) renewed(refs []store.ClaimRef, res store.HeartbeatResult, validUntil time.Time) {
	if back := s.claims.renewed(refs, res, validUntil); len(back) > 0 {
		go s.release(back)
	}
}

// leaseWatchdog gives up the claims whose lease this engine cannot be sure
// still holds: the store has not answered a heartbeat for them for about
// a lease (it is unreachable, or too slow). Their steps are cancelled a
// margin before the lease ends by this engine's clock, so that a step no
// longer runs when the reaper of another engine may hand its row on. Their
// outcomes are still sent: the store commits them if the claim is still
// current, and discards them as stale otherwise.
func (s *Scheduler) leaseWatchdog() {
	defer s.bgWG.Done()
	e := s.e
	margin := leaseMargin(e.cfg.Lease)
	tick := time.NewTicker(margin)
	defer tick.Stop()
	for {
		select {
		case <-s.bgCtx.Done():
			return
		case <-tick.C:
		}
		if n := s.expire(time.Now().Add(2 * margin)); n > 0 {
			e.log.Error("leases could not be renewed in time; their steps were cancelled and will run again elsewhere", "n", n)
		}
	}
}

// leaseMargin is how often the watchdog looks, and half of how long
// before a lease ends by this engine's clock it gives a claim up.
func leaseMargin(lease time.Duration) time.Duration {
	return max(lease/20, 5*time.Millisecond)
}
