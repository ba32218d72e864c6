// Committing outcomes: the flushers that group-commit outcomes, hand freed
// slots on (store.HandOffer) and take the rows and successors handed back.

package runtime

import (
	"context"
	"slices"
	"time"

	"github.com/godurable/godurable/store"
)

// flushItem is an outcome on its way to a flusher, with the queue whose
// executor ran it. On handCh the executor slot goes with it (busy still
// counts it): the flush hands it a row or gives it back.
type flushItem struct {
	o     store.Outcome
	queue string
	// slot: the executor slot came with the outcome (a contended outcome
	// whose executor did not go on with a successor). successor: the
	// reservation the outcome passes its slot to, already running.
	slot      bool
	successor store.ClaimRef
}

// release returns claims that did not run to the store and forgets them.
func (s *Scheduler) release(refs []store.ClaimRef) {
	if len(refs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := s.e.st.Release(ctx, s.e.cfg.WorkerID, refs, s.e.storeNow()); err != nil {
		s.e.log.Warn("release claims; the reaper will take them back", "n", len(refs), "err", err)
	}
	cancel()
	for _, r := range refs {
		s.untrack(r.ID, r.Fence)
	}
}

// handFlushers is how many flushes of contended outcomes an engine keeps
// in flight, beside the one of the other outcomes. A contended outcome's
// executor waits for its flush to be handed a row, so these flushes are
// kept apart from plain work's batch (which grows while it is in flight:
// fewer, larger transactions, what plain throughput needs) and do not wait
// behind it. There must be one: a successor's outcome is sent after the
// outcome that passes it the slot (see run), and must commit after it,
// which one flusher's order keeps (built with two, make bench's scenario
// 11 stalled with a row left executing, its outcome never committed). A
// second fed by key, so that a chain's outcomes share one, gave scenario
// 11's rows of several keys nothing (one ABBA pair, 2026-12-04).
const handFlushers = 1

// flusher group-commits the outcomes of ch; withSlots says that their
// executor slots come with them (handCh).
func (s *Scheduler) flusher(ch chan flushItem, withSlots bool) {
	defer s.flushWG.Done()
	e := s.e
	out := newRetrier(e.outage, "flush")
	max := e.cfg.MaxFlushBatch
	// items is the batch, its array kept from flush to flush, so that a
	// busy engine does not allocate a batch per flush. It is cleared after
	// each flush, so that it keeps no outcome's state alive.
	var items []flushItem
	for first := range ch {
		items = append(items[:0], first)
	drain:
		for len(items) < max {
			select {
			case it, ok := <-ch:
				if !ok {
					break drain
				}
				items = append(items, it)
			default:
				break drain
			}
		}
		s.commit(items, withSlots, out)
		if !withSlots {
			woken := map[*queueRunner]bool{}
			for _, it := range items {
				q := s.queues[it.queue]
				q.unflushed.Add(-1)
				if !woken[q] {
					woken[q] = true
					q.roomFreed() // its outcomes counted against its room (see free)
				}
			}
		}
		clear(items)
	}
}

// commit flushes one batch (see Runtime.commitOutcomes), retrying with
// backoff while the store is down, until the stop deadline passes (then the
// leases expire and the reaper retries the steps: at-least-once).
//
// With slots (withSlots: contended outcomes), the store may pass the slots
// the batch frees on (store.HandOffer): to the successors the outcomes name
// (reserved earlier: running already, or attached here when reserved after
// their predecessor's step ended), or straight to the next waiting rows of
// their keys, which go to the executor slots that came with the batch; it
// reserves successors for the rows it makes executing (see handed). The
// slots left over are given back once the flush is done.
func (s *Scheduler) commit(items []flushItem, withSlots bool, out *retrier) {
	e := s.e
	batch := make([]store.Outcome, len(items))
	room := map[string]int{}                       // executor slots this flush holds, per queue
	running := map[store.ClaimRef]bool{}           // successors already running, passed a slot by this batch
	attached := map[store.ClaimRef]store.Claimed{} // successors attached here, to run once passed a slot
	attachedIn := map[string]int{}                 // how many of the slots of each queue they take
	for i, it := range items {
		batch[i] = it.o
		if it.successor.ID != "" {
			running[it.successor] = true
		}
		if withSlots && it.slot {
			room[it.queue]++
			if c, ok := s.attachSuccessor(store.ClaimRef{ID: it.o.ID, Fence: it.o.Fence}); ok {
				batch[i].Successor = store.ClaimRef{ID: c.ID, Fence: c.Fence}
				attached[refOf(c)] = c
				attachedIn[it.queue]++
			}
		}
	}
	if withSlots {
		d := s.depth(items)
		s.mu.Lock()
		for i := range batch {
			batch[i].Ahead = d
			if batch[i].Successor.ID != "" {
				batch[i].Ahead = max(0, d-s.chainLen(batch[i].Successor))
			}
		}
		s.mu.Unlock()
		began := time.Now()
		defer func() {
			old := s.flushNanos.Load()
			s.flushNanos.Store(old + (int64(time.Since(began))-old)/8)
		}()
	}
	var ho *store.HandOff
	if s.handOffs && withSlots {
		// Even when stopping: the successors that run already must be
		// passed their slots.
		ho = &store.HandOff{Room: map[string]int{}, Workflows: e.workflowVersions(), Lease: e.cfg.Lease}
		if !s.stopping.Load() {
			for name, n := range room {
				ho.Room[name] = n - attachedIn[name]
			}
			ho.Reserve = true
		}
	}
	if s.handOffs && s.claiming() {
		if ho == nil { // a plain Complete but for Claiming (see store.HandOff)
			ho = &store.HandOff{Room: map[string]int{}}
		}
		ho.Claiming = true
	}
	defer func() {
		for name, n := range room { // the slots no row was handed
			if n > 0 {
				s.queues[name].busy.Add(-int64(n))
				s.queues[name].roomFreed()
			}
		}
	}()
	passed := 0                      // outcomes whose slot went to a row this engine runs
	got := map[store.ClaimRef]bool{} // rows the store returned, by claim
	_ = e.commitOutcomes(s.runCtx, batch, commitHooks{
		handOff: ho,
		handed: func(cs []store.Claimed, validUntil time.Time) {
			for _, c := range cs {
				got[refOf(c)] = true
			}
			for q, n := range s.handed(cs, running, attached, validUntil) {
				room[q] -= n
				passed += n
			}
			for _, c := range cs {
				if running[refOf(c)] {
					passed++
				}
			}
		},
		committed: func(b []store.Outcome, res []store.OutcomeResult) {
			out.ok()
			e.countStale(res)
			inBatch := map[store.ClaimRef]bool{}
			for _, o := range b {
				inBatch[store.ClaimRef{ID: o.ID, Fence: o.Fence}] = true
			}
			for i, o := range b {
				if inBatch[o.Successor] && !res[i].Stale {
					passed++ // its slot went on along a chain in the batch
				}
			}
			for i, o := range b {
				if res[i].Yield && !res[i].Stale {
					s.yieldChain(o.Successor)
				}
			}
			for _, o := range b {
				s.untrack(o.ID, o.Fence)
				if next := o.Successor; next.ID != "" && !got[next] && !inBatch[next] {
					// Not passed the slot (the outcome was stale): a
					// running successor stops, an attached one goes back.
					s.successorRefused(next, running[next])
				}
			}
			e.notifyFlushed()
			// A freed slot may admit blocked work, and an outcome that is
			// not terminal leaves its row to run again: wake the pick
			// loops, unless every slot of the batch went straight to a row
			// this engine runs (the common case of a saturated key), where
			// a claim would only find the key full again, or the batch
			// left nothing to claim (quiet).
			if passed < len(items) && !quiet(b, res) {
				s.WakeAll()
			}
		},
		abandoned: func(o store.Outcome) {
			s.untrack(o.ID, o.Fence)
			if next := o.Successor; next.ID != "" {
				s.successorRefused(next, running[next])
			}
		},
		unreachable: func(err error) bool {
			if s.runCtx.Err() != nil {
				e.log.Error("outcomes not committed before stop; the reaper will retry their steps", "n", len(batch), "err", err)
				return false
			}
			t := time.NewTimer(out.fail(err))
			defer t.Stop()
			select {
			case <-t.C:
				return true
			case <-s.runCtx.Done():
				e.log.Error("outcomes not committed before stop; the reaper will retry their steps", "n", len(batch), "err", err)
				return false
			}
		},
	})
}

// quiet reports whether a committed batch of outcomes left nothing for a
// claim to take: every outcome is terminal and the store knows no row
// waits for the slot it freed (store.OutcomeResult.Unwaited). Rows that
// become ready otherwise (an insert, a promotion, a parent's join, a
// signal) come with a notification of their own. A claim after the last
// outcomes of a burst would find nothing, and would hold a connection of
// the pool while the application may want one.
func quiet(b []store.Outcome, res []store.OutcomeResult) bool {
	if len(res) != len(b) {
		return false
	}
	for i, o := range b {
		if !o.Kind.Terminal() || !res[i].Unwaited {
			return false
		}
	}
	return true
}

// depth is how many reservations a chain keeps ahead of its running step:
// enough for the steps that end while the flush that will reserve more is
// waiting for the one in flight and then in flight itself (two flush
// times' worth, each step ending when the next starts), and a third flush
// time for a flush slower than the average, plus 2, so that a slot's steps
// follow one another without waiting for a commit. It is 2 for steps much
// longer than a flush, and at most 16. One flush time's worth is too few
// for 1 ms steps: a step ends before the flush that reserves its successor
// returns, and its slot waits for a commit. Flush times vary (a slow one
// takes several times the average), so the third flush time keeps a
// busy machine's chains from breaking.
func (s *Scheduler) depth(items []flushItem) int {
	step := int64(0)
	for _, it := range items {
		if q := s.queues[it.queue]; q != nil {
			step = max(step, q.stepNanos.Load())
		}
	}
	return s.ahead(step)
}

// ahead is depth for steps of step nanoseconds on average (0: none ran
// yet, when one reservation is asked for: the flush of the step it
// follows reserves more).
func (s *Scheduler) ahead(step int64) int {
	flush := s.flushNanos.Load()
	if step <= 0 || flush <= 0 {
		return 1
	}
	return int(min(16, 2+(3*flush+step-1)/step))
}

// chainEnd follows the slot of claim id to the last reservation queued in
// it, through the reservations that took it over (moved) and those queued
// (succ), and counts the latter (s.mu held). It stops at a claim seen
// twice (a link left by a claim that ended without its outcome
// committing must not make it loop).
func (s *Scheduler) chainEnd(id store.ClaimRef) (store.ClaimRef, int) {
	n := 0
	// Chains are short (depth: at most 16 reservations): the claims seen
	// are kept in an array on the stack and searched, as this runs for
	// every outcome of a flush of contended claims.
	var buf [32]store.ClaimRef
	seen := buf[:0]
	for !slices.Contains(seen, id) {
		seen = append(seen, id)
		if c, ok := s.succ[id]; ok {
			id = store.ClaimRef{ID: c.ID, Fence: c.Fence}
			n++
			continue
		}
		if next, ok := s.moved[id]; ok {
			id = next
			continue
		}
		break
	}
	return id, n
}

// chainLen counts the reservations queued in the slot of claim id after
// the step that runs in it (s.mu held).
func (s *Scheduler) chainLen(id store.ClaimRef) int {
	_, n := s.chainEnd(id)
	return n
}

// attachSuccessor takes the reservation made for claim id, whose outcome
// is on its way with its executor slot: the outcome names it, and the
// reservation runs in that slot once the outcome commits. One that cannot
// run (lost, canceled, the engine stopping) is released instead.
func (s *Scheduler) attachSuccessor(id store.ClaimRef) (store.Claimed, bool) {
	s.mu.Lock()
	c, ok := s.succ[id]
	ref := store.ClaimRef{ID: c.ID, Fence: c.Fence}
	st := s.inflight[c.ID]
	runnable := ok && st != nil && st.ref == ref && !st.lost && !st.canceled && !s.stopping.Load()
	var refused []store.ClaimRef
	if runnable {
		delete(s.succ, id)
		s.moved[id] = ref
	} else if ok {
		refused = s.popChain(id)
	}
	s.mu.Unlock()
	s.release(refused)
	return c, runnable
}

// yieldChain gives back the reservations queued in the slot that claim ref
// took over, after the step that runs in it now (the store found the
// slot's key out of turn: store.OutcomeResult.Yield), and marks that step
// so that no reservation queues after it: the slot frees when it ends.
func (s *Scheduler) yieldChain(ref store.ClaimRef) {
	s.mu.Lock()
	for range 32 { // to the step running in the slot now (chains are short)
		next, ok := s.moved[ref]
		if !ok {
			break
		}
		ref = next
	}
	refs := s.popChain(ref)
	if st := s.inflight[ref.ID]; st != nil && st.ref == ref {
		st.yielded = true
	}
	s.mu.Unlock()
	s.release(refs)
}

// successorRefused handles a successor whose predecessor's outcome did not
// pass it a slot: a running one is stopped (its outcome will be stale, and
// its reservation is left to expire, by which time its step has ended); an
// attached one, not started, is released.
func (s *Scheduler) successorRefused(ref store.ClaimRef, running bool) {
	if !running {
		s.mu.Lock()
		refs := append([]store.ClaimRef{ref}, s.popChain(ref)...)
		s.mu.Unlock()
		s.release(refs)
		return
	}
	s.mu.Lock()
	if st := s.inflight[ref.ID]; st != nil && st.ref == ref {
		st.lost = true
		st.stop()
	}
	s.mu.Unlock()
}

// handed takes the rows a flush's hand-off returned: reservations wait
// in succ for the step they follow; successors already running have their
// slot now (their lease is their own again); every other row (a hand-off,
// or a successor attached to its predecessor's outcome, which goes as it
// was reserved) goes to an executor, taking an executor slot the flush
// held, or, once Stop has closed the work channels, back to the store. It
// returns how many rows went to executors, per queue.
func (s *Scheduler) handed(cs []store.Claimed, running map[store.ClaimRef]bool, attached map[store.ClaimRef]store.Claimed, validUntil time.Time) map[string]int {
	dispatched := map[string]int{}
	s.workMu.Lock()
	closed := s.workClosed
	var back []store.ClaimRef
	// Every row is tracked, and every reservation queued, before any row
	// goes to an executor: one that cannot start gives its reservations
	// back (see begin).
	s.mu.Lock()
	for _, c := range cs {
		ref := store.ClaimRef{ID: c.ID, Fence: c.Fence}
		if st := s.inflight[c.ID]; st != nil && st.ref == ref {
			st.validUntil = later(st.validUntil, validUntil)
			if running[ref] {
				st.pred = nil
			}
		} else {
			s.inflight[c.ID] = &claimState{ref: ref, validUntil: validUntil}
		}
		if c.After == "" {
			continue
		}
		if closed || !s.queueAfter(c) {
			back = append(back, ref) // nothing will run it here
		}
	}
	s.mu.Unlock()
	for _, c := range cs {
		switch {
		case c.After != "", running[refOf(c)]:
		case closed:
			back = append(back, store.ClaimRef{ID: c.ID, Fence: c.Fence}) // its executor slot is given back with the others
		default:
			if a, ok := attached[refOf(c)]; ok {
				c = a // the store returns a successor's id only
				c.Status = store.StatusExecuting
			}
			dispatched[c.Queue]++
			s.queues[c.Queue].work <- c // never blocks: busy counted the slot
		}
	}
	s.workMu.Unlock()
	s.release(back)
	return dispatched
}

// refOf is c's claim: an instance may be in one flush under two claims
// (an outcome, and the row handed back to its next step).
func refOf(c store.Claimed) store.ClaimRef { return store.ClaimRef{ID: c.ID, Fence: c.Fence} }

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
