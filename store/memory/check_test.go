package memory

import (
	"fmt"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// check verifies every internal invariant of the store: each row sits in
// exactly the index its status calls for, key and counter bookkeeping
// matches the rows, no key exceeds its K, every heap is a valid heap, and
// no blocked row is stranded behind a key with room. legacy names the claims
// (id → fence) that were executing when the limits last changed: a lowered
// limit does not preempt them, so a key may exceed its new K only by them.
func (s *Store) check(legacy map[string]int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	execByKey := map[string]int{}
	legacyByKey := map[string]int{}
	readyByKey := map[string]int{}
	for id, r := range s.rows {
		in := &r.inst
		if in.ID != id {
			return fmt.Errorf("row %s indexed as %s", in.ID, id)
		}
		q := s.queues[in.Queue]
		switch in.Status {
		case store.StatusReady:
			if q == nil || r.pickHeap == nil || (r.pickHeap != q.ready[in.Priority] && r.pickHeap != q.scheduled) {
				return fmt.Errorf("ready row %s not on its queue's heap", id)
			}
			if r.pickHeap != q.scheduled && !r.hasRound {
				return fmt.Errorf("ready row %s has no round", id)
			}
			readyByKey[in.Key]++
		case store.StatusBlocked:
			if ks := s.keys[in.Key]; ks == nil || r.pickHeap != ks.blocked {
				return fmt.Errorf("blocked row %s not on its key's heap", id)
			}
		default:
			if r.pickHeap != nil {
				return fmt.Errorf("%s row %s on a pick heap", in.Status, id)
			}
		}
		wantTimer := in.Status == store.StatusAwaiting && !in.TimeoutAt.IsZero()
		if wantTimer != (r.timerHeap != nil) || (wantTimer && r.timerHeap != q.timers) {
			return fmt.Errorf("row %s (%s) timer index wrong", id, in.Status)
		}
		_, inExec := s.executing[id]
		if inExec != (in.Status == store.StatusExecuting) {
			return fmt.Errorf("row %s (%s) executing index wrong", id, in.Status)
		}
		if in.Status == store.StatusExecuting && in.Key != "" {
			execByKey[in.Key]++
			if f, ok := legacy[id]; ok && f == in.Fence {
				legacyByKey[in.Key]++
			}
		}
		if in.Status != store.StatusExecuting && in.KeyShard != -1 {
			return fmt.Errorf("row %s (%s) keeps shard %d", id, in.Status, in.KeyShard)
		}
		if in.Key != "" {
			ks := s.keys[in.Key]
			attached := ks != nil && ks.rows[id] == r
			if attached == in.Status.Terminal() {
				return fmt.Errorf("row %s (%s) key attachment wrong", id, in.Status)
			}
		}
		if in.Status == store.StatusChildren {
			pending := 0
			for _, c := range s.children[id] {
				if !c.inst.Status.Terminal() && c.joinGen == r.spawns {
					pending++
				}
			}
			if pending != in.PendingChildren {
				return fmt.Errorf("parent %s pending %d, has %d live children", id, in.PendingChildren, pending)
			}
		}
	}
	for k, ks := range s.keys {
		if ks.executing != execByKey[k] {
			return fmt.Errorf("key %s counts %d executing, rows say %d", k, ks.executing, execByKey[k])
		}
		for id, r := range ks.rows {
			if r.inst.Key != k || s.rows[id] != r {
				return fmt.Errorf("key %s holds foreign row %s", k, id)
			}
		}
		lim, gated := s.limits.Lookup(gate.NameOf(k))
		k1 := 1
		if gated {
			k1 = lim.Limit
		}
		if ks.executing > max(k1, legacyByKey[k]) {
			return fmt.Errorf("key %s has %d executing, K %d, %d from before the last limit change", k, ks.executing, k1, legacyByKey[k])
		}
		if ks.counters != nil && (!gated || len(ks.counters) != lim.Shards) {
			return fmt.Errorf("key %s has %d counters for limit %+v", k, len(ks.counters), lim)
		}
		caps := lim.ShardCapacities()
		var used []int
		if ks.counters != nil {
			used = s.executingByShard(ks, len(ks.counters))
		}
		for i, c := range ks.counters {
			if c.available > c.capacity || c.capacity != caps[i] {
				return fmt.Errorf("key %s shard %d: available %d of %d, want capacity %d", k, i, c.available, c.capacity, caps[i])
			}
			// Crash paths may under-credit, never over-credit.
			if c.available > c.capacity-used[i] {
				return fmt.Errorf("key %s shard %d over-credited: %d free of %d with %d executing", k, i, c.available, c.capacity, used[i])
			}
		}
		if ks.blocked.Len() > 0 && s.room(k, ks) > 0 && readyByKey[k] == 0 && s.policyRoom(k, ks) {
			return fmt.Errorf("key %s has room %d but %d blocked rows and none ready", k, s.room(k, ks), ks.blocked.Len())
		}
		if err := ks.blocked.verify(); err != nil {
			return fmt.Errorf("key %s blocked heap: %w", k, err)
		}
	}
	for name, q := range s.queues {
		exec, keyExec := 0, map[string]int{}
		for _, r := range s.executing {
			if r.inst.Queue == name {
				exec++
				if r.inst.Key != "" {
					keyExec[r.inst.Key]++
				}
			}
		}
		if exec != q.executing || len(keyExec) != len(q.keyExec) {
			return fmt.Errorf("queue %s counts %d executing over %d keys, rows say %d over %d", name, q.executing, len(q.keyExec), exec, len(keyExec))
		}
		for k, n := range keyExec {
			if q.keyExec[k] != n {
				return fmt.Errorf("queue %s counts %d executing rows of %s, rows say %d", name, q.keyExec[k], k, n)
			}
		}
		if err := q.scheduled.verify(); err != nil {
			return fmt.Errorf("queue %s scheduled: %w", name, err)
		}
		for p, h := range q.ready {
			if err := h.verify(); err != nil {
				return fmt.Errorf("queue %s priority %d: %w", name, p, err)
			}
		}
		if err := q.timers.verify(); err != nil {
			return fmt.Errorf("queue %s timers: %w", name, err)
		}
	}
	return nil
}

// verify checks the heap property and every row's remembered position.
func (h *rowHeap) verify() error {
	for i, r := range h.rows {
		idx, owner := r.pickIdx, r.pickHeap
		if h.timer {
			idx, owner = r.timerIdx, r.timerHeap
		}
		if idx != i || owner != h {
			return fmt.Errorf("row %s at %d remembers %d", r.inst.ID, i, idx)
		}
		if i > 0 && h.less(r, h.rows[(i-1)/2]) {
			return fmt.Errorf("heap order broken at %d", i)
		}
	}
	return nil
}

// policyRoom reports whether some blocked row of key k sits in a queue whose
// per-key budget has room for k: a row blocked only by a full per-key budget
// is promoted when a row of its key leaves executing there, not before.
func (s *Store) policyRoom(k string, ks *keyState) bool {
	for _, r := range ks.blocked.rows {
		p, ok := s.policies[r.inst.Queue]
		if !ok || p.MaxActivePerKey == 0 || s.queues[r.inst.Queue].keyExec[k] < p.MaxActivePerKey {
			return true
		}
	}
	return false
}
