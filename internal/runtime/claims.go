// The registry of the engine's claims: what the executors, the flushers,
// the heartbeats and the watchdog share.

package runtime

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/godurable/godurable/store"
)

// claims is the registry of this engine's claims and reservations: every
// claim not yet committed (inflight, by instance id), the reservations
// queued to run after a step in its slot (succ), and where a slot went on
// (moved). mu guards all three and the claimStates in them.
type claims struct {
	mu       sync.Mutex
	inflight map[string]*claimState
	// succ holds the reservations hand-off flushes and claims made (store.Claimed.After)
	// as chains: by the claim or reservation (id and fence: an instance
	// runs many steps) whose step each runs after, in the same slot, until an executor (that step ended) or
	// a flusher (that step's outcome is on its way without it) takes it.
	succ map[store.ClaimRef]store.Claimed
	// moved links a claim or reservation whose step ended to the
	// reservation that went on in its slot, until its outcome commits: a
	// flush in flight may still reserve successors after it, and those go
	// to the end of the slot's chain.
	moved map[store.ClaimRef]store.ClaimRef
}

func newClaims() claims {
	return claims{inflight: map[string]*claimState{}, succ: map[store.ClaimRef]store.Claimed{},
		moved: map[store.ClaimRef]store.ClaimRef{}}
}

type claimState struct {
	ref    store.ClaimRef
	cancel context.CancelFunc
	// lost: the claim is no longer held (or may not be: its lease could not
	// be renewed in time); canceled: its instance was canceled.
	lost, canceled bool
	// yielded: the claim's step ended and its executor left the slot's
	// chain for a row waiting in the buffer (see run): no reservation
	// goes on in that slot.
	yielded bool
	// validUntil is, by this engine's monotonic clock, the latest time the
	// lease is sure to hold: the send time of the claim or of the last
	// heartbeat that renewed it, plus the lease.
	validUntil time.Time
	// pred is, for a reservation (store.Claimed.After) whose step runs in
	// its predecessor's slot, the predecessor's claim until the outcome
	// that passes the slot commits: the step must stop before either lease
	// may end (see leaseWatchdog).
	pred *claimState
}

// stop cancels the claim's step context, if its step has started.
func (st *claimState) stop() {
	if st.cancel != nil {
		st.cancel()
	}
}

// held returns the claims a heartbeat renews: those not given up, in id
// order (the lock order of every statement that locks several rows).
func (c *claims) held() []store.ClaimRef {
	c.mu.Lock()
	refs := make([]store.ClaimRef, 0, len(c.inflight))
	for _, st := range c.inflight {
		if !st.lost {
			refs = append(refs, st.ref)
		}
	}
	c.mu.Unlock()
	sort.Slice(refs, func(i, j int) bool { return refs[i].ID < refs[j].ID })
	return refs
}

// renewed applies a heartbeat's answer: a lost claim's step is stopped, a
// renewed one's lease holds until validUntil, and a canceled one's step is
// stopped too; it returns the reservations queued after the canceled
// claims, for the caller to give back. Claims are matched by id and fence:
// this engine may have committed a claim and claimed the same instance
// again while the heartbeat was in flight, and the answer about the old
// claim says nothing about the new one.
func (c *claims) renewed(refs []store.ClaimRef, res store.HeartbeatResult, validUntil time.Time) []store.ClaimRef {
	gone := make(map[store.ClaimRef]bool, len(res.Lost))
	for _, r := range res.Lost {
		gone[r] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range refs {
		st := c.inflight[r.ID]
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
		if st := c.inflight[r.ID]; st != nil && st.ref == r {
			st.canceled = true
			st.stop()
			back = append(back, c.unqueue(r)...)
		}
	}
	return back
}

// expire gives up the claims whose lease may end before deadline by this
// engine's clock (see leaseWatchdog): their steps are stopped. A successor
// running in its predecessor's slot holds it by the leases of the claims
// before it as much as by its own. It returns how many it gave up.
func (c *claims) expire(deadline time.Time) int {
	n := 0
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.inflight {
		if st.lost {
			continue
		}
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
	return n
}

// unqueue takes reservation ref, if it is queued in a chain and not
// started, out of its chain with the reservations after it, and returns
// them (mu held): the slot's step before it frees its slot instead.
func (c *claims) unqueue(ref store.ClaimRef) []store.ClaimRef {
	for pred, r := range c.succ {
		if r.ID == ref.ID && r.Fence == ref.Fence {
			return c.popChain(pred)
		}
	}
	return nil
}

// popChain removes the reservations queued after id from succ and returns
// them (mu held).
func (c *claims) popChain(id store.ClaimRef) []store.ClaimRef {
	var refs []store.ClaimRef
	for r, ok := c.succ[id]; ok; r, ok = c.succ[id] {
		delete(c.succ, id)
		id = store.ClaimRef{ID: r.ID, Fence: r.Fence}
		refs = append(refs, id)
	}
	return refs
}
