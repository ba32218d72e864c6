package memory

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
)

// Insert inserts instances atomically: every instance is validated and its
// id and unique key checked before any is stored.
func (s *Store) Insert(ctx context.Context, instances []store.NewInstance) ([]store.InsertResult, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	n := &notes{}
	defer s.unlock(n)
	now := s.clock()
	instances, err := s.checkNew(instances, nil)
	if err != nil {
		return nil, fmt.Errorf("insert: %w", err)
	}
	if err := store.CheckBatchConflicts(instances); err != nil {
		return nil, fmt.Errorf("insert: %w", err)
	}
	if err := s.checkConflicts(instances); err != nil {
		return nil, fmt.Errorf("insert: %w", err)
	}
	return s.insert(instances, nil, now, n), nil
}

// checkConflicts fails a batch whose OnConflict cannot act on a unique
// key's holder (store.ConflictError) before anything of it is applied. A
// key that a row cancels or replaces is in no other row of the batch
// (store.CheckBatchConflicts).
func (s *Store) checkConflicts(instances []store.NewInstance) error {
	for _, ni := range instances {
		if ni.UniqueKey == "" || ni.OnConflict == store.ConflictSkip {
			continue
		}
		r := s.uniqueHolder(ni.UniqueKey, ni.UniqueStatuses, "")
		if r != nil && (ni.OnConflict == store.ConflictReplace && !r.pending() ||
			ni.OnConflict == store.ConflictCancelOlder && r.inst.Status.Terminal()) {
			return store.NewConflictError(ni.UniqueKey, r.inst.ID, r.inst.Status, ni.OnConflict)
		}
	}
	return nil
}

// debounceHolder returns the pending row of a debounce's unique key (nil:
// none), the oldest if several (there is at most one).
func (s *Store) debounceHolder(uniqueKey string) *row {
	var found *row
	for _, r := range s.unique[uniqueKey] {
		if r.pending() && !r.inst.CancelRequested && (found == nil || r.seq < found.seq) {
			found = r
		}
	}
	return found
}

// debounce gives pending row r the state of ni and moves its start as
// ni.Debounce says (store.Debounce.RunAt). A blocked row stays in its
// key's line; a ready one is scheduled again and takes a fresh round when
// it falls due, as a row inserted then would.
func (s *Store) debounce(r *row, ni store.NewInstance, now time.Time, n *notes) {
	r.inst.State = cloneJSON(ni.State)
	r.inst.UpdatedAt = now
	at := ni.Debounce.RunAt(r.inst.CreatedAt, now)
	s.unpick(r)
	if r.inst.Status == store.StatusBlocked {
		r.inst.RunAt = at
		s.block(r)
		return
	}
	r.hasRound = false
	s.place(r, at, now, n)
}

// pending reports whether r has not started: ready (or scheduled) or
// blocked, and never claimed nor reserved (ConflictReplace's holder).
func (r *row) pending() bool {
	return (r.inst.Status == store.StatusReady || r.inst.Status == store.StatusBlocked) && r.inst.Fence == 0
}

// checkNew validates instances to insert (store.NormalizeNewInstance, then
// no caller-chosen id taken or repeated) and returns them normalized, in a
// new slice. taken holds ids already planned by the same batch (Complete
// inserts children of several outcomes).
func (s *Store) checkNew(instances []store.NewInstance, taken map[string]bool) ([]store.NewInstance, error) {
	if taken == nil {
		taken = map[string]bool{}
	}
	instances = slices.Clone(instances)
	for i := range instances {
		ni := &instances[i]
		explicitID := ni.ID != ""
		if err := store.NormalizeNewInstance(i, ni); err != nil {
			return nil, err
		}
		if err := validJSON("state", ni.State); err != nil {
			return nil, fmt.Errorf("instance %d: %w", i, err)
		}
		if !explicitID {
			continue
		}
		if _, ok := s.rows[ni.ID]; ok || taken[ni.ID] {
			return nil, fmt.Errorf("instance %d: id %s: %w", i, ni.ID, store.ErrDuplicate)
		}
		taken[ni.ID] = true
	}
	return instances, nil
}

// insert stores validated instances (children of parent when parent is
// not nil: they default to its queue).
func (s *Store) insert(instances []store.NewInstance, parent *row, now time.Time, n *notes) []store.InsertResult {
	out := make([]store.InsertResult, len(instances))
	var rows []*row
	for i, ni := range instances {
		var canceled string
		if ni.Debounce.Key != "" {
			if h := s.debounceHolder(ni.UniqueKey); h != nil {
				s.debounce(h, ni, now, n)
				out[i] = store.InsertResult{ID: h.inst.ID, Replaced: true}
				continue
			}
		} else if ni.UniqueKey != "" {
			if h := s.uniqueHolder(ni.UniqueKey, ni.UniqueStatuses, ""); h != nil {
				// checkConflicts refused the holders OnConflict cannot act on.
				switch ni.OnConflict {
				case store.ConflictReplace:
					h.inst.State = cloneJSON(ni.State)
					h.inst.UpdatedAt = now
					out[i] = store.InsertResult{ID: h.inst.ID, Replaced: true}
					continue
				case store.ConflictCancelOlder:
					s.cancelRow(h, now, n)
					canceled = h.inst.ID
				default:
					out[i] = store.InsertResult{ID: h.inst.ID, Duplicate: true}
					continue
				}
			}
		}
		if ni.ID == "" {
			ni.ID = store.NewInstanceID()
		}
		joinGen := 0
		if parent != nil {
			joinGen = parent.spawns
			ni.ParentID = parent.inst.ID
			if ni.Queue == "" {
				ni.Queue = parent.inst.Queue
			}
		}
		runAt := ni.RunAt
		if runAt.IsZero() {
			runAt = now.Add(ni.Delay)
		}
		s.seq++
		r := &row{
			seq:            s.seq,
			joinGen:        joinGen,
			uniqueStatuses: slices.Clone(ni.UniqueStatuses),
			pickIdx:        -1,
			timerIdx:       -1,
			inst: store.Instance{
				ID:        ni.ID,
				Workflow:  ni.Workflow,
				Version:   ni.Version,
				Queue:     ni.Queue,
				Priority:  ni.Priority,
				Step:      ni.Step,
				State:     cloneJSON(ni.State),
				Key:       ni.Key,
				KeyIntent: ni.KeyIntent,
				KeyShard:  -1,
				Also:      slices.Clone(ni.Also),
				ParentID:  ni.ParentID,
				UniqueKey: ni.UniqueKey,
				Status:    store.StatusReady,
				CreatedAt: now,
				UpdatedAt: now,
			},
		}
		if len(r.uniqueStatuses) == 0 {
			r.uniqueStatuses = store.DefaultUniqueStatuses
		}
		s.rows[r.inst.ID] = r
		if ni.UniqueKey != "" {
			if s.unique[ni.UniqueKey] == nil {
				s.unique[ni.UniqueKey] = map[string]*row{}
			}
			s.unique[ni.UniqueKey][r.inst.ID] = r
		}
		if ni.ParentID != "" {
			s.children[ni.ParentID] = append(s.children[ni.ParentID], r)
		}
		s.attachKey(r)
		r.inst.RunAt = runAt
		rows = append(rows, r)
		out[i] = store.InsertResult{ID: r.inst.ID, Canceled: canceled}
	}
	// Rounds are given to the due rows of the batch together (see
	// assignRounds); due rows whose key (the first, for a row of several
	// keys) is a K = 1 key go in blocked as admission.InsertBlocked decides
	// (see oneState). A due row of several keys inserted (not spawned) that
	// this leaves ready goes in blocked in the line of its first gate when
	// the gate has no free slot for it or rows wait in its line, as
	// admission.InsertBlockedAtGate decides (PostgreSQL's blockAtGates),
	// with the round it has as a row of its first key, unless a row of its
	// first key goes in ready ahead of it (admission.InsertBehindFirst:
	// then it waits in that key's line).
	// Otherwise a row of several keys goes in ready: the claim that finds
	// one of its keys full blocks it on that key.
	var due, waitingRows, gatedRows []*row
	var waiting, gated []admission.InsertRow
	for _, r := range rows {
		if r.inst.RunAt.After(now) {
			continue
		}
		due = append(due, r)
		if k := r.inst.Key; k != "" && s.isOne(k) {
			waiting = append(waiting, admission.InsertRow{Key: k, Priority: r.inst.Priority, At: r.inst.RunAt, Seq: r.seq})
			waitingRows = append(waitingRows, r)
		}
	}
	s.assignRounds(due)
	blocked := map[*row]bool{}
	for i, b := range admission.InsertBlocked(waiting, s.oneState) {
		if b {
			blocked[waitingRows[i]] = true
		}
	}
	for _, r := range due {
		if parent != nil || blocked[r] {
			continue // a child (PostgreSQL's insert of an outcome's children reads no gate), or in its first key's line
		}
		if g := store.FirstGate(r.inst.Key, r.inst.Also, func(k string) bool { return !s.isOne(k) }); g != "" {
			gated = append(gated, admission.InsertRow{Key: g, Priority: r.inst.Priority, At: r.inst.RunAt, Seq: r.seq})
			gatedRows = append(gatedRows, r)
		}
	}
	lined := func(g string) bool { ks := s.keys[g]; return ks != nil && ks.blocked.Len() > 0 }
	atGate := map[*row]string{}
	for i, b := range admission.InsertBlockedAtGate(gated, func(g string) (int, bool) { return s.room(g, s.key(g)), true }, lined) {
		if b {
			atGate[gatedRows[i]] = gated[i].Key
		}
	}
	// A row the gate blocks waits in its first key's line instead when a
	// row of that key goes in ready ahead of it and no row waits in the
	// gate's line ahead of it (InsertBehindFirst).
	var firsts, ahead []admission.InsertRow
	var firstRows []*row
	var gates []string
	for _, r := range gatedRows {
		if g, ok := atGate[r]; ok {
			first := ""
			if s.isOne(r.inst.Key) {
				first = r.inst.Key
			}
			firsts = append(firsts, admission.InsertRow{Key: first, Priority: r.inst.Priority, At: r.inst.RunAt, Seq: r.seq})
			firstRows, gates = append(firstRows, r), append(gates, g)
		}
	}
	for i, r := range waitingRows {
		if !blocked[r] && atGate[r] == "" {
			ahead = append(ahead, waiting[i])
		}
	}
	for i, behind := range admission.InsertBehindFirst(firsts, gates, ahead, lined) {
		r := firstRows[i]
		if !behind {
			r.blockedOn = gates[i]
		}
		blocked[r] = true
	}
	for _, r := range rows {
		if blocked[r] {
			// Behind its key's holder or its ready rows: off the pick path
			// at once, with the round it would have had ready.
			s.block(r)
			continue
		}
		s.place(r, r.inst.RunAt, now, n)
	}
	return out
}

// isOne reports whether key k is a K = 1 key: its name has no limit.
func (s *Store) isOne(k string) bool {
	_, gated := s.limits.For(k)
	return !gated
}

// oneState is what admission.InsertBlocked needs of K = 1 key k, as read
// before an insert places its rows: whether a row of it executes, and how
// many are ready and due (on a queue's pick path), up to
// admission.ReadyCap. A due row inserted blocked waits behind the key's
// blocked rows (as in PostgreSQL; no race to close here, the store's mutex
// serializes the insert with whatever frees the key). Unlike PostgreSQL it
// also counts a holder that a gate admitted before the key's limit was
// removed: here such a holder's end passes the turn on like any other.
func (s *Store) oneState(k string) admission.KeyState {
	ks := s.keys[k]
	if ks == nil {
		return admission.KeyState{}
	}
	if ks.executing > 0 {
		return admission.KeyState{Busy: true}
	}
	return admission.KeyState{Ready: ks.countReady(admission.ReadyCap)}
}

// uniqueTaken returns the oldest instance other than self holding
// uniqueKey in one of statuses (default: every non-terminal status).
func (s *Store) uniqueTaken(uniqueKey string, statuses []store.Status, self string) (string, bool) {
	r := s.uniqueHolder(uniqueKey, statuses, self)
	if r == nil {
		return "", false
	}
	return r.inst.ID, true
}

// uniqueHolder returns the oldest row other than self holding uniqueKey in
// one of statuses (default: every non-terminal status), nil when none. A
// row whose cancel is requested holds it no more.
func (s *Store) uniqueHolder(uniqueKey string, statuses []store.Status, self string) *row {
	if len(statuses) == 0 {
		statuses = store.DefaultUniqueStatuses
	}
	var found *row
	for _, r := range s.unique[uniqueKey] {
		if r.inst.ID != self && !r.inst.CancelRequested && slices.Contains(statuses, r.inst.Status) && (found == nil || r.seq < found.seq) {
			found = r
		}
	}
	return found
}

// current returns the row if (worker, fence) is its current claim.
func (s *Store) current(id, worker string, fence int64) *row {
	r := s.rows[id]
	if r == nil || r.inst.Status != store.StatusExecuting || r.inst.Worker != worker || r.inst.Fence != fence {
		return nil
	}
	return r
}

// Complete commits each outcome whose claim is still current and reports
// the others stale. A malformed batch (unknown kind, invalid key or JSON,
// taken child id) is an error and commits nothing.
func (s *Store) Complete(ctx context.Context, worker string, outcomes []store.Outcome, now time.Time) ([]store.OutcomeResult, error) {
	res, _, err := s.complete(worker, outcomes, now, nil)
	return res, err
}

// CompleteHandOff is Complete, handing the slots the outcomes free to the
// next waiting rows of their keys as h allows (see store.HandOffer).
func (s *Store) CompleteHandOff(ctx context.Context, worker string, outcomes []store.Outcome, now time.Time, h store.HandOff) ([]store.OutcomeResult, []store.Claimed, error) {
	if h.Lease <= 0 {
		h.Lease = store.DefaultLease
	}
	return s.complete(worker, outcomes, now, &h)
}

func (s *Store) complete(worker string, outcomes []store.Outcome, now time.Time, h *store.HandOff) ([]store.OutcomeResult, []store.Claimed, error) {
	if err := s.lock(); err != nil {
		return nil, nil, err
	}
	n := &notes{}
	defer s.unlock(n)
	now = s.now(now)
	taken := map[string]bool{}
	named := map[string]bool{} // the successors the batch names
	for i, o := range outcomes {
		if o.Successor.ID != "" && h == nil {
			// Freeing its slot could admit a row beside a step already
			// running in it: only CompleteHandOff passes a slot on.
			return nil, nil, fmt.Errorf("complete: outcome %d (%s): %w: it names a successor, which only CompleteHandOff passes a slot to", i, o.ID, store.ErrInvalid)
		}
		named[o.Successor.ID] = true
	}
	outcomes = slices.Clone(outcomes) // their keys are put in order below
	for i := range outcomes {
		o := &outcomes[i]
		if err := store.NormalizeOutcomeKeys(o); err != nil {
			return nil, nil, fmt.Errorf("complete: outcome %d (%s): %w: %w", i, o.ID, store.ErrInvalid, err)
		}
		// Children ids are only checked for current claims: a retried
		// Complete whose spawn already committed is stale, not an error.
		// A reservation the batch names will be current once passed its slot.
		current := s.current(o.ID, worker, o.Fence) != nil || (named[o.ID] && s.reservation(o.ID, worker, o.Fence) != nil)
		if err := s.checkOutcome(o, current, taken); err != nil {
			return nil, nil, fmt.Errorf("complete: outcome %d (%s): %w", i, o.ID, err)
		}
	}
	var passed map[string]int // successors passed a slot -> their predecessor's outcome
	if h != nil {
		passed = s.passSlots(worker, outcomes, h.Lease, now)
	}
	var freed []admission.Freed
	res := make([]store.OutcomeResult, len(outcomes))
	held := make([][]string, len(outcomes)) // the keys whose slots each outcome's row held
	credited := map[string]bool{}           // keys with a slot freed, not handed off
	var readied []*row
	s.readied = &readied
	for i, o := range outcomes {
		res[i].ID = o.ID
		r := s.current(o.ID, worker, o.Fence)
		if r == nil {
			res[i].Stale = true
			continue
		}
		held[i] = r.keys()
		switch {
		case r.passed: // its slot went on to its successor
		case h != nil && o.Contended:
			s.freeing = &freed // its slot is decided by the hand-off below
		default:
			for _, k := range held[i] {
				credited[k] = true
			}
		}
		before := len(freed)
		s.apply(r, worker, o, now, n)
		s.freeing = nil
		for j := before; j < len(freed); j++ {
			freed[j].Ahead = o.Ahead // successors its slot's next row may get
		}
	}
	s.readied = nil
	s.assignRounds(readied)
	for _, r := range readied {
		s.pushReady(s.queue(r.inst.Queue), r)
	}
	var claimed []store.Claimed
	if h != nil {
		// The chains' ends: successors passed a slot whose own outcome is
		// not in the batch, in their predecessors' order. They may get
		// successors of their own.
		var ends []admission.Freed
		for i, o := range outcomes {
			if j, ok := passed[o.Successor.ID]; !ok || j != i {
				continue
			}
			succ := s.current(o.Successor.ID, worker, o.Successor.Fence)
			if succ == nil {
				continue // its own outcome came in the batch too
			}
			ends = append(ends, admission.Freed{Key: succ.inst.Key, Shard: succ.inst.KeyShard,
				Successor: succ.inst.ID, Queue: succ.inst.Queue, Ahead: o.Ahead, Also: succ.otherKeys()})
			claimed = append(claimed, store.Claimed{Instance: store.Instance{ID: succ.inst.ID, Fence: succ.inst.Fence,
				Queue: succ.inst.Queue, Status: store.StatusExecuting}, Contended: true})
		}
		more, rest, yield := s.handOff(append(ends, freed...), worker, *h, now, n)
		claimed = append(claimed, more...)
		for _, f := range rest {
			credited[f.Key] = true
		}
		for _, id := range yield {
			res[passed[id]].Yield = true
		}
	}
	waited := map[string]bool{} // keyWaited, read once per key
	for i := range res {
		res[i].Unwaited = !res[i].Stale
		for _, k := range held[i] {
			if !credited[k] {
				continue
			}
			w, ok := waited[k]
			if !ok {
				w = s.keyWaited(k)
				waited[k] = w
			}
			res[i].Unwaited = res[i].Unwaited && !w
		}
	}
	return res, claimed, nil
}

// keyWaited reports whether a row of key k waits for a slot: a ready or
// blocked one (this store reserves none). See store.OutcomeResult.Unwaited.
func (s *Store) keyWaited(k string) bool {
	ks := s.keys[k]
	if ks == nil {
		return false
	}
	if ks.blocked.Len() > 0 {
		return true
	}
	for _, r := range ks.rows {
		if r.inst.Status == store.StatusReady {
			return true
		}
	}
	return false
}

// checkOutcome validates an outcome and, for a current claim, puts its
// children in the form they are stored in; current says whether its claim
// is current, so that its children's ids must be free.
func (s *Store) checkOutcome(o *store.Outcome, current bool, taken map[string]bool) error {
	if o.Kind < store.OutcomeReady || o.Kind > store.OutcomeFailed {
		return fmt.Errorf("%w: unknown outcome kind %d", store.ErrInvalid, o.Kind)
	}
	if o.Kind == store.OutcomeAwait && o.AwaitSignal == "" {
		return fmt.Errorf("%w: await with no signal name", store.ErrInvalid)
	}
	for _, m := range []struct {
		what string
		v    []byte
	}{{"state", o.State}, {"result", o.Result}} {
		if err := validJSON(m.what, m.v); err != nil {
			return err
		}
	}
	if o.Kind != store.OutcomeSpawn {
		return nil
	}
	if !current {
		taken = nil // validate the children's shape only
		for i, ni := range o.Children {
			if _, err := s.checkNew([]store.NewInstance{{Workflow: ni.Workflow, Step: ni.Step, Key: ni.Key, KeyIntent: ni.KeyIntent, Also: ni.Also, State: ni.State}}, taken); err != nil {
				return fmt.Errorf("child %d: %w", i, err)
			}
		}
		return nil
	}
	kids, err := s.checkNew(o.Children, taken)
	if err != nil {
		return err
	}
	o.Children = kids // as they are stored: keys in their one order
	return nil
}

// apply commits outcome o of the current claim of r.
func (s *Store) apply(r *row, worker string, o store.Outcome, now time.Time, n *notes) {
	if o.ConsumeSignal != 0 {
		if sg := s.signals[o.ConsumeSignal]; sg != nil && sg.sig.InstanceID == r.inst.ID {
			sg.consumed = true
		}
	}
	if o.History != nil {
		h := *o.History
		h.InstanceID = r.inst.ID
		h.Also = slices.Clone(h.Also)
		if h.Worker == "" {
			h.Worker = worker
		}
		if h.StartedAt.IsZero() {
			h.StartedAt = r.inst.StartedAt
		}
		if h.FinishedAt.IsZero() {
			h.FinishedAt = now
		}
		r.history = append(r.history, h)
	}
	s.leaveExecuting(r, true, n)
	r.wake, r.timedOut = nil, false
	r.inst.UpdatedAt = now
	// A hand-back keeps when the row first became ready (its run time when
	// claimed, before this outcome moves it); any other outcome ends it.
	if o.HandBack && o.Kind == store.OutcomeReady && !r.inst.CancelRequested {
		if r.inst.ReadySince.IsZero() {
			r.inst.ReadySince = r.inst.RunAt
		}
	} else {
		r.inst.ReadySince = time.Time{}
	}
	if o.State != nil {
		r.inst.State = cloneJSON(o.State)
	}
	if o.Error != "" {
		r.inst.LastError = o.Error
	}
	if o.SetKey { // its keys in order (see complete)
		if o.Key != r.inst.Key || !slices.Equal(o.Also, r.inst.Also) {
			s.detachKey(r)
			r.inst.Key, r.inst.Also = o.Key, slices.Clone(o.Also)
			s.attachKey(r)
		}
		r.inst.KeyIntent = o.KeyIntent
	}
	if o.Kind == store.OutcomeReady || o.Kind == store.OutcomeAwait || o.Kind == store.OutcomeSpawn {
		if o.Step != "" {
			r.inst.Step = o.Step
		}
		r.inst.Attempt = o.Attempt
		if r.inst.CancelRequested {
			// Canceled while the step ran: the step's progress is kept,
			// nothing more of the instance runs.
			s.finish(r, store.StatusCanceled, now, n)
			return
		}
	}
	switch o.Kind {
	case store.OutcomeReady:
		runAt := o.RunAt
		if runAt.IsZero() {
			runAt = now.Add(o.Delay)
		}
		if s.readied != nil && !runAt.After(now) {
			r.hasRound, r.inst.Status, r.inst.RunAt = false, store.StatusReady, runAt
			n.add(r.inst.Queue)
			*s.readied = append(*s.readied, r)
			break
		}
		s.setReady(r, runAt, now, n)
	case store.OutcomeAwait:
		timeoutAt := o.TimeoutAt
		if timeoutAt.IsZero() && o.Timeout > 0 {
			timeoutAt = now.Add(o.Timeout)
		}
		s.park(r, o.AwaitSignal, timeoutAt, now, n)
	case store.OutcomeSpawn:
		r.spawns++
		kids := s.insert(o.Children, r, now, n)
		pending := 0
		for _, k := range kids {
			if !k.Duplicate {
				pending++
			}
		}
		r.inst.PendingChildren = pending
		if pending == 0 {
			s.setReady(r, now, now, n)
		} else {
			r.inst.Status = store.StatusChildren
		}
	case store.OutcomeDone:
		r.inst.Result = cloneJSON(o.Result)
		s.finish(r, store.StatusDone, now, n)
	case store.OutcomeFailed:
		s.finish(r, store.StatusFailed, now, n)
	}
}

// park makes r await signal name, unless an unconsumed signal of that name
// is already in its inbox: then it is ready at once and its next claim
// carries that signal (a signal sent before the await is never lost).
func (s *Store) park(r *row, name string, timeoutAt, now time.Time, n *notes) {
	r.inst.AwaitSignal = name
	r.inst.TimeoutAt = timeoutAt
	for _, sg := range r.inbox {
		if !sg.consumed && sg.sig.Name == name {
			s.wakeWith(r, sg, now, n)
			return
		}
	}
	r.inst.Status = store.StatusAwaiting
	if !timeoutAt.IsZero() {
		s.queue(r.inst.Queue).timers.add(r)
	}
}

// wakeWith makes an awaiting row ready now, handing it sg.
func (s *Store) wakeWith(r *row, sg *signal, now time.Time, n *notes) {
	if r.timerHeap != nil {
		r.timerHeap.remove(r)
	}
	r.wake = sg
	r.inst.AwaitSignal, r.inst.TimeoutAt = "", time.Time{}
	r.inst.UpdatedAt = now
	s.setReady(r, now, now, n)
}

// finish makes r terminal and, for a child, counts it off its parent's
// join: the parent is ready when its last child is terminal.
func (s *Store) finish(r *row, status store.Status, now time.Time, n *notes) {
	s.unpick(r)
	r.inst.Status = status
	r.inst.UpdatedAt = now
	r.inst.AwaitSignal, r.inst.TimeoutAt = "", time.Time{}
	r.wake, r.timedOut = nil, false
	s.detachKey(r)
	if p := s.joining(r); p != nil {
		p.inst.PendingChildren--
		p.inst.UpdatedAt = now
		if p.inst.PendingChildren <= 0 {
			p.inst.PendingChildren = 0
			s.setReady(p, now, now, n)
		}
	}
}

// joining returns the parent whose current spawn waits for child r.
func (s *Store) joining(r *row) *row {
	p := s.rows[r.inst.ParentID]
	if p == nil || p.inst.Status != store.StatusChildren || p.spawns != r.joinGen {
		return nil
	}
	return p
}

// Heartbeat extends the leases of worker's current claims and reports the
// claims it no longer holds and those whose cancel was requested.
func (s *Store) Heartbeat(ctx context.Context, worker string, claims []store.ClaimRef, lease time.Duration, now time.Time) (store.HeartbeatResult, error) {
	if err := s.lock(); err != nil {
		return store.HeartbeatResult{}, err
	}
	defer s.unlock(nil)
	now = s.now(now)
	return s.heldClaims(worker, claims, func(r *row) { r.inst.LeaseExpiresAt = now.Add(lease) }), nil
}

// heldClaims reports, of worker's claims, those it no longer holds and the
// held ones whose cancel was requested, calling each, if not nil, with the
// row of every held one (s.mu held).
func (s *Store) heldClaims(worker string, claims []store.ClaimRef, each func(*row)) store.HeartbeatResult {
	var res store.HeartbeatResult
	for _, c := range claims {
		r := s.current(c.ID, worker, c.Fence)
		if r == nil {
			r = s.reservation(c.ID, worker, c.Fence)
		}
		if r == nil {
			res.Lost = append(res.Lost, c)
			continue
		}
		if each != nil {
			each(r)
		}
		if r.inst.CancelRequested {
			res.Canceled = append(res.Canceled, c)
		}
	}
	return res
}

// CheckClaims reports the claims worker no longer holds and those whose
// cancel was requested, as Heartbeat does, without extending a lease.
func (s *Store) CheckClaims(ctx context.Context, worker string, claims []store.ClaimRef) (store.HeartbeatResult, error) {
	if err := s.lock(); err != nil {
		return store.HeartbeatResult{}, err
	}
	defer s.unlock(nil)
	return s.heldClaims(worker, claims, nil), nil
}

// Release returns worker's current claims to ready, attempt, run_at and
// any waking signal unchanged, crediting their slots; a claim whose cancel
// was requested becomes canceled. Claims no longer held are ignored.
func (s *Store) Release(ctx context.Context, worker string, claims []store.ClaimRef, now time.Time) error {
	if err := s.lock(); err != nil {
		return err
	}
	n := &notes{}
	defer s.unlock(n)
	now = s.now(now)
	for _, c := range claims {
		if rv := s.reservation(c.ID, worker, c.Fence); rv != nil {
			s.giveBack(rv, now, n)
			continue
		}
		r := s.current(c.ID, worker, c.Fence)
		if r == nil {
			continue
		}
		s.leaveExecuting(r, true, n)
		r.inst.UpdatedAt = now
		if r.inst.CancelRequested {
			s.finish(r, store.StatusCanceled, now, n)
			continue
		}
		s.requeue(r, now, n)
	}
	return nil
}

// Signal stores a signal in the instance's inbox and wakes the instance if
// it awaits that name.
func (s *Store) Signal(ctx context.Context, req store.SignalRequest) (store.SignalResult, error) {
	if req.Name == "" {
		return store.SignalResult{}, fmt.Errorf("signal %s: %w: empty name", req.InstanceID, store.ErrInvalid)
	}
	if err := validJSON("payload", req.Payload); err != nil {
		return store.SignalResult{}, fmt.Errorf("signal %s: %w", req.InstanceID, err)
	}
	if err := s.lock(); err != nil {
		return store.SignalResult{}, err
	}
	n := &notes{}
	defer s.unlock(n)
	now := s.now(req.Now)
	r := s.rows[req.InstanceID]
	if r == nil {
		return store.SignalResult{}, fmt.Errorf("signal %s: %w", req.InstanceID, store.ErrNotFound)
	}
	if r.inst.Status.Terminal() {
		return store.SignalResult{}, fmt.Errorf("signal %s: %w", req.InstanceID, store.ErrTerminal)
	}
	if req.DedupKey != "" {
		if r.dedup[req.DedupKey] {
			return store.SignalResult{Duplicate: true}, nil
		}
		if r.dedup == nil {
			r.dedup = map[string]bool{}
		}
		r.dedup[req.DedupKey] = true
	}
	s.nextSignal++
	sg := &signal{sig: store.Signal{
		ID: s.nextSignal, InstanceID: r.inst.ID, Name: req.Name,
		Payload: cloneJSON(req.Payload), DedupKey: req.DedupKey, CreatedAt: now,
	}}
	s.signals[sg.sig.ID] = sg
	r.inbox = append(r.inbox, sg)
	if r.inst.Status == store.StatusAwaiting && r.inst.AwaitSignal == req.Name {
		s.wakeWith(r, sg, now, n)
		return store.SignalResult{Woke: true}, nil
	}
	return store.SignalResult{}, nil
}

// Cancel makes a non-terminal instance canceled. An executing row's slot
// is credited (its worker's later outcome is stale); a ready row's key gets
// the chance to promote a blocked row it might have been promoted ahead of.
func (s *Store) Cancel(ctx context.Context, id string, now time.Time) error {
	if err := s.lock(); err != nil {
		return err
	}
	n := &notes{}
	defer s.unlock(n)
	now = s.now(now)
	r := s.rows[id]
	if r == nil {
		return fmt.Errorf("cancel %s: %w", id, store.ErrNotFound)
	}
	if r.inst.Status.Terminal() {
		return fmt.Errorf("cancel %s: %w", id, store.ErrTerminal)
	}
	s.cancelRow(r, now, n)
	return nil
}

// cancelRow cancels r, which is not terminal, by Cancel's rules.
func (s *Store) cancelRow(r *row, now time.Time, n *notes) {
	id := r.inst.ID
	if r.inst.Status == store.StatusExecuting || s.reserved[id] != nil {
		// The step may still run (a reserved row's in its predecessor's
		// slot): it keeps its slot until its claim ends.
		if !r.inst.CancelRequested {
			r.inst.CancelRequested = true
			r.inst.UpdatedAt = now
			n.canceled = append(n.canceled, id)
		}
		return
	}
	wasReady := r.inst.Status == store.StatusReady
	key := r.inst.Key
	s.finish(r, store.StatusCanceled, now, n)
	if wasReady && key != "" {
		s.promote(key, 1, n)
	}
}

// Retry makes a failed or canceled instance ready again at its current
// step, attempt 0. A child retried while its parent still waits for its
// children is counted back into the parent's join.
func (s *Store) Retry(ctx context.Context, id string, now time.Time) error {
	if err := s.lock(); err != nil {
		return err
	}
	n := &notes{}
	defer s.unlock(n)
	now = s.now(now)
	r := s.rows[id]
	if r == nil {
		return fmt.Errorf("retry %s: %w", id, store.ErrNotFound)
	}
	if r.inst.Status != store.StatusFailed && r.inst.Status != store.StatusCanceled {
		return fmt.Errorf("retry %s: %w (status %s)", id, store.ErrNotRetryable, r.inst.Status)
	}
	if r.inst.UniqueKey != "" && slices.Contains(r.uniqueStatuses, store.StatusReady) {
		if other, ok := s.uniqueTaken(r.inst.UniqueKey, r.uniqueStatuses, r.inst.ID); ok {
			return fmt.Errorf("retry %s: unique key held by %s: %w", id, other, store.ErrDuplicate)
		}
	}
	r.inst.Attempt = 0
	r.inst.CancelRequested = false
	r.inst.ReadySince = time.Time{}
	r.inst.UpdatedAt = now
	s.attachKey(r)
	s.setReady(r, now, now, n)
	if p := s.joining(r); p != nil {
		p.inst.PendingChildren++
	}
	return nil
}
