package memory

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
)

// This file holds the admission rules of the memory backend, top to bottom:
// the pick order (priority, then rounds so that keys take turns), the K = 1
// rule, gate counters and their shards, queue policies, rate limits,
// blocking a row whose key is full, rescheduling a row that waits for a
// token, and promoting the next blocked row when a slot frees.

// Claim moves up to req.Limit ready rows of req.Queue to executing, in
// priority, round, run_at, insertion order, admitting each row through
// every limit that applies to it (see store.Store). A row whose key is full
// is blocked (taken off the pick path), a row waiting for a token is
// rescheduled, and the scan goes on, so neither hides later work of other
// keys. The scan stops when the queue's MaxActive is reached.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if ok, err := store.NormalizeClaim(&req); !ok {
		return store.ClaimResult{}, err
	}
	if err := s.lock(); err != nil {
		return store.ClaimResult{}, err
	}
	n := &notes{}
	defer s.unlock(n)
	now := s.now(req.Now)
	var res store.ClaimResult
	q := s.queues[req.Queue]
	if q == nil {
		_, res.Paused = s.paused[req.Queue]
		return res, nil
	}
	s.fireTimers(q, now, n) // an await that timed out is claimable at once, as in PostgreSQL
	s.promoteDue(q, now)
	if _, paused := s.paused[req.Queue]; paused {
		res.NextDue = s.nextDue(q) // its rows wait, ready, for the resume
		res.Paused = true
		return res, nil
	}
	pol, hasPol := s.policies[req.Queue]
	waiting := map[string]int{}  // rate bucket -> rows rescheduled by this claim
	var skipped []*row           // due rows of workflows this worker does not know, or left ready
	seen := map[string]int{}     // K = 1 key -> its rows this claim took off the pick path to decide
	var line map[string][]string // full key -> its rows this claim blocked that may be reserved (admission.Decide's rule)
	stopped := map[string]bool{} // keys whose line a blocked row of several keys stopped
	leftReady := false           // a row was left ready: the rows after it are not in turn
scan:
	for _, p := range q.prios {
		h := q.ready[p]
		for len(res.Claimed) < req.Limit && h.Len() > 0 {
			if hasPol && q.executing >= pol.MaxActive {
				break scan // the queue is at its fleet-wide budget: rows stay ready
			}
			r := h.popMin()
			if !store.Runs(req.Workflows, r.inst.Workflow, r.inst.Version) {
				skipped = append(skipped, r)
				continue
			}
			for _, k := range r.keys() {
				seen[k]++
			}
			d := s.admit(r, q, pol, hasPol, waiting, seen, now)
			if d.verdict != admitted && r.inst.Key != "" {
				res.PassedOver++ // the scan stops at Limit: every row it passed is ahead of the last one it admitted
			}
			switch d.verdict {
			case admitted:
				res.Claimed = append(res.Claimed, s.startClaim(r, req, d.shard, d.also, now))
			case blocked:
				r.blockedOn = d.blockedOn
				s.block(r)
				if r.multi() {
					// A key's line stops at a row of several keys blocked
					// on it (see admission.Decide).
					stopped[d.blockedOn] = true
					break
				}
				if _, rated := s.rates.Lookup(gate.NameOf(r.inst.Key)); req.Reserve > 0 && !hasPol && !leftReady && !rated && !stopped[r.inst.Key] {
					if line == nil {
						line = map[string][]string{}
					}
					line[r.inst.Key] = append(line[r.inst.Key], r.inst.ID)
				}
			case throttled:
				maps.Copy(waiting, d.rescheduled)
				r.inst.RunAt = d.runAt
				r.inst.UpdatedAt = now
				q.scheduled.add(r)
			case left:
				skipped = append(skipped, r)
				leftReady = true
			}
		}
		if len(res.Claimed) >= req.Limit {
			break
		}
	}
	reserved := s.claimReservations(res.Claimed, line, req, now)
	following := map[string]bool{} // rows with a successor reserved
	for _, r := range reserved {
		following[r.After] = true
	}
	for i, c := range res.Claimed {
		if following[c.ID] || s.anyKeyBlocked(s.rows[c.ID]) {
			res.Claimed[i].Contended = true
		}
	}
	if len(res.Claimed) < req.Limit {
		res.NextDue = s.nextDue(q)
	}
	res.Claimed = append(res.Claimed, reserved...) // after the rows admitted (store.ClaimRequest.Reserve)
	for _, r := range skipped {
		s.pushReady(q, r)
	}
	s.dropEmptyPriorities(q)
	return res, nil
}

// anyKeyBlocked reports whether a key of r has blocked rows: its outcome
// may hand the key's slot on (store.Claimed.Contended).
func (s *Store) anyKeyBlocked(r *row) bool {
	for _, k := range r.keys() {
		if ks := s.keys[k]; ks != nil && ks.blocked.Len() > 0 {
			return true
		}
	}
	return false
}

// verdict is what admission decided for one row.
type verdict int

const (
	admitted  verdict = iota
	blocked           // its key (or the queue's per-key budget) is full
	throttled         // its rate bucket holds no token
	left              // left ready by a limit of the queue
)

type decision struct {
	verdict   verdict
	shard     int    // the gate shard debited of the row's Key (-1: none)
	also      []int  // the gate shards debited of each of its Also (-1: none)
	blockedOn string // the key that blocked it (blocked)
	// rescheduled counts the rows of each bucket rescheduled, this one
	// included, and runAt is when its tokens are due (throttled).
	rescheduled map[string]int
	runAt       time.Time
}

// admit decides whether r may execute now, through the planner (package
// admission) that PostgreSQL's claim calls too, on a window of r alone: it
// builds the state the planner needs from the store (the claim holds the
// store's lock, so every K = 1 key is locked by it and no counter is held
// elsewhere) for each of r's keys, and applies the plan's debits. waiting
// counts the rows of each bucket this claim already rescheduled, seen the
// rows of each key it took off the pick path to decide (r included): with
// the key's rows still on it, they are the rows in sight
// (admission.State.InSight). The caller checked the queue's MaxActive and
// the claim's Limit.
func (s *Store) admit(r *row, q *queueState, pol store.ConcurrencyPolicy, hasPol bool, waiting, seen map[string]int, now time.Time) decision {
	c := admission.Candidate{ID: r.inst.ID}
	st := admission.State{Now: now, Limit: 1, Active: q.executing, Rescheduled: waiting,
		KeyActive: map[string]int{}, Locked: map[string]bool{}, Busy: map[string]bool{},
		Gates: map[string]admission.GateState{}, Buckets: map[string]gate.Bucket{}}
	if hasPol {
		st.Policy = &admission.Policy{MaxActive: pol.MaxActive, MaxActivePerKey: pol.MaxActivePerKey}
	}
	line := r.waitsOn() // the candidate's key: the line it waits in, as PostgreSQL's key column
	for _, k := range r.keys() {
		n := admission.Need{Key: k}
		ks := s.key(k)
		st.KeyActive[k] = q.keyExec[k]
		if lim, gated := s.limits.For(k); gated {
			s.ensureCounters(ks, lim)
			n.Gate = &lim
			g := admission.GateState{Counters: make([]admission.Counter, len(ks.counters))}
			for i, ct := range ks.counters {
				g.Counters[i] = admission.Counter{Shard: i, Capacity: ct.capacity, Available: ct.available}
			}
			st.Gates[k] = g
		} else {
			st.Locked[k] = true
			st.Busy[k] = ks.executing > 0
			if ks.executing > 0 {
				// The rows the claim took off the pick path and those still
				// on it, counted only as far as the planner needs (two).
				if st.InSight == nil {
					st.InSight = map[string]int{}
				}
				st.InSight[k] = seen[k] + ks.countReady(2-seen[k])
			}
		}
		if rate, limited := s.rates.Lookup(gate.NameOf(k)); limited {
			n.Rate = &rate
			bucket := rate.BucketFor(k)
			if b, ok := s.buckets[bucket]; ok {
				st.Buckets[bucket] = b
			}
		}
		if k == line {
			c.Key, c.Gate, c.Rate = n.Key, n.Gate, n.Rate
		} else {
			c.Also = append(c.Also, n)
		}
	}
	p := admission.Decide([]admission.Candidate{c}, st)
	// The plan is written as it is (only an admitted row debits anything).
	for sk, n := range p.Debits {
		s.keys[sk.Key].counters[sk.Shard].available -= n
	}
	for b, bk := range p.Buckets {
		s.buckets[b] = bk
	}
	switch {
	case len(p.Admitted) == 1:
		a := p.Admitted[0]
		d := decision{verdict: admitted, shard: a.Shard}
		if r.multi() {
			// The candidate's key is the row's line, not always its first
			// key: each shard goes to its key.
			shardOf := map[string]int{c.Key: a.Shard}
			for _, h := range a.Also {
				shardOf[h.Key] = h.Shard
			}
			d.shard = shardOf[r.inst.Key]
			for _, o := range r.inst.Also {
				d.also = append(d.also, shardOf[o.Key])
			}
		}
		return d
	case len(p.Blocked) == 1:
		on := p.BlockedOn[c.ID]
		if on == "" {
			on = c.Key
		}
		return decision{verdict: blocked, blockedOn: on}
	case len(p.Throttled) == 1:
		return decision{verdict: throttled, runAt: p.Throttled[0].RunAt, rescheduled: p.Rescheduled}
	}
	return decision{verdict: left}
}

// countReady counts the key's rows on the pick path, up to limit.
func (ks *keyState) countReady(limit int) int {
	n := 0
	for _, r := range ks.rows {
		if n >= limit {
			break
		}
		if r.onPickPath() {
			n++
		}
	}
	return n
}

// promoteDue moves the rows of q whose run time has come from the
// scheduled heap to the pick path, giving a round to each that has none
// (a row rescheduled for a token keeps its round).
func (s *Store) promoteDue(q *queueState, now time.Time) {
	var due []*row
	for q.scheduled.Len() > 0 && !q.scheduled.min().inst.RunAt.After(now) {
		due = append(due, q.scheduled.popMin())
	}
	s.assignRounds(due)
	for _, r := range due {
		s.pushReady(q, r)
	}
}

// assignRounds gives a round to each row of rows that has none, as
// admission.Rounds decides (see store.Store, Order). The rows are about to
// be made ready together: the current rounds and the keys' last rounds are
// read before any of them gets its round.
func (s *Store) assignRounds(rows []*row) {
	var fresh []*row
	for _, r := range rows {
		if !r.hasRound {
			fresh = append(fresh, r)
		}
	}
	if len(fresh) == 0 {
		return
	}
	in := make([]admission.RoundRow, len(fresh))
	for i, r := range fresh {
		in[i] = admission.RoundRow{RoundGroup: admission.RoundGroup{Queue: r.inst.Queue, Priority: r.inst.Priority, Key: r.inst.Key},
			At: r.inst.RunAt, Seq: r.seq}
	}
	rounds := admission.Rounds(in, func(g admission.RoundGroup) admission.Fresh {
		head := s.currentRound(g.Queue, g.Priority)
		if g.Key == "" {
			return admission.KeylessFresh(head)
		}
		last, taken, ok := s.keyLastRound(g.Key, g.Queue, g.Priority)
		return admission.KeyFresh(head, last, ok, taken, s.limits.K(g.Key))
	})
	for i, r := range fresh {
		r.round, r.hasRound = rounds[i], true
	}
}

// currentRound is the lowest round among the due ready rows of a queue and
// priority (0 when there are none).
func (s *Store) currentRound(queue string, prio int) int64 {
	if q := s.queues[queue]; q != nil {
		if h := q.ready[prio]; h != nil && h.Len() > 0 {
			return h.min().round
		}
	}
	return 0
}

// keyLastRound is the highest round among the due ready and blocked rows
// of key in a queue and priority, and how many of them have it (ok false:
// the key has none there).
func (s *Store) keyLastRound(key, queue string, prio int) (last int64, taken int, ok bool) {
	ks := s.keys[key]
	if ks == nil {
		return 0, 0, false
	}
	for _, r := range ks.rows {
		if !r.hasRound || r.inst.Key != key || r.inst.Queue != queue || r.inst.Priority != prio {
			continue // a row takes turns as a row of its Key
		}
		if r.inst.Status == store.StatusBlocked || (r.inst.Status == store.StatusReady && !r.scheduled()) {
			switch {
			case !ok || r.round > last:
				last, taken, ok = r.round, 1, true
			case r.round == last:
				taken++
			}
		}
	}
	return last, taken, ok
}

// startClaim makes r an executing row of req.Worker under a new fence,
// holding shard of its Key and also of each of its Also (-1: none).
func (s *Store) startClaim(r *row, req store.ClaimRequest, shard int, also []int, now time.Time) store.Claimed {
	r.inst.Status = store.StatusExecuting
	r.inst.Worker = req.Worker
	r.inst.Fence++
	r.inst.LeaseExpiresAt = now.Add(req.Lease)
	r.inst.StartedAt = now
	r.inst.KeyShard = shard
	r.inst.AlsoShards = slices.Clone(also)
	r.blockedOn = "" // executing, it holds every key; it waits in no line
	r.inst.UpdatedAt = now
	s.executing[r.inst.ID] = r
	q := s.queue(r.inst.Queue)
	q.executing++
	for _, k := range r.keys() {
		s.key(k).executing++
		q.keyExec[k]++
	}
	return r.claimed()
}

// claimed is r as a claim (or a reservation) returns it: with the signal
// or the timeout that woke it.
func (r *row) claimed() store.Claimed {
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
// promoted if the key now has room (see freeSlot), unless a hand-off is
// being decided (s.freeing is set): the freed slot is then recorded for it.
func (s *Store) leaveExecuting(r *row, credit bool, n *notes) {
	delete(s.executing, r.inst.ID)
	r.inst.Worker = ""
	r.inst.LeaseExpiresAt = time.Time{}
	r.inst.StartedAt = time.Time{}
	shard := r.inst.KeyShard
	r.inst.KeyShard = -1
	q := s.queue(r.inst.Queue)
	q.executing--
	if _, ok := s.policies[r.inst.Queue]; ok {
		// The queue's budget has room again: engines that stopped
		// claiming at it are told, as PostgreSQL's outcomes tell them
		// (sqlNotifyPolicyQueues).
		n.add(r.inst.Queue)
	}
	also := r.inst.AlsoShards
	r.inst.AlsoShards = nil
	for i, k := range r.keys() {
		if q.keyExec[k]--; q.keyExec[k] == 0 {
			delete(q.keyExec, k)
		}
		s.keys[k].executing--
		if r.passed {
			continue // the slot went on to its successor (a row of the same keys)
		}
		sh := shard
		if i > 0 {
			sh = -1
			if i-1 < len(also) {
				sh = also[i-1]
			}
		}
		if s.freeing != nil && credit {
			*s.freeing = append(*s.freeing, admission.Freed{Key: k, Shard: sh})
			continue
		}
		s.freeSlot(k, sh, credit, n)
	}
	r.passed = false
}

// triable adds to st.Tried the K = 1 keys among also (the other keys of a
// row in a freed key's line, as far as the hand-off reads it) that no slot
// of the batch frees (want) and that no row holds: the store's lock is the
// lock PostgreSQL tries (see admission.FreeState.Tried).
func (s *Store) triable(st *admission.FreeState, also []string, want map[string]int) {
	for _, k := range also {
		if _, freed := want[k]; freed {
			continue
		}
		if _, gated := s.limits.For(k); gated {
			continue
		}
		if ks := s.keys[k]; ks != nil && ks.executing > 0 {
			continue
		}
		if st.Tried == nil {
			st.Tried = map[string]bool{}
		}
		st.Tried[k] = true
	}
}

// freeSlot credits a slot of key k's shard (when credit is set and the
// slot was a gate's) and promotes the key's next blocked row if the key now
// has room.
//
// The credit is admission.Credit, the rule's one statement (PostgreSQL's
// sqlCredit is its SQL form). This store's counters are always shaped as
// the limit makes them (repairCounters reshapes them whenever limits
// change; a row's shard beyond them is credited to shard % count, as
// executingByShard counts it), so each counter's capacity is its share,
// and Credit never shrinks or drops one. This store keeps debt (after a
// lowered limit) as a negative available under that capacity where
// Credit would raise the capacity to the slots in use: it keeps Credit's
// slots in use (Capacity − Available), which makes the credit
// available = min(capacity, available + 1), as repairCounters and
// ensureCounters count it.
func (s *Store) freeSlot(k string, shard int, credit bool, n *notes) {
	ks := s.keys[k]
	if ks == nil {
		return
	}
	if credit && shard >= 0 && ks.counters != nil {
		i := shard % len(ks.counters)
		c := &ks.counters[i]
		var lim *gate.Limit
		if l, ok := s.limits.For(k); ok {
			lim = &l
		}
		next, _ := admission.Credit(admission.Counter{Shard: i, Capacity: c.capacity, Available: c.available}, 1, lim)
		c.available = c.capacity - (next.Capacity - next.Available)
	}
	if s.promote(k, 1, n) == 0 && shard < 0 {
		s.notifyReady(ks, n)
	}
}

// notifyReady notifies the queue of a ready row of K = 1 key ks that just
// freed with no blocked row to promote: a claim that found the key busy
// may have left its only row in sight ready (see admission.Decide), and
// an idle engine should claim it now rather than at its next poll.
func (s *Store) notifyReady(ks *keyState, n *notes) {
	for _, r := range ks.rows {
		if r.onPickPath() {
			n.add(r.inst.Queue)
			return
		}
	}
}

// handOff gives the slots the outcomes of one Complete freed to the next
// waiting rows of their keys as admission.Free decides (the rule
// PostgreSQL's hand-off follows too), claimed by worker, and with
// h.Reserve reserves successors for the rows it makes executing and for
// the successors already passed a slot (freed entries that name them); the
// other slots are freed as without a hand-off. It returns the rows handed
// off, then the reservations, the slots freed so, and the successors whose
// chains yield (admission.FreePlan.Yield).
func (s *Store) handOff(freed []admission.Freed, worker string, h store.HandOff, now time.Time, n *notes) ([]store.Claimed, []admission.Freed, []string) {
	st := admission.NewFreeState(h.Room, func(w string, v int) bool { return store.Runs(h.Workflows, w, v) })
	st.Reserve = h.Reserve
	st.Paused = s.pausedSet()
	want := map[string]int{}
	var keys []string
	succs := map[string]int{} // successors passed a slot of each key: executing, not busy with another row
	for _, f := range freed {
		if f.Successor != "" {
			succs[f.Key]++
		}
		if _, ok := want[f.Key]; !ok {
			keys = append(keys, f.Key)
		}
		n := 0
		if f.Successor == "" {
			n++
		}
		if h.Reserve {
			n += f.Ahead
		}
		want[f.Key] += max(n, 1) // a succession reads at least the key's next row, for its turn (Yield)
	}
	var waiting []admission.Waiting
	lineOf := map[string]string{} // waiting row -> the key whose line it is in
	for _, k := range keys {
		ks := s.keys[k]
		if ks == nil {
			continue
		}
		if lim, ok := s.limits.For(k); ok {
			st.Limits[k] = lim
		}
		st.Busy[k] = ks.executing-succs[k] > 0
		st.Count[k] = len(ks.counters)
		for i, c := range ks.counters {
			st.Counters[k] = append(st.Counters[k], admission.Counter{Shard: i, Capacity: c.capacity, Available: c.available})
		}
		if want[k] == 0 {
			continue
		}
		for _, r := range s.line(k, ks, want[k]) {
			_, policy := s.policies[r.inst.Queue]
			w := admission.Waiting{ID: r.inst.ID, Key: k, Queue: r.inst.Queue,
				Workflow: r.inst.Workflow, Version: r.inst.Version, Turn: turn(r), Head: s.head(r, h.Workflows), Policy: policy}
			_, w.Rated = s.rates.Lookup(gate.NameOf(k))
			if r.multi() {
				for _, o := range r.keys() {
					if _, rated := s.rates.Lookup(gate.NameOf(o)); rated {
						w.Rated = true
					}
					if o != k {
						w.Also = append(w.Also, o)
					}
				}
				w.AtFirst = k == r.inst.Key
				s.triable(&st, w.Also, want)
			}
			lineOf[w.ID] = k
			waiting = append(waiting, w)
		}
	}
	plan := admission.Free(freed, waiting, st)
	var claimed []store.Claimed
	req := store.ClaimRequest{Worker: worker, Lease: h.Lease}
	for _, a := range plan.HandOffs {
		r := s.rows[a.ID]
		s.unpick(r) // off its queue's pick path or its key's blocked rows
		shard, also := a.Shard, []int(nil)
		if r.multi() { // a.Shard is of the key it waited in line for
			shardOf := map[string]int{lineOf[a.ID]: a.Shard}
			for _, o := range a.Also {
				shardOf[o.Key] = o.Shard
			}
			shard = shardOf[r.inst.Key]
			also = make([]int, len(r.inst.Also))
			for i, o := range r.inst.Also {
				also[i] = shardOf[o.Key]
			}
		}
		c := s.startClaim(r, req, shard, also, now)
		c.Contended = true
		claimed = append(claimed, c)
	}
	for _, rv := range plan.Reserved {
		claimed = append(claimed, s.reserve(s.rows[rv.ID], worker, rv.After, h.Lease, now))
	}
	for _, q := range s.queues {
		s.dropEmptyPriorities(q)
	}
	for _, f := range plan.Rest {
		s.freeSlot(f.Key, f.Shard, true, n)
	}
	return claimed, plan.Rest, plan.Yield
}

// line returns the first n waiting rows of key k (due ready rows and
// blocked rows) in the key's line: queue, priority, round, then FIFO, as
// PostgreSQL's hand-off reads them. A row of several keys is in the line
// of its Key while ready, and of the key it waits on while blocked.
func (s *Store) line(k string, ks *keyState, n int) []*row {
	inLine := func(a, b *row) int {
		return cmp.Or(cmp.Compare(a.inst.Queue, b.inst.Queue), cmp.Compare(a.inst.Priority, b.inst.Priority),
			cmp.Compare(a.round, b.round), a.inst.RunAt.Compare(b.inst.RunAt), cmp.Compare(a.seq, b.seq))
	}
	var first []*row // the n first so far, in line (n is small: the slots freed)
	for _, r := range ks.rows {
		if r.inst.Status != store.StatusBlocked && (r.inst.Status != store.StatusReady || r.scheduled()) {
			continue
		}
		if !r.inLineOf(k) {
			continue
		}
		if s.reserved[r.inst.ID] != nil {
			continue // a reservation is not waiting: its worker runs it
		}
		if len(first) == n && inLine(r, first[n-1]) >= 0 {
			continue
		}
		i, _ := slices.BinarySearchFunc(first, r, inLine)
		first = slices.Insert(first, i, r)
		if len(first) > n {
			first = first[:n]
		}
	}
	return first
}

// turn is r's place in its queue's claim order (see admission.Turn).
func turn(r *row) admission.Turn {
	t := admission.Turn{Priority: r.inst.Priority, Round: admission.NoRound}
	if r.hasRound {
		t.Round = r.round
	}
	return t
}

// head is the turn of the first ready row of r's queue, in claim order,
// among those without a key or of another key than r's, at r's priority
// or a better one, of the workflows (none: every workflow) the worker runs
// (nil: none): the row that a slot passing to r would have to wait for
// (admission.InTurn), the one a claim of that worker would take first.
func (s *Store) head(r *row, workflows []store.WorkflowVersion) *admission.Turn {
	q := s.queues[r.inst.Queue]
	if q == nil {
		return nil
	}
	for _, p := range q.prios { // sorted, best first
		if p > r.inst.Priority {
			break
		}
		h := q.ready[p]
		if h == nil || h.Len() == 0 {
			continue
		}
		runs := func(o *row) bool { return store.Runs(workflows, o.inst.Workflow, o.inst.Version) }
		if m := h.min(); m.inst.Key != r.inst.Key && runs(m) {
			t := turn(m)
			return &t
		}
		var best *row
		for _, o := range h.rows {
			if o.inst.Key != r.inst.Key && runs(o) && (best == nil || turn(o).Compare(turn(best)) < 0) {
				best = o
			}
		}
		if best != nil {
			t := turn(best)
			return &t
		}
	}
	return nil
}

// room is how many more rows of key k would be admitted now. For a gate it
// is the sum over its shards, so a shard in debt (see ensureCounters)
// holds back the free slots of the others until the key is under its
// limit again.
func (s *Store) room(k string, ks *keyState) int {
	lim, gated := s.limits.For(k)
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
		s.requeue(r, r.inst.RunAt, ns) // blocked rows are due
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
		i := r.shardOf(ks.key)
		if i < 0 {
			i = 0
		}
		used[i%shards]++
	}
	return used
}

// nextDue is the earliest time a scheduled row of q becomes eligible or an
// await of q times out (zero: none).
func (s *Store) nextDue(q *queueState) time.Time {
	var next time.Time
	if r := q.scheduled.min(); r != nil {
		next = r.inst.RunAt
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
