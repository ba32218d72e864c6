package memory

import (
	"slices"
	"time"

	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
)

// This file is the memory backend's side of successor reservations (see
// store.Claimed.After): a reserved row is blocked, off every heap (no
// claim, promotion or hand-off takes it), and belongs to a worker under a
// fence and a lease, like a claim; an outcome that names it as its
// Successor passes it the outcome's slot, as it is, in the same call. The
// decisions are admission's (Decide's rule through admission.Deal for a
// claim, admission.Free for an outcome), as in PostgreSQL.

// reservation returns the row if (worker, fence) is its current
// reservation.
func (s *Store) reservation(id, worker string, fence int64) *row {
	r := s.reserved[id]
	if r == nil || r.inst.Worker != worker || r.inst.Fence != fence {
		return nil
	}
	return r
}

// reserve makes waiting row r (ready or blocked, on a heap) a reservation
// of worker, the successor of row after.
func (s *Store) reserve(r *row, worker, after string, lease time.Duration, now time.Time) store.Claimed {
	s.unpick(r)
	r.inst.Status = store.StatusBlocked
	r.inst.Worker = worker
	r.inst.Fence++
	r.inst.LeaseExpiresAt = now.Add(lease)
	r.inst.UpdatedAt = now
	s.reserved[r.inst.ID] = r
	c := r.claimed()
	c.Contended, c.After = true, after
	return c
}

// unreserve ends r's reservation: r is then a blocked row on no heap,
// which the caller places.
func (s *Store) unreserve(r *row) {
	delete(s.reserved, r.inst.ID)
	r.inst.Worker = ""
	r.inst.LeaseExpiresAt = time.Time{}
}

// giveBack ends reservation r for good (released, or its lease expired):
// it becomes ready in its place, crediting nothing (it held no slot), or
// canceled if its cancel was requested.
func (s *Store) giveBack(r *row, now time.Time, n *notes) {
	s.unreserve(r)
	r.inst.UpdatedAt = now
	if r.inst.CancelRequested {
		s.finish(r, store.StatusCanceled, now, n)
		return
	}
	s.requeue(r, now, n)
}

// succeed passes the slots of executing row pred to its reservation succ,
// which becomes executing under its reservation's fence with pred's shards
// (a reservation holds the same keys as the row it follows: see
// admission.Free): the keys' slots in use do not change. pred stays
// executing until its outcome is applied, which then frees nothing
// (passed).
func (s *Store) succeed(pred, succ *row, lease time.Duration, now time.Time) {
	delete(s.reserved, succ.inst.ID)
	succ.inst.Status = store.StatusExecuting
	succ.inst.LeaseExpiresAt = now.Add(lease)
	succ.inst.StartedAt = now
	succ.inst.KeyShard = pred.inst.KeyShard
	succ.inst.AlsoShards = slices.Clone(pred.inst.AlsoShards)
	succ.inst.UpdatedAt = now
	s.executing[succ.inst.ID] = succ
	q := s.queue(succ.inst.Queue)
	q.executing++
	for _, k := range succ.keys() {
		s.keys[k].executing++
		q.keyExec[k]++
	}
	pred.passed = true
}

// passSlots passes, along each chain of the batch, the slot of every
// outcome that names a current reservation of worker as its Successor, in
// the order the chain runs (a successor's own outcome may come earlier in
// the batch than its predecessor's). A successor of another key or queue
// than its predecessor's is refused (ErrInvalid from the caller's check).
// It returns, for each successor passed a slot, its predecessor's index
// in outcomes.
func (s *Store) passSlots(worker string, outcomes []store.Outcome, lease time.Duration, now time.Time) map[string]int {
	passed := map[string]int{}
	for progress := true; progress; {
		progress = false
		for i, o := range outcomes {
			if o.Successor.ID == "" {
				continue
			}
			if _, done := passed[o.Successor.ID]; done {
				continue
			}
			pred := s.current(o.ID, worker, o.Fence)
			succ := s.reservation(o.Successor.ID, worker, o.Successor.Fence)
			if pred == nil || pred.passed || succ == nil {
				continue
			}
			s.succeed(pred, succ, lease, now)
			passed[succ.inst.ID] = i
			progress = true
		}
	}
	return passed
}

// claimReservations reserves, for a claim of worker, the rows its lines
// hold under admission.Deal, and returns them as claimed rows.
func (s *Store) claimReservations(claimed []store.Claimed, line map[string][]string, req store.ClaimRequest, now time.Time) []store.Claimed {
	admitted := make([]admission.Admitted, len(claimed))
	keys := make([]string, len(claimed))
	for i, c := range claimed {
		admitted[i] = admission.Admitted{ID: c.ID, Shard: c.KeyShard}
		if len(c.Also) == 0 {
			keys[i] = c.Key // a row of several keys takes no successor
		}
	}
	var out []store.Claimed
	for _, rv := range admission.Deal(admitted, keys, line, req.Reserve) {
		out = append(out, s.reserve(s.rows[rv.ID], req.Worker, rv.After, req.Lease, now))
	}
	return out
}
