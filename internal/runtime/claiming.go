// Claiming: a queue's pick loop, how much it claims (free slots and rows
// ahead), and the buffer of claimed rows its executors take from.

package runtime

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/godurable/godurable/store"
)

type queueRunner struct {
	name   string
	n      int
	wakeCh chan struct{}
	work   chan store.Claimed
	// busy counts the rows claimed and not yet finished executing, and the
	// executor slots a flush holds for a hand-off. Only the pick loop adds
	// to it (a handed-off row takes a slot its flush held), so what it
	// reads free is free.
	busy atomic.Int64
	// stepNanos is a moving average of how long the queue's steps run,
	// and claimNanos of how long its claims take (see free).
	stepNanos  atomic.Int64
	claimNanos atomic.Int64
	// unflushed counts the queue's outcomes sent to the flusher and not
	// yet committed (not contended: their executors are free already).
	// Their rows still hold their slots: see free.
	unflushed atomic.Int64
	// aheadCap bounds the rows ahead of claims for steps longer than
	// shortStep (see free), and clean counts the claims in a row that came
	// back full passing no row over (see adaptAhead). Only the pick loop
	// reads and changes them.
	aheadCap int64
	clean    int
	// starved is set while the pick loop waits because it had no room to
	// claim (free was not positive): only then does room that frees up
	// wake it (see roomFreed). The loop sets it before it reads free, so
	// that room freed after that read finds it set.
	starved atomic.Bool
	// full is set while the queue's last claim took all the rows it asked
	// for: the pick loop claims again at once, and again whenever room
	// frees, until a claim comes back short or fails (see claiming).
	full atomic.Bool
	// idle counts the executors waiting for a row, and gated those running
	// a contended row that holds a gate's slot (see run and free).
	idle, gated atomic.Int64
	// paused is set while the queue is paused, as the last claim
	// (store.ClaimResult.Paused) or look at the paused queues said: no row
	// of it this engine holds claimed or reserved starts then; each is
	// released (see begin and takeSuccessor). pausedRead is when the read
	// that said so began (unix nanos), so that its snapshot is no older;
	// pausedSet orders the writes of the two, and pausedMu lets one
	// executor at a time read them again (knowPaused). pausedFailed is
	// when the last read that failed began.
	paused       atomic.Bool
	pausedRead   atomic.Int64
	pausedFailed atomic.Int64
	pausedSet    sync.Mutex
	pausedMu     sync.Mutex
}

// notePaused records that the queue was paused or not as of a read that
// began at at, unless a read that began later was recorded already.
func (q *queueRunner) notePaused(paused bool, at time.Time) {
	q.pausedSet.Lock()
	defer q.pausedSet.Unlock()
	if at.UnixNano() > q.pausedRead.Load() {
		q.paused.Store(paused)
		q.pausedRead.Store(at.UnixNano())
	}
}

// newQueueRunner is queue name's runner with n executors.
func newQueueRunner(name string, n int) *queueRunner {
	// The buffer holds every row a claim may take beyond the running ones
	// (see free), so that took never waits for an executor.
	q := &queueRunner{name: name, n: n, wakeCh: make(chan struct{}, 1), work: make(chan store.Claimed, (1+aheadMax)*n)}
	q.aheadCap = int64(n)
	return q
}

// shortStep is the average step duration under which a queue claims a
// whole executor's worth ahead: with steps this short, a claimed row waits
// in the buffer about one step, and executors that finish together need
// not wait for the next claim's round trip.
const shortStep = time.Millisecond

// free is how many rows the queue's next claim may take: one per executor
// and rows ahead, waiting in the buffer, less the rows it holds claimed
// (busy). Rows ahead spare executors that finish the wait for the next
// claim's round trip:
//
//   - while its steps are short (shortStep), as many again as executors:
//     a claimed row waits in the buffer about one step;
//   - for longer steps, as many as finish while a claim is in flight (n ×
//     claim time / step time, rounded down, at most the queue's cap on rows
//     ahead: see adaptAhead), so that a row waits about one claim's time,
//     not a step's: a row that waited a whole long step in one engine's
//     buffer, holding its key's slot, would be a row another engine could
//     have run, and with steps much longer than a claim nothing is claimed
//     ahead. Rows whose outcomes wait for the flusher, beyond one per
//     executor, count against these rows ahead: they hold their slots too,
//     and an engine that claimed ahead while its flush fell behind would
//     hold ever more of a gate's slots, until it found the gate full and
//     took the slow path of a contended key. Short steps do not count
//     them: there the flush keeps up, and counting them slows plain work.
//
// While an executor runs a contended row of a gate, nothing is claimed
// ahead: such executors go on with the slot's next rows (successors,
// hand-offs) rather than to the buffer, so a row claimed ahead would hold
// a slot of its gate in this engine while no executor here can run it, a
// slot an engine with idle executors could have used (a gate's slots
// spread over the fleet).
func (q *queueRunner) free() int {
	n, busy := int64(q.n), q.busy.Load()
	step := q.stepNanos.Load()
	switch {
	case step <= 0, q.gated.Load() > 0:
		return int(n - busy)
	case step < int64(shortStep):
		return int(2*n - busy)
	}
	ahead := min(n*q.claimNanos.Load()/step, q.aheadCap)
	behind := max(0, q.unflushed.Load()-n) // more outcomes unflushed than executors
	return int(n + max(0, ahead-behind) - busy)
}

// aheadMax bounds a queue's cap on rows ahead for steps longer than
// shortStep (see free), in executors.
const aheadMax = 3

// adaptAhead adapts the queue's cap on rows ahead to how its last claim
// went: it asked for asked rows, got got and passed passed rows over
// (store.ClaimResult.PassedOver). After two claims in a row that took all
// they asked for and passed no row over, the cap grows by n/4 per such
// claim, up to aheadMax × n; a claim that passed a few rows over (an
// eighth of what it got at most) holds it; any other brings it back to n.
//
// With 1 ms steps a claim takes several steps' time, and executors that
// finished their rows wait for the next one, while a bigger claim costs
// less per row, in its round trips and its commit. But rows passed over
// are keys the claim could not admit (K = 1 keys that this engine's own
// rows hold, a gate's last slots): asking for more would only read more of
// them, and wait for a flush to wake the next claim. So the cap grows only
// while claims come back full without passing rows over.
func (q *queueRunner) adaptAhead(asked, got, passed int) {
	n := int64(q.n)
	switch {
	case got == asked && passed == 0:
		if q.clean++; q.clean >= 2 {
			q.aheadCap = min(q.aheadCap+max(1, n/4), aheadMax*n)
		}
	case got > 0 && passed*8 <= got:
		q.clean = 0 // a few rows passed over: the cap holds
	default:
		q.clean = 0
		q.aheadCap = n
	}
}

// ran records how long a step of the queue ran, in the moving average
// (one eighth of the new value).
func (q *queueRunner) ran(d time.Duration) { movingAvg(&q.stepNanos, d) }

// claimed records how long a claim of the queue took, likewise.
func (q *queueRunner) claimed(d time.Duration) { movingAvg(&q.claimNanos, d) }

func movingAvg(v *atomic.Int64, d time.Duration) {
	old := v.Load()
	if old == 0 {
		v.Store(int64(d))
		return
	}
	v.Store(old + (int64(d)-old)/8)
}

func (q *queueRunner) wake() {
	select {
	case q.wakeCh <- struct{}{}:
	default:
	}
}

// roomFreed wakes the pick loop for room that freed up (an executor, a
// flush's executor slots, outcomes no longer unflushed) if the loop waits
// for room (starved). Otherwise its last claim took fewer rows than it
// could: room alone admits nothing more, and whatever makes rows ready
// wakes it on its own (a notification, a flush that freed slots rows
// wait for: see Scheduler.commit).
func (q *queueRunner) roomFreed() {
	if q.starved.Load() {
		q.wake()
	}
}

func (s *Scheduler) pickLoop(q *queueRunner) {
	defer s.pickWG.Done()
	e := s.e
	out := newRetrier(e.outage, "claim "+q.name)
	workflows := e.workflowVersions()
	for !s.stopping.Load() {
		wait := e.cfg.PollInterval
		q.starved.Store(true) // before free is read: see roomFreed
		if free := q.free(); free > 0 {
			q.starved.Store(false)
			// The claim itself makes the queue's due delayed rows and timed
			// out awaits ready (see store.Store, Claim).
			sent := time.Now()
			req := e.claimRequest(q.name, free, workflows)
			if s.handOffs {
				// Successors for the rows of keys the claim finds full, so
				// that their slots' next steps need not wait for the first
				// flush (see took).
				req.Reserve = s.ahead(q.stepNanos.Load())
			}
			res, err := e.st.Claim(s.bgCtx, req)
			if err != nil {
				if s.bgCtx.Err() != nil {
					return
				}
				q.full.Store(false) // it waits out a backoff
				wait = out.fail(err)
			} else {
				out.ok()
				q.claimed(time.Since(sent))
				q.notePaused(res.Paused, sent)
				got := s.took(q, res.Claimed, sent.Add(e.cfg.Lease))
				q.adaptAhead(free, got, res.PassedOver)
				q.full.Store(got == free)
				if got == free {
					continue // there may be more ready work
				}
				if nextDue := res.NextDue; !nextDue.IsZero() {
					wait = min(wait, max(time.Millisecond, nextDue.Sub(e.cfg.Clock.Now())))
				}
			}
		} else {
			// No room to claim (its executors run chains of a busy key's
			// steps, say): a look at the paused queues stands in for the
			// claim's answer, every half interval however often the loop
			// is woken, so that the executors seldom have to look before
			// they start a successor (see knowPaused).
			if since := time.Since(time.Unix(0, q.pausedRead.Load())); since >= e.cfg.PollInterval/2 {
				s.readPaused(q)
				wait = e.cfg.PollInterval / 2
			} else {
				wait = e.cfg.PollInterval/2 - since
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-q.wakeCh:
		case <-t.C:
		case <-s.bgCtx.Done():
		}
		t.Stop()
	}
}

// readPaused reads whether q is paused (store.Store.PausedQueues). A
// failed read keeps what q knew: the next claim or look tells.
func (s *Scheduler) readPaused(q *queueRunner) {
	at := time.Now()
	ctx, cancel := context.WithTimeout(s.bgCtx, s.e.cfg.PollInterval+time.Second)
	defer cancel()
	list, err := s.e.st.PausedQueues(ctx)
	if err != nil {
		q.pausedFailed.Store(at.UnixNano())
		return
	}
	q.notePaused(slices.ContainsFunc(list, func(p store.QueuePause) bool { return p.Queue == q.name }), at)
}

// knowPaused makes sure that what q knows of its pause comes from a read
// (a claim's or a look's) that began less than half a poll interval ago,
// reading it again otherwise, one executor at a time, the others waiting
// for that read: a row is about to start in q, and the README promises
// that no step starts later than a pause's commit plus one interval. A
// read that begins after the commit sees the pause, so a row starts at
// most half an interval after it, plus the time from this check to its
// step's call, whatever a claim, hand-off or read took to answer. While
// the store cannot be read, one read is tried per half interval and the
// rows start on what q knew.
func (s *Scheduler) knowPaused(q *queueRunner) {
	fresh := func() bool {
		half := s.e.cfg.PollInterval / 2
		return time.Since(time.Unix(0, q.pausedRead.Load())) < half || time.Since(time.Unix(0, q.pausedFailed.Load())) < half
	}
	if fresh() {
		return
	}
	q.pausedMu.Lock()
	defer q.pausedMu.Unlock()
	if !fresh() {
		s.readPaused(q)
	}
}

// took takes the rows a claim returned: it tracks them all, queues each
// reservation (Claimed.After) behind the row it follows (queueAfter), and
// only then sends the rows the claim admitted to q's executors (one that
// cannot start gives its reservations back: see begin). It returns how
// many rows the claim admitted.
func (s *Scheduler) took(q *queueRunner, cs []store.Claimed, validUntil time.Time) int {
	var back []store.ClaimRef
	var followed map[string]bool // rows with reservations queued
	s.mu.Lock()
	for _, c := range cs {
		s.inflight[c.ID] = &claimState{ref: refOf(c), validUntil: validUntil}
	}
	for _, c := range cs {
		switch {
		case c.After == "":
		case s.queueAfter(c):
			if followed == nil {
				followed = map[string]bool{}
			}
			followed[c.After] = true
		default:
			back = append(back, refOf(c)) // nothing will run it here
		}
	}
	s.mu.Unlock()
	s.release(back)
	n := 0
	for _, c := range cs {
		if c.After != "" {
			continue
		}
		// A row with successors passes its slot on to them (see run): an
		// executor that sent its outcome down the uncontended path would
		// leave them queued.
		c.Contended = c.Contended || followed[c.ID]
		n++
		q.busy.Add(1)
		q.work <- c
	}
	return n
}

// queueAfter queues reservation c at the end of the chain of the row it
// follows, which must be tracked (s.mu held): reservations run in the
// order made. It reports false when no such row is tracked here.
func (s *Scheduler) queueAfter(c store.Claimed) bool {
	holder := s.inflight[c.After]
	if holder == nil {
		return false
	}
	end, _ := s.chainEnd(holder.ref)
	if st := s.inflight[end.ID]; st != nil && st.ref == end && st.yielded {
		return false // its executor left the slot's chain
	}
	s.succ[end] = c
	return true
}

func (s *Scheduler) untrack(id string, fence int64) {
	s.mu.Lock()
	if st := s.inflight[id]; st != nil && st.ref.Fence == fence {
		delete(s.inflight, id)
	}
	delete(s.moved, store.ClaimRef{ID: id, Fence: fence})
	s.mu.Unlock()
}
