// Leases: heartbeats that extend every claim not yet committed, and the
// watchdog that stops a step whose lease this engine can no longer vouch for.

package runtime

import (
	"sort"
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
		s.mu.Lock()
		refs := make([]store.ClaimRef, 0, len(s.inflight))
		for _, st := range s.inflight {
			if !st.lost {
				refs = append(refs, st.ref)
			}
		}
		s.mu.Unlock()
		if len(refs) == 0 {
			continue
		}
		sort.Slice(refs, func(i, j int) bool { return refs[i].ID < refs[j].ID })
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

// renewed applies a heartbeat's answer. Claims are matched by id and fence:
// this engine may have committed a claim and claimed the same instance
// again while the heartbeat was in flight, and the answer about the old
// claim says nothing about the new one.
func (s *Scheduler) renewed(refs []store.ClaimRef, res store.HeartbeatResult, validUntil time.Time) {
	gone := make(map[store.ClaimRef]bool, len(res.Lost))
	for _, r := range res.Lost {
		gone[r] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range refs {
		st := s.inflight[r.ID]
		if st == nil || st.ref != r {
			continue
		}
		if gone[r] {
			st.lost = true
			st.stop()
		} else if validUntil.After(st.validUntil) {
			st.validUntil = validUntil
		}
	}
	var back []store.ClaimRef
	for _, r := range res.Canceled {
		if st := s.inflight[r.ID]; st != nil && st.ref == r {
			st.canceled = true
			st.stop()
			back = append(back, s.unqueue(r)...)
		}
	}
	if len(back) > 0 {
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
		deadline := time.Now().Add(2 * margin)
		n := 0
		s.mu.Lock()
		for _, st := range s.inflight {
			if st.lost {
				continue
			}
			// A successor running in its predecessor's slot holds it by
			// the leases of the claims before it as much as by its own.
			expired := deadline.After(st.validUntil)
			for p := st.pred; p != nil && !expired; p = p.pred {
				expired = p.lost || deadline.After(p.validUntil)
			}
			if expired {
				st.lost = true
				st.stop()
				n++
			}
		}
		s.mu.Unlock()
		if n > 0 {
			e.log.Error("leases could not be renewed in time; their steps were cancelled and will run again elsewhere", "n", n)
		}
	}
}

// leaseMargin is how often the watchdog looks, and half of how long
// before a lease ends by this engine's clock it gives a claim up.
func leaseMargin(lease time.Duration) time.Duration {
	return max(lease/20, 5*time.Millisecond)
}
