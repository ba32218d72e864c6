package memory

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// This file holds the admission rules of the memory backend, top to bottom:
// the pick order, the K = 1 rule, gate counters and their shards, blocking a
// row whose key is full, and promoting the next blocked row when a slot frees.

// Claim moves up to req.Limit ready rows of req.Queue to executing, in
// priority then FIFO order, admitting each keyed row through its key. A row
// whose key is full is blocked (taken off the pick path) and the scan goes
// on, so a saturated key never hides later work of other keys.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	switch {
	case req.Worker == "":
		return store.ClaimResult{}, errors.New("claim: empty worker")
	case req.Lease <= 0:
		return store.ClaimResult{}, errors.New("claim: lease must be positive")
	}
	if err := s.lock(); err != nil {
		return store.ClaimResult{}, err
	}
	n := &notes{}
	defer s.unlock(n)
	now := s.now(req.Now)
	var res store.ClaimResult
	q := s.queues[req.Queue]
	if q == nil || req.Limit <= 0 {
		return res, nil
	}
	var skipped []*row // due rows of workflows this worker does not know
	for _, p := range q.prios {
		h := q.ready[p]
		for len(res.Claimed) < req.Limit && h.Len() > 0 {
			r := h.min()
			if r.inst.RunAt.After(now) {
				break // the rest of this priority is scheduled later
			}
			h.popMin()
			if len(req.Workflows) > 0 && !slices.Contains(req.Workflows, r.inst.Workflow) {
				skipped = append(skipped, r)
				continue
			}
			shard, ok := s.admit(r)
			if !ok {
				r.inst.Status = store.StatusBlocked
				s.keys[r.inst.Key].blocked.add(r)
				continue
			}
			res.Claimed = append(res.Claimed, s.startClaim(r, req, shard, now))
		}
		if len(res.Claimed) >= req.Limit {
			break
		}
	}
	if len(res.Claimed) < req.Limit {
		res.NextDue = s.nextDue(q, now)
	}
	for _, r := range skipped {
		q.ready[r.inst.Priority].add(r)
	}
	s.dropEmptyPriorities(q)
	return res, nil
}

// admit decides whether r may execute now and debits its slot: a row with no
// key always; a K = 1 key when no row of the key executes; a gate key when
// it has room and then from the shard with the most free slots (lowest
// index first, so load spreads and the choice is deterministic). It returns
// the shard debited (-1 when none).
func (s *Store) admit(r *row) (int, bool) {
	if r.inst.Key == "" {
		return -1, true
	}
	ks := s.key(r.inst.Key)
	lim, gated := s.limits.Lookup(gate.NameOf(r.inst.Key))
	if !gated {
		return -1, ks.executing == 0
	}
	s.ensureCounters(ks, lim)
	if s.room(r.inst.Key, ks) == 0 {
		return -1, false
	}
	best := -1
	for i, c := range ks.counters {
		if c.available > 0 && (best < 0 || c.available > ks.counters[best].available) {
			best = i
		}
	}
	ks.counters[best].available--
	return best, true
}

// startClaim makes r an executing row of req.Worker under a new fence.
func (s *Store) startClaim(r *row, req store.ClaimRequest, shard int, now time.Time) store.Claimed {
	r.inst.Status = store.StatusExecuting
	r.inst.Worker = req.Worker
	r.inst.Fence++
	r.inst.LeaseExpiresAt = now.Add(req.Lease)
	r.inst.StartedAt = now
	r.inst.KeyShard = shard
	r.inst.UpdatedAt = now
	s.executing[r.inst.ID] = r
	if r.inst.Key != "" {
		s.keys[r.inst.Key].executing++
	}
	c := store.Claimed{Instance: r.snapshot(), TimedOut: r.timedOut}
	if r.wake != nil {
		c.Signal = r.wake.snapshot()
	}
	return c
}

// leaveExecuting takes r out of executing. When credit is true the gate
// shard r debited gets its slot back (crash paths pass false: they
// under-credit and the reconciler repairs). A K = 1 key is free as soon as
// no row of it executes. Either way the next blocked row of the key is
// promoted if the key now has room.
func (s *Store) leaveExecuting(r *row, credit bool, n *notes) {
	delete(s.executing, r.inst.ID)
	r.inst.Worker = ""
	r.inst.LeaseExpiresAt = time.Time{}
	r.inst.StartedAt = time.Time{}
	shard := r.inst.KeyShard
	r.inst.KeyShard = -1
	if r.inst.Key == "" {
		return
	}
	ks := s.keys[r.inst.Key]
	ks.executing--
	if credit && shard >= 0 && ks.counters != nil {
		c := &ks.counters[shard%len(ks.counters)]
		c.available = min(c.capacity, c.available+1)
	}
	s.promote(r.inst.Key, 1, n)
}

// room is how many more rows of key k would be admitted now. For a gate it
// is the sum over its shards, so a shard in debt (see ensureCounters)
// holds back the free slots of the others until the key is under its
// limit again.
func (s *Store) room(k string, ks *keyState) int {
	lim, gated := s.limits.Lookup(gate.NameOf(k))
	if !gated {
		return max(0, 1-ks.executing)
	}
	if ks.counters == nil {
		return max(0, lim.Limit-ks.executing)
	}
	free := 0
	for _, c := range ks.counters {
		free += c.available
	}
	return max(0, free)
}

// promote makes up to n blocked rows of key k ready again, in admission
// order, but never more than the key has room for. A freed slot promotes
// one row; the reconciler and a limit change promote as many as fit.
// It returns how many rows it promoted.
func (s *Store) promote(k string, n int, ns *notes) int {
	ks := s.keys[k]
	if ks == nil {
		return 0
	}
	n = min(n, s.room(k, ks), ks.blocked.Len())
	for range n {
		r := ks.blocked.popMin()
		s.setReady(r, r.inst.RunAt, ns)
	}
	s.dropKeyIfIdle(k)
	return max(n, 0)
}

// promoteFree promotes the blocked rows of key k that fit in its room beside
// the key's rows already ready and due at now: the reconciler's repair for
// a slot that freed without promoting (a crash path, a limit change).
func (s *Store) promoteFree(k string, now time.Time, ns *notes) int {
	ks := s.keys[k]
	if ks == nil || ks.blocked.Len() == 0 {
		return 0
	}
	due := 0
	for _, r := range ks.rows {
		if r.inst.Status == store.StatusReady && !r.inst.RunAt.After(now) {
			due++
		}
	}
	return s.promote(k, s.room(k, ks)-due, ns)
}

// ensureCounters creates the slot counters of a gate key on first use,
// starting from the truth: capacity minus the rows of the key already
// executing (rows admitted under another limit count against shard 0).
// A shard with more executing rows than capacity (the limit was lowered
// under them) starts in debt, below zero: its completions pay the debt off
// before any new row is admitted, so a lowered limit is never exceeded by
// new admissions.
func (s *Store) ensureCounters(ks *keyState, lim gate.Limit) {
	caps := lim.ShardCapacities()
	if len(ks.counters) == len(caps) {
		return
	}
	used := s.executingByShard(ks, len(caps))
	ks.counters = make([]counter, len(caps))
	for i, c := range caps {
		ks.counters[i] = counter{capacity: c, available: c - used[i]}
	}
}

// executingByShard counts the key's executing rows per shard of a
// shards-wide counter set; a row with no shard (admitted under K = 1) or a
// shard beyond the set counts against shard index modulo shards.
func (s *Store) executingByShard(ks *keyState, shards int) []int {
	used := make([]int, shards)
	for _, r := range ks.rows {
		if r.inst.Status != store.StatusExecuting {
			continue
		}
		i := r.inst.KeyShard
		if i < 0 {
			i = 0
		}
		used[i%shards]++
	}
	return used
}

// nextDue is the earliest time a row of q becomes eligible or an await of q
// times out. Called after a claim scan, when every due row of q was taken,
// blocked or set aside, so each ready heap's minimum is a future row.
func (s *Store) nextDue(q *queueState, now time.Time) time.Time {
	var next time.Time
	for _, p := range q.prios {
		if r := q.ready[p].min(); r != nil && r.inst.RunAt.After(now) && (next.IsZero() || r.inst.RunAt.Before(next)) {
			next = r.inst.RunAt
		}
	}
	if r := q.timers.min(); r != nil && (next.IsZero() || r.inst.TimeoutAt.Before(next)) {
		next = r.inst.TimeoutAt
	}
	return next
}

func (s *Store) dropEmptyPriorities(q *queueState) {
	q.prios = slices.DeleteFunc(q.prios, func(p int) bool {
		if q.ready[p].Len() == 0 {
			delete(q.ready, p)
			return true
		}
		return false
	})
}
