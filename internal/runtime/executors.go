// Running steps: a queue's executors, and the chains of successors that
// run one after another in a busy key's slot.

package runtime

import (
	"context"
	"time"

	"github.com/godurable/godurable/store"
)

func (s *Scheduler) executor(q *queueRunner) {
	defer s.execWG.Done()
	var toRelease []store.ClaimRef
	q.idle.Add(1)
	for c := range q.work {
		q.idle.Add(-1)
		for r := s.begin(c, &toRelease); r != nil; {
			r = s.run(q, r, &toRelease)
		}
		q.idle.Add(1)
	}
	q.idle.Add(-1)
	s.release(toRelease)
}

// waiting reports whether a claimed row waits in q's buffer with no
// executor free to take it: a chain that goes on in its slot would keep
// that row, and the slot of its key it holds, waiting.
func (q *queueRunner) waiting() bool { return len(q.work) > 0 && q.idle.Load() == 0 }

// running is a claim whose step an executor is about to run.
type running struct {
	c      store.Claimed
	st     *claimState
	ctx    context.Context
	cancel context.CancelFunc
	// gate: it is contended and holds a gate's slot (see free).
	gate bool
	// pred is, for a successor, its predecessor's outcome, sent to the
	// flusher as the successor's step starts (see run).
	pred *flushItem
}

// startKey carries, in a step's context, what the runtime does as the
// step's function is about to be called (see withStart and StepStarting).
type startKey struct{}

// withStart returns ctx carrying fn, which StepStarting calls.
func withStart(ctx context.Context, fn func() bool) context.Context {
	return context.WithValue(ctx, startKey{}, fn)
}

// StepStarting is called by a Host's Execute right before it calls the
// step's function, and only then; it reports whether to call it. When it
// reports false the step does not start: Execute returns at once, and the
// runtime ignores its outcome. It lets the runtime start a step and tell
// the store it did as one act (see run).
func StepStarting(ctx context.Context) bool {
	if fn, ok := ctx.Value(startKey{}).(func() bool); ok {
		return fn()
	}
	return true
}

// begin marks claim c started, unless it is lost, canceled, its queue
// paused or the engine stopping: then it gives it back (or forgets it,
// lost), with any reservation made for it, and frees its executor slot.
func (s *Scheduler) begin(c store.Claimed, toRelease *[]store.ClaimRef) *running {
	q := s.queues[c.Queue]
	s.knowPaused(q)
	ref := store.ClaimRef{ID: c.ID, Fence: c.Fence}
	s.mu.Lock()
	st := s.inflight[c.ID]
	lost := st == nil || st.lost || st.ref != ref
	canceled := !lost && st.canceled
	stopping := s.stopping.Load() || q.paused.Load()
	var r *running
	if !lost && !canceled && !stopping {
		ctx, cancel := context.WithCancel(s.runCtx)
		st.cancel = cancel
		r = &running{c: c, st: st, ctx: ctx, cancel: cancel, gate: c.Contended && c.KeyShard >= 0}
	}
	s.mu.Unlock()
	if r != nil {
		return r
	}
	switch {
	case lost:
		s.untrack(c.ID, c.Fence)
	case canceled:
		// Canceled before it started: releasing the claim cancels the
		// instance (see store.Store, Cancel).
		s.release([]store.ClaimRef{ref})
	case !s.stopping.Load():
		s.release([]store.ClaimRef{ref}) // its queue is paused: back to ready at once
	default:
		*toRelease = append(*toRelease, ref)
	}
	s.dropSuccessor(ref, toRelease)
	q.busy.Add(-1)
	q.roomFreed()
	return nil
}

// run runs a started claim in one of q's executors and returns the
// reservation the executor goes on with in the same slot (see
// takeSuccessor), or nil when the executor's slot is free again or went to
// a flush with the outcome.
func (s *Scheduler) run(q *queueRunner, r *running, toRelease *[]store.ClaimRef) *running {
	c := r.c
	ref := store.ClaimRef{ID: c.ID, Fence: c.Fence}
	if r.gate {
		q.gated.Add(1)
	}
	ctx := r.ctx
	pred := r.pred
	started := true
	if pred != nil {
		// A successor: its predecessor's outcome, which passes it the
		// slot, is sent only once its step is about to start, and then
		// only if its instance was not canceled before: a Cancel that
		// waits for the reservation to be given back or passed its slot
		// (durable.Engine.Cancel) then never returns before the step
		// starts, and a canceled one never starts.
		ctx = withStart(ctx, func() bool {
			s.mu.Lock()
			started = !r.st.canceled
			s.mu.Unlock()
			if !started {
				// The slot goes back with the predecessor's outcome, as if
				// it had no successor.
				pred.o.Successor, pred.successor, pred.slot = store.ClaimRef{}, store.ClaimRef{}, true
			}
			s.handCh <- *pred
			pred = nil
			return started
		})
	}
	began := time.Now()
	out := s.e.execute(ctx, c)
	q.ran(time.Since(began))
	if r.gate {
		q.gated.Add(-1)
	}
	if pred != nil { // the step did not reach its function (its outcome is a failure to commit)
		s.handCh <- *pred
	}
	hard := s.runCtx.Err() != nil
	r.cancel()
	if !started {
		// Canceled before it started: releasing the reservation (or the
		// claim its predecessor's outcome passed it) cancels the instance.
		// Its executor slot went to the flush with that outcome.
		s.release([]store.ClaimRef{ref})
		s.dropSuccessor(ref, toRelease)
		return nil
	}
	switch {
	case hard:
		// Cut short by the stop deadline: not the step's fault, so the
		// claim goes back with its attempt unchanged.
		*toRelease = append(*toRelease, ref)
		s.dropSuccessor(ref, toRelease)
	case !c.Contended:
		q.unflushed.Add(1)
		s.flushCh <- flushItem{o: out, queue: q.name}
	case q.waiting() && !s.stopping.Load():
		// A row claimed here waits for an executor, holding a slot of its
		// key: this executor goes to it, and the slot this step held is
		// freed the claim's way (credited, its key's next row promoted, in
		// turn for whichever engine claims it) instead of going on along
		// this slot's chain, whose reservations are given back. The
		// outcome goes to the flusher of contended outcomes all the same,
		// without the executor slot: a successor's outcome must not commit
		// before its predecessor's, which passes it the slot.
		s.mu.Lock()
		r.st.yielded = true
		s.mu.Unlock()
		s.dropSuccessor(ref, toRelease)
		out.Contended = true
		s.handCh <- flushItem{o: out, queue: q.name}
	default:
		// A step whose key had rows waiting passes its executor slot on:
		// to the successor reserved for it, which starts now, in the slot
		// the step held (its outcome passes the slot to it), or else to
		// the flush of its outcome, as the slot the outcome frees will
		// likely be handed straight back to this engine (see commit).
		out.Contended = true
		s.knowPaused(q)
		if next := s.takeSuccessor(r.st, toRelease); next != nil {
			next.gate = r.gate // it runs in the same slot
			out.Successor = store.ClaimRef{ID: next.c.ID, Fence: next.c.Fence}
			next.pred = &flushItem{o: out, queue: q.name, successor: store.ClaimRef{ID: next.c.ID, Fence: next.c.Fence}}
			return next
		}
		s.handCh <- flushItem{o: out, queue: q.name, slot: true}
		return nil
	}
	q.busy.Add(-1)
	q.roomFreed()
	return nil
}

// takeSuccessor takes the reservation made for the claim whose step just
// ended (pred is its state) and starts it in the same slot: its step is
// bound by pred's lease too, until the outcome that passes the slot to it
// commits (see handed). A reservation that cannot run (lost, canceled,
// its queue paused, the engine stopping, pred lost) is released instead.
func (s *Scheduler) takeSuccessor(pred *claimState, toRelease *[]store.ClaimRef) *running {
	s.mu.Lock()
	id := pred.ref
	c, ok := s.succ[id]
	ref := store.ClaimRef{ID: c.ID, Fence: c.Fence}
	var r *running
	var refused []store.ClaimRef
	paused := false
	if q := s.queues[c.Queue]; ok && q != nil {
		paused = q.paused.Load()
	}
	if st := s.inflight[c.ID]; ok && st != nil && st.ref == ref && !st.lost && !st.canceled &&
		!s.stopping.Load() && !pred.lost && !paused {
		delete(s.succ, id)
		ctx, cancel := context.WithCancel(s.runCtx)
		st.cancel, st.pred = cancel, pred
		r = &running{c: c, st: st, ctx: ctx, cancel: cancel}
		s.moved[id] = ref
	} else if ok {
		refused = s.popChain(id) // the rest of the chain would run in this slot
	}
	s.mu.Unlock()
	for _, ref := range refused {
		s.giveBack(ref, toRelease)
	}
	return r
}

// giveBack releases a claim or reservation that will not run here: at
// once, or with the executor's last release once the engine is stopping.
func (s *Scheduler) giveBack(ref store.ClaimRef, toRelease *[]store.ClaimRef) {
	if s.stopping.Load() {
		*toRelease = append(*toRelease, ref)
		return
	}
	s.release([]store.ClaimRef{ref})
}

// dropSuccessor releases the reservations queued after claim id, if any:
// that claim's step will not run here, nor will they.
func (s *Scheduler) dropSuccessor(id store.ClaimRef, toRelease *[]store.ClaimRef) {
	s.mu.Lock()
	refs := s.popChain(id)
	s.mu.Unlock()
	for _, r := range refs {
		s.giveBack(r, toRelease)
	}
}
