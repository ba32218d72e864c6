package admission

import (
	"slices"

	"github.com/godurable/godurable/gate"
)

// This file is the slot-freeing side: what becomes of the slots that rows
// leaving executing give up, when the transaction that frees them may hand
// them straight to the next waiting rows of their keys (see store.HandOffer).
// Free decides; the stores read and lock the state before and write the
// plan after, as for Decide.

// Freed is a slot a row gave up when it left executing: a K = 1 key (Shard
// -1) or one slot of a gate key's shard. A batch lists one Freed per row.
type Freed struct {
	Key   string
	Shard int
	// Successor, when set, is the row reserved (FreePlan.Reserved of an
	// earlier transaction) to take this slot, and Queue its queue: the slot
	// passes to it unconditionally, since the worker may already run it.
	Successor, Queue string
	// Ahead is how many successors to reserve, with FreeState.Reserve,
	// for the row that takes this slot.
	Ahead int
	// Also are, for a slot that names a successor of several keys, the
	// successor's other keys: a chain passes every key's slot along, so
	// only a row of the same keys is reserved after it (see Free).
	Also []string
}

// Waiting is one of the next waiting rows (ready or blocked) of a freed
// key, in the key's line (queue, priority, round, then FIFO), as the
// freeing transaction read and locked it.
type Waiting struct {
	ID, Key, Queue, Workflow string
	Version                  int
	// Turn is the row's place in its queue's claim order, and Head the
	// first ready row of its queue in that order among those without a key
	// or of another key (nil: none), as read: the row takes a slot only
	// when it is InTurn, so that a slot never passes along a key's line
	// while a better-priority or earlier-round row of another key, or of
	// none, waits to be claimed (see store.Store, Order).
	Turn Turn
	Head *Turn
	// Policy is true when its queue has a concurrency policy, Rated when
	// its key has a rate limit: a hand-off takes neither a queue budget nor
	// a token, so such rows go the claim's way.
	Policy, Rated bool
	// Also are the row's other keys, when it has several: it takes the
	// freed slot only with a slot of each of them (see Free). AtFirst is
	// true when Key is its first key (store.NormalizeKeys), the key it
	// executes under and whose slot a chain passes: only then is it
	// reserved, or has successors reserved after it.
	Also    []string
	AtFirst bool
}

// FreeState is what the freeing transaction read, under the locks it
// holds on the freed keys (the K = 1 keys' locks, the freed counters).
type FreeState struct {
	// Limits holds the current limit of each freed key whose name has one.
	Limits map[string]gate.Limit
	// Counters are the freed keys' counters this transaction locked, and
	// Count how many counters each key has in all.
	Counters map[string][]Counter
	Count    map[string]int
	// Busy holds the K = 1 keys that still have an executing row.
	Busy map[string]bool
	// Room is how many rows the freeing worker takes, per queue.
	Room map[string]int
	// Runs reports whether the worker runs a row of a workflow version
	// (nil: every row).
	Runs func(workflow string, version int) bool
	// Reserve asks for successors (Freed.Ahead of them) for each row the
	// plan makes executing (FreePlan.Reserved).
	Reserve bool
	// Paused holds the paused queues (store.Store.PauseQueue): no slot
	// passes to a row of one, and a succession of one yields.
	Paused map[string]bool
	// Tried holds K = 1 keys that no freed slot is of, whose names have no
	// limit, that the freeing transaction holds the lock of (tried, never
	// waited for) and that no row holds: a waiting row of several keys may
	// take one of them with a freed slot of another of its keys.
	Tried map[string]bool
}

// NewFreeState is an empty FreeState for a worker with room in each queue
// and what it runs (see FreeState.Runs), ready for a store to fill.
func NewFreeState(room map[string]int, runs func(workflow string, version int) bool) FreeState {
	return FreeState{Limits: map[string]gate.Limit{}, Counters: map[string][]Counter{}, Count: map[string]int{},
		Busy: map[string]bool{}, Room: room, Runs: runs}
}

// FreePlan is what becomes of the freed slots.
type FreePlan struct {
	// HandOffs are the waiting rows that take a freed slot and start
	// executing for the freeing worker, each with the shard it takes (-1:
	// a K = 1 key) and, for a row of several keys, what it holds of each
	// of its other keys (Admitted.Also); their counters do not change.
	HandOffs []Admitted
	// Rest are the freed slots not handed off: they are credited and
	// promote their key's next blocked row, as without a hand-off.
	Rest []Freed
	// Successions are the reserved rows that take the slots of the freed
	// entries that name them (Freed.Successor), with the shard.
	Successions []Admitted
	// Reserved are the waiting rows reserved for the freeing worker as
	// successors of a row the plan makes executing (a succession or a
	// hand-off), in the order they are to run after it: each will take
	// the slot when the step before it ends.
	Reserved []Reservation
	// Roomy are the gate keys whose slots were not handed off because
	// their counters have free slots (see Free), sorted.
	Roomy []string
	// Yield are the successors passed a slot (Successions) whose slot is
	// beyond the key's limit now, or whose key's next waiting row is out
	// of turn (Waiting.InTurn): the rows reserved
	// after them, in their worker, should be given back rather than run in
	// that slot, so that the slot frees when the successor's step ends and
	// the rows of better turns get it (see store.OutcomeResult.Yield).
	Yield []string
}

// Reservation is a waiting row reserved as the successor of row After.
type Reservation struct {
	ID, After string
}

// Free decides which freed slots go straight to the next waiting row of
// their key. A slot is handed off only when everything a claim would check
// for that row holds without asking anything more:
//
//   - the row is the key's next waiting row (a key's rows are handed slots
//     in its admission order; the first row that cannot take one ends the
//     key's hand-offs, so a key never skips its own line);
//   - the worker has room in the row's queue and runs its workflow;
//   - its queue has no concurrency policy and its keys no rate limit;
//   - a row of several keys (Waiting.Also) takes it only with a slot of
//     each of its other keys at once: a slot of that key this batch frees
//     and hands nobody else, when the key's line has no waiting row left
//     (the row would otherwise pass that line), or, for a K = 1 key no
//     slot is freed of, the key itself when FreeState.Tried has it. The
//     key's line stops at a row that cannot take its slots so;
//   - it is in turn (InTurn): no ready row of its queue, without a key or
//     of another key, has a better priority or, at its priority, an
//     earlier round, so a hand-off never lets a key run ahead of a row a
//     claim would take first;
//   - for a K = 1 key: the name has no limit now and no row of the key
//     executes; for a gate key: the name still has a limit, the shard is
//     one of its shards and the key's counters are clean (see CleanShards),
//     so the slot the row takes is one the limit gives, and the key's slots
//     in use stay what they were;
//   - for a gate key: no counter of the key has a free slot (Roomy): a
//     key with slots to spare is not full, its waiting rows wait for a
//     claim, not for a slot, and a claim admits them without holding the
//     freeing worker's executor until its flush commits. Make bench's
//     scenario 4 (a gate of 1,000, 200 executors) ran at 3,000-5,600
//     steps/s on hand-offs, against about 13,000 on claims. A row of
//     several keys is no exception: the head of such a key's line may be
//     a row promoted for one of the spare slots and not yet claimed, and
//     handed this slot it would leave that one with no row to take it
//     until the reconciler: the key would run at fewer and fewer of its
//     slots;
//
// Every other freed slot is in Rest. A slot that names a successor is not
// decided: it passes to that row (Successions).
//
// A succession whose slot would not pass on by the key's limit now (a
// lowered limit: see slotPasses), or whose key's next waiting row is out of
// turn, or whose queue is paused (FreeState.Paused), is in Yield: the
// chain reserved after it must stop in its worker, so that a lowered
// limit, the order rule and a pause bind at the chain's next flush. No
// slot passes to a row of a paused queue, by hand-off or reservation: a
// pause stops every way a step of the queue starts but the ones already
// under way.
//
// With st.Reserve, each row the plan makes executing whose slot passes (as
// above) gets up to its slot's Ahead of the key's next waiting rows after
// the hand-offs as its successors, by the same rule except for room (they
// run in its executor after it, so they must be of its queue); the first
// row that cannot be reserved ends the key's reservations. A chain passes
// every slot its rows hold (a row of several keys passes its other keys'
// holds with its first key's slot), so a row is reserved only after a row
// of the same keys, in the line of its first key (Waiting.AtFirst,
// Freed.Also): it holds nothing while reserved, and takes every slot of
// its predecessor when the predecessor's outcome passes them.
//
// Free does not modify its arguments.
func Free(freed []Freed, waiting []Waiting, st FreeState) FreePlan {
	var plan FreePlan
	next := map[string][]Waiting{} // key -> its waiting rows, in line
	for _, w := range waiting {
		next[w.Key] = append(next[w.Key], w)
	}
	done := map[string]bool{} // keys whose line stopped
	room := map[string]int{}
	for q, n := range st.Room {
		room[q] = n
	}
	type holder struct {
		id, queue string
		slot      Freed
		also      []string // its other keys (see Freed.Also)
	}
	var holders []holder       // rows the plan makes executing, in slot order
	var rest []spare           // the slots not handed off, in order
	var multi []Freed          // slots whose key's next row has several keys
	tried := map[string]bool{} // Tried keys a hand-off took
	// handMulti hands f to w, the next row of f's key, of several keys,
	// with also, the slots of its other keys; at its first key, it gets
	// successors of its keys.
	handMulti := func(w Waiting, f Freed, also []alsoHold) {
		next[f.Key] = next[f.Key][1:]
		room[w.Queue]--
		plan.HandOffs = append(plan.HandOffs, takeAlso(w, f, also, rest, tried))
		if w.AtFirst {
			holders = append(holders, holder{w.ID, w.Queue, f, w.Also})
		}
	}
	for _, f := range freed {
		if f.Key == "" {
			continue
		}
		if f.Successor != "" {
			plan.Successions = append(plan.Successions, Admitted{ID: f.Successor, Shard: f.Shard})
			holders = append(holders, holder{f.Successor, f.Queue, f, f.Also})
			continue
		}
		if done[f.Key] || !slotPasses(f, st) {
			rest = append(rest, spare{Freed: f})
			continue
		}
		if roomy(f, st) {
			if !slices.Contains(plan.Roomy, f.Key) {
				plan.Roomy = append(plan.Roomy, f.Key)
			}
			done[f.Key] = true
			rest = append(rest, spare{Freed: f, passes: true})
			continue
		}
		line := next[f.Key]
		ready := len(line) > 0 && takes(line[0], room, st.Runs) && !st.Paused[line[0].Queue]
		if ready && len(line[0].Also) > 0 {
			w := line[0]
			if also, ok := alsoSlots(w, rest, next, st.Tried, tried); ok {
				handMulti(w, f, also)
				if f.Shard < 0 {
					done[f.Key] = true
				}
				continue
			}
			done[f.Key] = true // unless the row takes it once every slot is known (below)
			multi = append(multi, f)
			continue
		}
		if !ready {
			done[f.Key] = true
			rest = append(rest, spare{Freed: f, passes: true})
			continue
		}
		w := line[0]
		next[f.Key] = line[1:]
		room[w.Queue]--
		plan.HandOffs = append(plan.HandOffs, Admitted{ID: w.ID, Shard: f.Shard})
		holders = append(holders, holder{w.ID, w.Queue, f, nil})
		if f.Shard < 0 {
			done[f.Key] = true // a K = 1 key has one slot
		}
	}
	// A row of several keys that could not take its slot above, when the
	// slot came, may once every slot of the batch is known; otherwise the
	// slot is not handed off.
	for _, f := range multi {
		w := next[f.Key][0]
		also, ok := alsoSlots(w, rest, next, st.Tried, tried)
		if !ok || room[w.Queue] <= 0 {
			rest = append(rest, spare{Freed: f, passes: true})
			continue
		}
		handMulti(w, f, also)
	}
	for _, r := range rest {
		if !r.taken {
			plan.Rest = append(plan.Rest, r.Freed)
		}
	}
	slices.Sort(plan.Roomy)
	for _, h := range holders {
		if h.slot.Successor == "" {
			continue
		}
		line := next[h.slot.Key]
		if !slotPasses(h.slot, st) || (len(line) > 0 && !line[0].inTurn()) || st.Paused[h.queue] {
			plan.Yield = append(plan.Yield, h.id)
		}
	}
	if !st.Reserve {
		return plan
	}
	stopped := map[string]bool{} // keys whose reservations stopped
	for _, h := range holders {
		k := h.slot.Key
		if !slotPasses(h.slot, st) || roomy(h.slot, st) {
			continue
		}
		for n := 0; n < h.slot.Ahead && !stopped[k]; n++ {
			line := next[k]
			if len(line) == 0 || !reservable(line[0], h.queue, h.also, st.Runs) || st.Paused[h.queue] {
				stopped[k] = true
				break
			}
			next[k] = line[1:]
			plan.Reserved = append(plan.Reserved, Reservation{ID: line[0].ID, After: h.id})
		}
	}
	return plan
}

// spare is a freed slot no row of its key's line took: credited unless a
// row of several keys takes it (taken). Passes is false for a slot that
// may not pass on as it is (see slotPasses).
type spare struct {
	Freed
	passes, taken bool
}

// alsoHold is a slot w takes of one of its other keys: rest[at], or a
// Tried key (at -1).
type alsoHold struct {
	Hold
	at int
}

// takeAlso marks the slots and keys also (see alsoSlots) taken by w, which
// takes f, and returns w's admission.
func takeAlso(w Waiting, f Freed, also []alsoHold, rest []spare, tried map[string]bool) Admitted {
	a := Admitted{ID: w.ID, Shard: f.Shard, Also: make([]Hold, len(also))}
	for i, h := range also {
		if h.at >= 0 {
			rest[h.at].taken = true
		} else {
			tried[h.Key] = true
		}
		a.Also[i] = h.Hold
	}
	return a
}

// alsoSlots finds, for a waiting row of several keys, a slot of each of
// its other keys (see Free): a spare slot of the key whose line has no
// waiting row left, or a Tried key no earlier hand-off took. It reports
// false when a key has neither.
func alsoSlots(w Waiting, rest []spare, next map[string][]Waiting, tried, took map[string]bool) ([]alsoHold, bool) {
	also := make([]alsoHold, 0, len(w.Also))
	for _, k := range w.Also {
		at := -1
		if len(next[k]) == 0 {
			at = slices.IndexFunc(rest, func(r spare) bool { return r.Key == k && r.passes && !r.taken })
		}
		switch {
		case at >= 0:
			also = append(also, alsoHold{Hold{k, rest[at].Shard}, at})
		case tried[k] && !took[k]:
			also = append(also, alsoHold{Hold{k, -1}, -1})
		default:
			return nil, false
		}
	}
	return also, true
}

// inTurn reports whether w may take a freed slot by the order rule.
func (w Waiting) inTurn() bool { return InTurn(w.Turn, w.Head) }

// reservable reports whether w may be reserved as the successor of a row
// of queue whose other keys are also: a row of the same keys, a row of
// several keys only in the line of its first key (see Free).
func reservable(w Waiting, queue string, also []string, runs func(string, int) bool) bool {
	return w.inTurn() && !w.Policy && !w.Rated && sameKeys(w.Also, also) && (len(w.Also) == 0 || w.AtFirst) &&
		w.Queue == queue && (runs == nil || runs(w.Workflow, w.Version))
}

// sameKeys reports whether a and b hold the same keys, in any order.
func sameKeys(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// slotPasses reports whether the freed slot may pass to another row of its
// key as it is, by the key's limit now.
func slotPasses(f Freed, st FreeState) bool {
	lim, gated := st.Limits[f.Key]
	if f.Shard < 0 {
		return !gated && !st.Busy[f.Key]
	}
	if !gated || f.Shard >= lim.Shards {
		return false
	}
	rows := st.Counters[f.Key]
	i := slices.IndexFunc(rows, func(c Counter) bool { return c.Shard == f.Shard })
	return i >= 0 && rows[i].Available >= 0 && CleanShards(lim, rows, st.Count[f.Key])
}

// roomy reports whether f is a slot of a gate key that has free slots
// besides it: one of the key's counters, all of them read, has room.
func roomy(f Freed, st FreeState) bool {
	if f.Shard < 0 {
		return false
	}
	rows := st.Counters[f.Key]
	return len(rows) == st.Count[f.Key] && slices.ContainsFunc(rows, func(c Counter) bool { return c.Available > 0 })
}

// takes reports whether the worker can take w now.
func takes(w Waiting, room map[string]int, runs func(string, int) bool) bool {
	return w.inTurn() && !w.Policy && !w.Rated && room[w.Queue] > 0 && (runs == nil || runs(w.Workflow, w.Version))
}
