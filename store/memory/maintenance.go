package memory

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// FireTimers makes awaits whose timeout is at or before now ready; their
// next claim has TimedOut set.
func (s *Store) FireTimers(ctx context.Context, now time.Time) (int, error) {
	if err := s.lock(); err != nil {
		return 0, err
	}
	n := &notes{}
	defer s.unlock(n)
	now = s.now(now)
	fired := 0
	for _, name := range s.sortedQueues() {
		fired += s.fireTimers(s.queues[name], now, n)
	}
	return fired, nil
}

// fireTimers makes the awaits of q whose timeout is at or before now ready
// and returns how many.
func (s *Store) fireTimers(q *queueState, now time.Time, n *notes) int {
	fired := 0
	for q.timers.Len() > 0 && !q.timers.min().inst.TimeoutAt.After(now) {
		r := q.timers.popMin()
		at := r.inst.TimeoutAt
		r.timedOut = true
		r.inst.AwaitSignal, r.inst.TimeoutAt = "", time.Time{}
		r.inst.UpdatedAt = now
		s.setReady(r, at, now, n)
		fired++
	}
	return fired
}

// Reap takes back claims whose lease expired at or before now.
func (s *Store) Reap(ctx context.Context, now time.Time) (int, error) {
	if err := s.lock(); err != nil {
		return 0, err
	}
	n := &notes{}
	defer s.unlock(n)
	now = s.now(now)
	return s.takeBack(func(r *row) bool { return !r.inst.LeaseExpiresAt.After(now) }, now, n), nil
}

// ReclaimWorker takes back every claim held by worker.
func (s *Store) ReclaimWorker(ctx context.Context, worker string, now time.Time) (int, error) {
	if err := s.lock(); err != nil {
		return 0, err
	}
	n := &notes{}
	defer s.unlock(n)
	now = s.now(now)
	return s.takeBack(func(r *row) bool { return r.inst.Worker == worker }, now, n), nil
}

// takeBack returns the executing rows matching pick to ready with attempt
// + 1. It is a crash path: a K = 1 key is free at once, but gate slots are
// not credited (the reconciler repairs them). A waking signal or timeout
// stays with the row, so the next run sees it again. A row whose cancel was
// requested becomes canceled instead. Reservations matching pick are given
// back (ready in their place, attempt unchanged: they hold no slot).
func (s *Store) takeBack(pick func(*row) bool, now time.Time, n *notes) int {
	var rows, reserved []*row
	for _, r := range s.executing {
		if pick(r) {
			rows = append(rows, r)
		}
	}
	for _, r := range s.reserved {
		if pick(r) {
			reserved = append(reserved, r)
		}
	}
	slices.SortFunc(reserved, func(a, b *row) int { return cmp.Compare(a.seq, b.seq) })
	for _, r := range reserved {
		s.giveBack(r, now, n)
	}
	slices.SortFunc(rows, func(a, b *row) int { return cmp.Compare(a.seq, b.seq) })
	for _, r := range rows {
		s.leaveExecuting(r, false, n)
		r.inst.UpdatedAt = now
		if r.inst.CancelRequested {
			s.finish(r, store.StatusCanceled, now, n)
			continue
		}
		r.inst.Attempt++
		s.requeue(r, now, n)
	}
	return len(rows) + len(reserved)
}

// Reconcile repairs gate counters from the executing rows, promotes blocked
// rows whose key has room, deletes idle counters, and deletes terminal rows
// (with their signals and history) last updated before now − retention.
func (s *Store) Reconcile(ctx context.Context, retention time.Duration, now time.Time) (store.ReconcileReport, error) {
	if err := s.lock(); err != nil {
		return store.ReconcileReport{}, err
	}
	n := &notes{}
	defer s.unlock(n)
	now = s.now(now)
	for name, c := range s.liveChanges {
		if now.Sub(c.at) >= store.LiveChangeFor {
			delete(s.liveChanges, name)
		}
	}
	var rep store.ReconcileReport
	for _, k := range s.sortedKeys() {
		ks := s.keys[k]
		lim, gated := s.limits.For(k)
		if ks.counters != nil && gated {
			fixed, drift := s.repairCounters(ks, lim)
			rep.CountersRepaired += fixed
			rep.Drift += drift
		}
		rep.Promoted += s.promoteFree(k, now, n)
		if ks.counters != nil && (!gated || ks.executing == 0) {
			rep.CountersDeleted += len(ks.counters)
			ks.counters = nil
			s.dropKeyIfIdle(k)
		}
	}
	rep.BucketsDeleted = s.collectBuckets(now)
	if retention > 0 {
		rep.InstancesDeleted = s.deleteOld(now.Add(-retention))
	}
	return rep, nil
}

// collectBuckets deletes the rate buckets that are full at now (a missing
// bucket starts full, so deleting one grants nothing unearned) and those of
// names without a rate limit of their scope.
func (s *Store) collectBuckets(now time.Time) int {
	deleted := 0
	for id, b := range s.buckets {
		rate, ok := s.rates.Lookup(gate.NameOf(id))
		if !ok || rate.PerKey != strings.Contains(id, ":") || rate.IsFull(b, now) {
			delete(s.buckets, id)
			deleted++
		}
	}
	return deleted
}

// repairCounters sets every shard of a gate key to capacity − executing rows
// debited to it, resizing the set when the limit changed. It returns the
// number of shards corrected and the total absolute correction.
func (s *Store) repairCounters(ks *keyState, lim gate.Limit) (fixed, drift int) {
	caps := lim.ShardCapacities()
	used := s.executingByShard(ks, len(caps))
	if len(ks.counters) != len(caps) {
		before, after := 0, 0
		for _, c := range ks.counters {
			before += c.available
		}
		ks.counters = make([]counter, len(caps))
		for i, c := range caps {
			ks.counters[i] = counter{capacity: c, available: c - used[i]}
			after += ks.counters[i].available
		}
		return len(caps), abs(after - before)
	}
	for i, c := range caps {
		want := c - used[i]
		if ks.counters[i].available != want || ks.counters[i].capacity != c {
			fixed++
			drift += abs(want - ks.counters[i].available)
			ks.counters[i] = counter{capacity: c, available: want}
		}
	}
	return fixed, drift
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// deleteOld removes terminal rows updated before cutoff.
func (s *Store) deleteOld(cutoff time.Time) int {
	n, _ := s.deleteTerminal("", time.Time{}, cutoff, 0)
	return n
}

// DeleteTerminal deletes up to limit terminal instances of workflow last
// changed before before and not before from, oldest first (see
// store.Store).
func (s *Store) DeleteTerminal(ctx context.Context, workflow string, from, before time.Time, limit int) (int, time.Time, error) {
	if err := s.lock(); err != nil {
		return 0, from, err
	}
	defer s.unlock(&notes{})
	if limit <= 0 {
		return 0, from, nil
	}
	n, last := s.deleteTerminal(workflow, from, before, limit)
	return n, last, nil
}

// deleteTerminal deletes the terminal rows (of workflow, unless empty)
// last changed before cutoff and not before from, the oldest limit of them
// (all when limit is 0), and returns how many and the latest UpdatedAt of
// them (from when none).
func (s *Store) deleteTerminal(workflow string, from, cutoff time.Time, limit int) (int, time.Time) {
	var old []*row
	for _, r := range s.rows {
		if r.inst.Status.Terminal() && r.inst.UpdatedAt.Before(cutoff) && !r.inst.UpdatedAt.Before(from) &&
			(workflow == "" || r.inst.Workflow == workflow) {
			old = append(old, r)
		}
	}
	if limit > 0 && len(old) > limit {
		slices.SortFunc(old, func(a, b *row) int {
			return cmp.Or(a.inst.UpdatedAt.Compare(b.inst.UpdatedAt), cmp.Compare(a.inst.ID, b.inst.ID))
		})
		old = old[:limit]
	}
	last := from
	for _, r := range old {
		if r.inst.UpdatedAt.After(last) {
			last = r.inst.UpdatedAt
		}
		delete(s.rows, r.inst.ID)
		for _, sg := range r.inbox {
			delete(s.signals, sg.sig.ID)
		}
		if m := s.unique[r.inst.UniqueKey]; m != nil {
			delete(m, r.inst.ID)
			if len(m) == 0 {
				delete(s.unique, r.inst.UniqueKey)
			}
		}
		if kids := s.children[r.inst.ParentID]; kids != nil {
			kids = slices.DeleteFunc(kids, func(c *row) bool { return c == r })
			if len(kids) == 0 {
				delete(s.children, r.inst.ParentID)
			} else {
				s.children[r.inst.ParentID] = kids
			}
		}
	}
	return len(old), last
}

func (s *Store) sortedKeys() []string {
	ks := make([]string, 0, len(s.keys))
	for k := range s.keys {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func (s *Store) sortedQueues() []string {
	qs := make([]string, 0, len(s.queues))
	for q := range s.queues {
		qs = append(qs, q)
	}
	slices.SortFunc(qs, strings.Compare)
	return qs
}

// AcquireLease takes or renews a named lease (see store.Store).
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (bool, error) {
	if name == "" || holder == "" || ttl <= 0 {
		return false, fmt.Errorf("acquire lease: %w: name, holder and a positive ttl are required", store.ErrInvalid)
	}
	if err := s.lock(); err != nil {
		return false, err
	}
	defer s.unlock(nil)
	now = s.now(now)
	if l, ok := s.leases[name]; ok && l.holder != holder && !l.expires.Before(now) {
		return false, nil
	}
	s.leases[name] = lease{holder: holder, expires: now.Add(ttl)}
	return true, nil
}
