package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/godurable/godurable/store"
)

// The scheduler, top to bottom:
//
//	pick loop (one per queue) ── Claim(free slots) ──▶ work buffer ──▶ executors (N per queue)
//	                                                                    │ outcome
//	flushers ◀──────────────────────────────────────────────────────────┘
//	   group-commit every outcome that arrived while the previous flush was in flight,
//	   then wake the pick loops (a freed slot may admit blocked work), unless the batch
//	   left nothing to claim (see quiet); room that frees up wakes a pick loop only
//	   while it waits for room (see roomFreed). Outcomes of
//	   contended claims (rows waited for their key) go to flushers of their own, with
//	   their executor slots: the store may hand each freed slot straight to the key's
//	   next waiting row (store.HandOffer), which goes to that executor without a claim.
//	heartbeat loop: extends the leases of every claim not yet committed; a lost
//	   claim's step context is cancelled and its outcome will be stale; a
//	   canceled instance's step context is cancelled (its outcome cancels it).
//	   A claim this engine cannot have renewed before its lease ends (by its
//	   own clock: the store is unreachable) is given up: its step context is
//	   cancelled before another engine may take the row over.
//	notifications: work became ready (wake a pick loop), or an instance this
//	   engine runs was canceled (cancel its step context at once).
//	maintenance loop: fires due await timeouts, reaps expired leases, reconciles counters.
//	schedule loop: sleeps until the next tick of this engine's schedules, then records
//	   it and starts its instance (one fleet-wide: see Schedule).
//
// Claims are sized to free executor slots and rows ahead, as many as the
// executors finish while a claim is in flight (see free and adaptAhead), so
// a claimed row never waits long in the buffer; buffered rows hold their
// slots (they are claimed), and are released, not run, once Stop begins.

// Scheduler is the live runtime of one started engine (see Runtime.NewScheduler).
type Scheduler struct {
	e        *Runtime
	runCtx   context.Context // cancelled when Stop's deadline passes
	hardStop context.CancelFunc
	bgCtx    context.Context // cancelled when the loops must exit
	bgStop   context.CancelFunc
	stopping atomic.Bool

	queues  map[string]*queueRunner
	flushCh chan flushItem // outcomes of claims that were not contended
	handCh  chan flushItem // outcomes of contended claims, with their executor slots
	// workMu guards sending on the queues' work channels against their
	// close at stop: the flusher hands rows to executors too.
	workMu     sync.Mutex
	workClosed bool

	// listening is set once Listen has started listening.
	listening bool
	// beat asks the heartbeat loop for a heartbeat at once (see Listen).
	beat chan struct{}

	// handOffs: the store hands slots off (store.HandOffer), so claims ask
	// it for successors too (see took).
	handOffs bool

	mu       sync.Mutex
	inflight map[string]*claimState
	// succ holds the reservations hand-off flushes and claims made (store.Claimed.After)
	// as chains: by the claim or reservation (id and fence: an instance
	// runs many steps) whose step each runs after, in the same slot, until an executor (that step ended) or
	// a flusher (that step's outcome is on its way without it) takes it.
	succ map[store.ClaimRef]store.Claimed
	// moved links a claim or reservation whose step ended to the
	// reservation that went on in its slot, until its outcome commits: a
	// flush in flight may still reserve successors after it, and those go
	// to the end of the slot's chain.
	moved map[store.ClaimRef]store.ClaimRef
	// flushNanos is a moving average of how long a flush of contended
	// outcomes takes (see depth).
	flushNanos atomic.Int64

	execWG  sync.WaitGroup
	pickWG  sync.WaitGroup
	flushWG sync.WaitGroup
	bgWG    sync.WaitGroup
}

type claimState struct {
	ref    store.ClaimRef
	cancel context.CancelFunc
	// lost: the claim is no longer held (or may not be: its lease could not
	// be renewed in time); canceled: its instance was canceled.
	lost, canceled bool
	// yielded: the claim's step ended and its executor left the slot's
	// chain for a row waiting in the buffer (see run): no reservation
	// goes on in that slot.
	yielded bool
	// validUntil is, by this engine's monotonic clock, the latest time the
	// lease is sure to hold: the send time of the claim or of the last
	// heartbeat that renewed it, plus the lease.
	validUntil time.Time
	// pred is, for a reservation (store.Claimed.After) whose step runs in
	// its predecessor's slot, the predecessor's claim until the outcome
	// that passes the slot commits: the step must stop before either lease
	// may end (see leaseWatchdog).
	pred *claimState
}

// stop cancels the claim's step context, if its step has started.
func (st *claimState) stop() {
	if st.cancel != nil {
		st.cancel()
	}
}

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
// not wait for the next claim's round trip. Plain no-op steps ran about a
// quarter faster with it (the godurable peers driver alone, plain, 100
// executors: 28,837-29,283 steps/s against 23,219-23,927).
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
//     and an engine that claimed ahead while its flush fell behind held
//     ever more of a gate's slots (make bench's scenario 4, a gate of 1,000
//     with 200 executors and 1 ms steps, then found the gate full, took the
//     slow path of a contended key and fell from about 18,000 to
//     4,000-5,000 steps/s in about half its runs). Short steps do not count
//     them: plain no-op steps ran about a fifth slower when they did.
//
// While an executor runs a contended row of a gate, nothing is claimed
// ahead: such executors go on with the slot's next rows (successors,
// hand-offs) rather than to the buffer, so a row claimed ahead would hold
// a slot of its gate in this engine while no executor here can run it, a
// slot an engine with idle executors could have used (a gate's slots
// spread over the fleet).
//
// The peers driver alone, 500 keys K = 1, 1 ms steps, three runs each, ran
// 15,501-15,926 steps/s without rows ahead for 1 ms steps and
// 16,678-18,374 with them, before the flush deduction; with the deduction
// as it is (outcomes beyond n) and the session's other key changes, two
// runs gave 20,489 and 20,988.
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
// finished their rows wait for the next one: the godurable peers driver
// alone, 500 keys K = 1 and 100 executors, made claims of about 100 rows,
// each 8–18 ms, with the executors idle most of it, and almost never
// passed a row over. A bigger claim costs less per row, in its round trips and its
// commit. But rows passed over are keys the claim could not admit (K = 1
// keys that this engine's own rows hold, a gate's last slots): asking for
// more would only read more of them, and wait for a flush to wake the next
// claim. make bench's scenario 2 (500 keys, 200 executors) passed rows
// over in most claims even with the cap at n, often hundreds, and ran
// about a tenth slower with a cap that grew on every clean claim.
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

func newScheduler(e *Runtime) *Scheduler {
	s := &Scheduler{e: e, queues: map[string]*queueRunner{}, inflight: map[string]*claimState{},
		beat: make(chan struct{}, 1), succ: map[store.ClaimRef]store.Claimed{}, moved: map[store.ClaimRef]store.ClaimRef{}, flushCh: make(chan flushItem, 1024), handCh: make(chan flushItem, 1024)}
	_, s.handOffs = e.st.(store.HandOffer)
	s.runCtx, s.hardStop = context.WithCancel(context.Background())
	s.bgCtx, s.bgStop = context.WithCancel(context.Background())
	for name, n := range e.cfg.Queues {
		s.queues[name] = newQueueRunner(name, n)
	}
	return s
}

// Wake wakes the pick loop of queue, if this engine works it: work may
// have become ready there.
func (s *Scheduler) Wake(queue string) {
	if q := s.queues[queue]; q != nil {
		q.wake()
	}
}

// notified handles a store notification.
func (s *Scheduler) notified(n store.Notification) {
	if n == (store.Notification{}) {
		// Listening (again): what was notified meanwhile may be lost.
		s.WakeAll()
		select {
		case s.beat <- struct{}{}:
		default: // one is due already
		}
		return
	}
	if n.Queue != "" {
		s.Wake(n.Queue)
	}
	if n.Canceled != "" {
		s.Canceled(n.Canceled)
	}
}

// Canceled stops the step of instance id, if this engine runs it: the
// instance was canceled (the cancel applies to whatever claim of it runs).
// A reservation queued in a chain, not started, is given back at once with
// the rest of its chain (the store then cancels it): it never starts, and
// the Cancel that waits for it (see durable.Engine.Cancel) returns.
func (s *Scheduler) Canceled(id string) {
	s.mu.Lock()
	var back []store.ClaimRef
	if st := s.inflight[id]; st != nil {
		st.canceled = true
		st.stop()
		back = s.unqueue(st.ref)
	}
	s.mu.Unlock()
	if len(back) > 0 {
		go s.release(back) // a notification's handler must not block
	}
}

// unqueue takes reservation ref, if it is queued in a chain and not
// started, out of its chain with the reservations after it, and returns
// them (s.mu held): the slot's step before it frees its slot instead.
func (s *Scheduler) unqueue(ref store.ClaimRef) []store.ClaimRef {
	for pred, c := range s.succ {
		if c.ID == ref.ID && c.Fence == ref.Fence {
			return s.popChain(pred)
		}
	}
	return nil
}

// claiming reports whether every pick loop will claim again without being
// woken: each waits for room, which a flush's end wakes it for
// (roomFreed), or its last claim took all it asked for (full), so that it
// claims again once done, and whenever room frees. A flush then need not
// learn whether rows wait for the slots it frees (store.HandOff.Claiming):
// that would only spare a wake (quiet). It may be wrong the moment it is
// read, and then costs at most a claim that finds nothing.
func (s *Scheduler) claiming() bool {
	for _, q := range s.queues {
		if !q.starved.Load() && !q.full.Load() {
			return false
		}
	}
	return true
}

// WakeAll wakes every pick loop.
func (s *Scheduler) WakeAll() {
	for _, q := range s.queues {
		q.wake()
	}
}

// Listen starts listening to the store's notifications (store.Notifier),
// ahead of Start, while Start's store work runs. Start does not wait for
// it: opening a connection for it is on no step's path. Until it listens,
// a notification is not heard, so each time it starts listening (again)
// every pick loop claims and a heartbeat runs at once (see notified): work
// that became ready meanwhile is claimed, and a cancel of a step this
// engine runs, committed meanwhile, reaches the step (the heartbeat's
// answer names it). A scheduler that listens and is not started must be
// abandoned (Abandon). Listen does nothing the second time.
//
// Start used to wait for it (up to 500 ms) before the first claim. In the
// peers' gate of 5 with 50 ms steps, Start to the first step took 38-43 ms
// without the wait (and with the PostgreSQL store's Listen leaving the
// pool its last idle connection) against 42-47 with it (three interleaved
// pairs); most of what is left is PostgreSQL planning the claim's
// statements on a backend that has not run them yet.
func (s *Scheduler) Listen() {
	n, ok := s.e.st.(store.Notifier)
	if !ok || s.listening {
		return
	}
	s.listening = true
	s.bgWG.Add(1)
	go func() {
		defer s.bgWG.Done()
		err := n.Listen(s.bgCtx, s.notified)
		if err != nil && s.bgCtx.Err() == nil {
			s.e.log.Warn("notifications stopped; falling back to polling", "err", err)
		}
	}()
}

// Abandon stops listening, for a scheduler that listened (Listen) and
// will not be started.
func (s *Scheduler) Abandon() {
	s.bgStop()
	s.bgWG.Wait()
}

// Start starts the loops: notifications (unless Listen started them),
// pick loops, executors, flusher, heartbeat, lease watchdog, maintenance
// and schedules.
func (s *Scheduler) Start() {
	s.Listen()
	for _, q := range s.queues {
		for i := 0; i < q.n; i++ {
			s.execWG.Add(1)
			go s.executor(q)
		}
		s.pickWG.Add(1)
		go s.pickLoop(q)
	}
	s.flushWG.Add(1 + handFlushers)
	go s.flusher(s.flushCh, false)
	for range handFlushers {
		go s.flusher(s.handCh, true)
	}
	s.bgWG.Add(3)
	go s.heartbeatLoop()
	go s.leaseWatchdog()
	go s.maintenanceLoop()
	if s.e.cfg.Schedules {
		s.bgWG.Add(1)
		go s.scheduleLoop()
	}
}

// Stop drains the scheduler: no new claims; buffered claims are released;
// running steps get until ctx's deadline, then their contexts are cancelled.
func (s *Scheduler) Stop(ctx context.Context) error {
	s.stopping.Store(true)
	s.WakeAll()
	s.pickWG.Wait()
	s.workMu.Lock()
	s.workClosed = true
	for _, q := range s.queues {
		close(q.work)
	}
	s.workMu.Unlock()
	done := make(chan struct{})
	go func() { s.execWG.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("durable: stop: steps still running at the deadline were cancelled: %w", ctx.Err())
		s.hardStop()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			s.e.log.Error("steps ignored cancellation; their leases will expire and the reaper will retry them")
		}
	}
	close(s.flushCh)
	close(s.handCh)
	// The last outcomes are committed before Stop returns, unless the store
	// stays unreachable past the deadline: then the flush is abandoned (the
	// steps run again after their leases expire: at-least-once) rather than
	// Stop hanging for as long as the outage lasts.
	flushed := make(chan struct{})
	go func() {
		s.flushWG.Wait()
		// Reservations made for steps that will not run here.
		s.mu.Lock()
		var left []store.ClaimRef
		for ref, c := range s.succ {
			left = append(left, store.ClaimRef{ID: c.ID, Fence: c.Fence})
			delete(s.succ, ref)
		}
		s.mu.Unlock()
		s.release(left)
		close(flushed)
	}()
	select {
	case <-flushed:
	case <-ctx.Done():
		s.hardStop()
		<-flushed
		if err == nil {
			err = fmt.Errorf("durable: stop: outcomes not committed by the deadline; their steps will run again after their leases expire: %w", ctx.Err())
		}
	}
	s.bgStop()
	s.bgWG.Wait()
	s.hardStop()
	return err
}

// storeOutage is the engine's view of whether its store is reachable,
// shared by every loop (claims, flushes, heartbeats, sweeps): the first
// failure of an outage is logged once, at error level, and the recovery once,
// at info level, with how long the outage lasted and how many calls failed
// meanwhile. A store that stays down for an hour logs two lines, not one per
// attempt. The recovery is declared at the first success that comes
// outageSettle after the last failure, so that a pool still handing out a
// few dead connections after a database restart does not log a second
// outage. Each loop retries on its own backoff (see retrier).
type storeOutage struct {
	log    *slog.Logger
	isDown atomic.Bool // fast path for ok()

	mu       sync.Mutex
	since    time.Time
	lastFail time.Time
	failed   int
}

// outageSettle is how long the store must answer without a failure before
// an outage is declared over.
const outageSettle = time.Second

// fail records a failed store call of loop. A conflict between
// transactions (SQL class 40: a deadlock or serialization failure) is not an
// outage: it is logged as a warning, and the call is retried all the same.
func (o *storeOutage) fail(loop string, err error) {
	var se interface{ SQLState() string }
	if errors.As(err, &se) && strings.HasPrefix(se.SQLState(), "40") {
		o.log.Warn("store conflict; retrying", "loop", loop, "err", err)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failed++
	o.lastFail = time.Now()
	if o.isDown.Load() {
		return
	}
	o.isDown.Store(true)
	o.since = o.lastFail
	o.log.Error("store unavailable; retrying with backoff until it is back", "loop", loop, "err", err)
}

// ok records a successful store call.
func (o *storeOutage) ok() {
	if !o.isDown.Load() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.isDown.Load() || time.Since(o.lastFail) < outageSettle {
		return
	}
	o.isDown.Store(false)
	o.log.Info("store available again", "down_for", o.lastFail.Sub(o.since).Round(time.Millisecond).String(), "failed_calls", o.failed)
	o.failed = 0
}

// retrier is one loop's exponential backoff (cenkalti/backoff) over the
// engine's shared outage state.
type retrier struct {
	o    *storeOutage
	loop string
	b    *backoff.ExponentialBackOff
}

func newRetrier(o *storeOutage, loop string) *retrier {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 50*time.Millisecond, 5*time.Second, 0
	return &retrier{o: o, loop: loop, b: b}
}

// fail records an error and returns how long to wait before trying again.
func (r *retrier) fail(err error) time.Duration {
	r.o.fail(r.loop, err)
	return r.b.NextBackOff()
}

func (r *retrier) ok() {
	r.o.ok()
	r.b.Reset()
}

func (s *Scheduler) pickLoop(q *queueRunner) {
	defer s.pickWG.Done()
	e := s.e
	out := newRetrier(e.outage, "claim "+q.name)
	workflows := e.workflowNames()
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

// begin marks claim c started, unless it is lost, canceled or the engine
// is stopping: then it gives it back (or forgets it, lost), with any
// reservation made for it, and frees its executor slot.
func (s *Scheduler) begin(c store.Claimed, toRelease *[]store.ClaimRef) *running {
	q := s.queues[c.Queue]
	ref := store.ClaimRef{ID: c.ID, Fence: c.Fence}
	s.mu.Lock()
	st := s.inflight[c.ID]
	lost := st == nil || st.lost || st.ref != ref
	canceled := !lost && st.canceled
	stopping := s.stopping.Load()
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
// the engine stopping, pred lost) is released instead.
func (s *Scheduler) takeSuccessor(pred *claimState, toRelease *[]store.ClaimRef) *running {
	s.mu.Lock()
	id := pred.ref
	c, ok := s.succ[id]
	ref := store.ClaimRef{ID: c.ID, Fence: c.Fence}
	var r *running
	var refused []store.ClaimRef
	if st := s.inflight[c.ID]; ok && st != nil && st.ref == ref && !st.lost && !st.canceled &&
		!s.stopping.Load() && !pred.lost {
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

// popChain removes the reservations queued after id from succ and returns
// them (s.mu held).
func (s *Scheduler) popChain(id store.ClaimRef) []store.ClaimRef {
	var refs []store.ClaimRef
	for c, ok := s.succ[id]; ok; c, ok = s.succ[id] {
		delete(s.succ, id)
		id = store.ClaimRef{ID: c.ID, Fence: c.Fence}
		refs = append(refs, id)
	}
	return refs
}

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
// behind it. Two of them in flight gave a hot gate no more (make bench
// scenario 3, -n 3: 2,650-2,940 steps/s against 2,810-2,850) and cost 500
// K = 1 keys a fifth (9,500-10,500 against 12,300-12,500): they halve the
// batches, and each batch reads its keys' state once.
const handFlushers = 1

// flusher group-commits the outcomes of ch; withSlots says that their
// executor slots come with them (handCh).
func (s *Scheduler) flusher(ch chan flushItem, withSlots bool) {
	defer s.flushWG.Done()
	e := s.e
	out := newRetrier(e.outage, "flush")
	max := e.cfg.MaxFlushBatch
	// items is the batch, its array kept from flush to flush: grown from
	// one item by append each time, the batches of the peers' keyed run
	// (about 90 outcomes of 368 bytes) made a tenth of the engine's
	// allocations, and the collector ran as often. It is cleared after
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
		ho = &store.HandOff{Room: map[string]int{}, Workflows: e.workflowNames(), Lease: e.cfg.Lease}
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
	// are kept in an array on the stack and searched, where a map made
	// per call was 14 % of the bytes the engine allocated in the peers'
	// hot gate (it runs for every outcome of a flush of contended claims).
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

// commitHooks are what a caller of commitOutcomes does with its results.
type commitHooks struct {
	// handOff, when set, lets the store hand the freed slots to waiting
	// rows (see store.HandOffer): its Room is the executor slots this
	// caller holds, and commitOutcomes takes the rows handed off out of it.
	handOff *store.HandOff
	// handed receives the rows handed off, with the time until which their
	// leases are sure to hold by this engine's clock.
	handed func(cs []store.Claimed, validUntil time.Time)
	// committed receives each part of the batch the store committed, in
	// batch order, with its results.
	committed func(batch []store.Outcome, res []store.OutcomeResult)
	// abandoned receives an outcome the store refused even as a bare
	// failure: its claim is left to the reaper.
	abandoned func(o store.Outcome)
	// unreachable decides about any other error: true to try again (after
	// waiting as it sees fit), false to give up (commitOutcomes returns it).
	unreachable func(err error) bool
}

// commitOutcomes commits a batch of outcomes. A batch the store refuses for
// its data (see rejected) is split until the refused outcome is alone; that
// outcome then fails its instance with the store's reason, so that one bad
// value never holds back the outcomes of other instances. The live
// scheduler and Tick both commit through it.
func (e *Runtime) commitOutcomes(ctx context.Context, batch []store.Outcome, h commitHooks) error {
	retried := false // sent again after an error that left its commit unknown
	firstSent := time.Now()
	for {
		res, err := e.complete(ctx, batch, h)
		switch {
		case err == nil:
			if retried {
				e.passedEarlier(ctx, batch, e.landedEarlier(ctx, batch, res), firstSent, h)
			}
			h.committed(batch, res)
			return nil
		case rejected(err) && len(batch) > 1:
			mid := len(batch) / 2
			if err := e.commitOutcomes(ctx, batch[:mid], h); err != nil {
				return err
			}
			return e.commitOutcomes(ctx, batch[mid:], h)
		case rejected(err):
			o := batch[0]
			if o.Kind == store.OutcomeFailed && o.State == nil && o.Result == nil && len(o.Children) == 0 && !o.SetKey &&
				o.History == nil {
				// Even the bare failure was refused: give the claim up to the reaper.
				e.log.Error("outcome refused by the store; its lease will expire and the step will run again",
					"instance", o.ID, "err", err)
				h.abandoned(o)
				return nil
			}
			e.log.Error("outcome refused by the store; the instance fails with the reason", "instance", o.ID, "err", err)
			batch = []store.Outcome{e.refusedOutcome(o, err)}
		case !h.unreachable(err):
			return err
		default:
			retried = true
		}
	}
}

// landedEarlier looks, for each outcome of a batch sent again after an
// error that the store reports stale, for a sign that the earlier attempt
// committed it (its COMMIT reached the server, the answer did not: the
// server went down, the connection broke): its run in the instance's step
// history, or else, as the store keeps no history by default, the row as
// that outcome leaves it (see appliedBy). Found, the outcome is not stale
// (its claim was not reaped or cancelled) and is neither logged nor
// counted as such. An outcome whose signs cannot be read stays stale. It
// returns the outcomes found so, by their index in batch.
func (e *Runtime) landedEarlier(ctx context.Context, batch []store.Outcome, res []store.OutcomeResult) []int {
	var landed []int
	for i, r := range res {
		if !r.Stale {
			continue
		}
		if inHistory(ctx, e.st, batch[i]) {
			res[i].Stale = false
		} else if inst, err := e.st.Get(ctx, r.ID); err == nil && appliedBy(inst, batch[i]) {
			res[i].Stale = false
		} else {
			continue
		}
		e.log.Info("outcome committed before its flush failed: the retry found it applied", "instance", r.ID)
		landed = append(landed, i)
	}
	return landed
}

// passedEarlier hands on (h.handed) the successors to which the outcomes
// landed, committed by an earlier attempt of their flush (see
// landedEarlier), passed their slots: rows that this worker now holds,
// executing under the successor's fence. Without it, the flush that found
// those outcomes applied would take each successor for refused: a running
// one would be stopped, and its row, executing with nobody running it,
// would wait for its lease to end. Their leases began in that earlier
// commit, so they hold at least until the first attempt's send (sent) plus
// the lease. What else that commit handed this engine (hand-offs to rows
// no outcome named, reservations) never reached it: those rows wait for
// the reaper, the safe direction.
func (e *Runtime) passedEarlier(ctx context.Context, batch []store.Outcome, landed []int, sent time.Time, h commitHooks) {
	if h.handOff == nil || h.handed == nil {
		return
	}
	var passed []store.Claimed
	for _, i := range landed {
		next := batch[i].Successor
		if next.ID == "" {
			continue
		}
		inst, err := e.st.Get(ctx, next.ID)
		if err != nil || inst.Status != store.StatusExecuting || inst.Worker != e.cfg.WorkerID || inst.Fence != next.Fence {
			continue
		}
		passed = append(passed, store.Claimed{Instance: inst})
	}
	if len(passed) > 0 {
		h.handed(passed, sent.Add(e.cfg.Lease))
	}
}

// inHistory reports whether o's run is in its instance's step history.
func inHistory(ctx context.Context, st store.Store, o store.Outcome) bool {
	h := o.History
	if h == nil {
		return false
	}
	hist, err := st.History(ctx, o.ID)
	if err != nil {
		return false
	}
	for _, x := range hist {
		if d := x.StartedAt.Sub(h.StartedAt); x.Worker == h.Worker && x.Step == h.Step && x.Attempt == h.Attempt &&
			d > -time.Microsecond && d < time.Microsecond {
			return true
		}
	}
	return false
}

// appliedBy reports whether inst is as outcome o leaves it: no longer
// claimed, still carrying o's fence (only a claim changes it), at o's
// attempt and step, and, for an outcome that ends the instance, in its
// status. A claim taken back instead (reaped, reclaimed, released) keeps
// its step and status ready, at the same attempt or one more: it can pass
// only for an outcome that would have left the row the same way (a retry
// of the same step, due at once), where the difference is moot.
func appliedBy(inst store.Instance, o store.Outcome) bool {
	if inst.Worker != "" || inst.Fence != o.Fence || inst.Attempt != o.Attempt || (o.Step != "" && inst.Step != o.Step) {
		return false
	}
	switch o.Kind {
	case store.OutcomeDone:
		return inst.Status == store.StatusDone
	case store.OutcomeFailed:
		return inst.Status == store.StatusFailed
	}
	return inst.Status != store.StatusExecuting
}

// complete is one Complete of a batch, through the store's hand-off when
// h asks for one.
func (e *Runtime) complete(ctx context.Context, batch []store.Outcome, h commitHooks) ([]store.OutcomeResult, error) {
	ho, ok := e.st.(store.HandOffer)
	if !ok || h.handOff == nil {
		return e.st.Complete(ctx, e.cfg.WorkerID, batch, e.storeNow())
	}
	sent := time.Now()
	res, claimed, err := ho.CompleteHandOff(ctx, e.cfg.WorkerID, batch, e.storeNow(), *h.handOff)
	if err != nil || len(claimed) == 0 {
		return res, err
	}
	succ := map[store.ClaimRef]bool{} // named successors: their room is counted by the caller
	for _, o := range batch {
		succ[o.Successor] = true
	}
	for _, c := range claimed {
		if c.After == "" && !succ[refOf(c)] {
			h.handOff.Room[c.Queue]-- // a part of a split batch leaves less room to the next
		}
	}
	h.handed(claimed, sent.Add(e.cfg.Lease))
	return res, nil
}

// countStale counts and logs the outcomes the store discarded as stale.
func (e *Runtime) countStale(res []store.OutcomeResult) int {
	n := 0
	for _, r := range res {
		if r.Stale {
			n++
			e.staleOutcomes.Add(1)
			e.tel.stale.Add(context.Background(), 1)
			e.log.Warn("stale outcome discarded: the claim was reaped or cancelled", "instance", r.ID)
		}
	}
	return n
}

// rejected reports whether err says the store refused the data of a request
// (retrying it unchanged cannot succeed) rather than being unreachable:
// store.ErrInvalid, or an SQL error of class 22 (data exception) or 23
// (integrity constraint violation).
func rejected(err error) bool {
	if errors.Is(err, store.ErrInvalid) {
		return true
	}
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		c := se.SQLState()
		return strings.HasPrefix(c, "22") || strings.HasPrefix(c, "23")
	}
	return false
}

// refusedOutcome replaces an outcome the store refused by a bare failure of
// the instance (state, key and inbox left as they were).
func (e *Runtime) refusedOutcome(o store.Outcome, err error) store.Outcome {
	msg := CleanText("the store refused this step's outcome: "+err.Error(), e.cfg.MaxErrorLength)
	// The successor keeps its slot: it may be running in it already.
	f := store.Outcome{ID: o.ID, Fence: o.Fence, Kind: store.OutcomeFailed, Step: o.Step, Error: msg,
		Contended: o.Contended, Successor: o.Successor}
	if o.History != nil {
		h := *o.History
		h.Outcome, h.Error = "refused", msg
		f.History, f.Attempt = &h, h.Attempt
	}
	return f
}

func (s *Scheduler) heartbeatLoop() {
	defer s.bgWG.Done()
	e := s.e
	out := newRetrier(e.outage, "heartbeat")
	tick := time.NewTicker(e.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-s.bgCtx.Done():
			return
		case <-tick.C:
		case <-s.beat:
		}
		s.mu.Lock()
		refs := make([]store.ClaimRef, 0, len(s.inflight))
		for _, st := range s.inflight {
			if !st.lost {
				refs = append(refs, st.ref)
			}
		}
		s.mu.Unlock()
		if len(refs) == 0 {
			continue
		}
		sort.Slice(refs, func(i, j int) bool { return refs[i].ID < refs[j].ID })
		sent := time.Now()
		res, err := e.st.Heartbeat(s.bgCtx, e.cfg.WorkerID, refs, e.cfg.Lease, e.storeNow())
		if err != nil {
			if s.bgCtx.Err() == nil {
				out.fail(err) // the ticker paces the next attempt
			}
			continue
		}
		out.ok()
		s.renewed(refs, res, sent.Add(e.cfg.Lease))
	}
}

// renewed applies a heartbeat's answer. Claims are matched by id and fence:
// this engine may have committed a claim and claimed the same instance
// again while the heartbeat was in flight, and the answer about the old
// claim says nothing about the new one.
func (s *Scheduler) renewed(refs []store.ClaimRef, res store.HeartbeatResult, validUntil time.Time) {
	gone := make(map[store.ClaimRef]bool, len(res.Lost))
	for _, r := range res.Lost {
		gone[r] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range refs {
		st := s.inflight[r.ID]
		if st == nil || st.ref != r {
			continue
		}
		if gone[r] {
			st.lost = true
			st.stop()
		} else if validUntil.After(st.validUntil) {
			st.validUntil = validUntil
		}
	}
	var back []store.ClaimRef
	for _, r := range res.Canceled {
		if st := s.inflight[r.ID]; st != nil && st.ref == r {
			st.canceled = true
			st.stop()
			back = append(back, s.unqueue(r)...)
		}
	}
	if len(back) > 0 {
		go s.release(back)
	}
}

// leaseWatchdog gives up the claims whose lease this engine cannot be sure
// still holds: the store has not answered a heartbeat for them for about
// a lease (it is unreachable, or too slow). Their steps are cancelled a
// margin before the lease ends by this engine's clock, so that a step no
// longer runs when the reaper of another engine may hand its row on. Their
// outcomes are still sent: the store commits them if the claim is still
// current, and discards them as stale otherwise.
func (s *Scheduler) leaseWatchdog() {
	defer s.bgWG.Done()
	e := s.e
	margin := leaseMargin(e.cfg.Lease)
	tick := time.NewTicker(margin)
	defer tick.Stop()
	for {
		select {
		case <-s.bgCtx.Done():
			return
		case <-tick.C:
		}
		deadline := time.Now().Add(2 * margin)
		n := 0
		s.mu.Lock()
		for _, st := range s.inflight {
			if st.lost {
				continue
			}
			// A successor running in its predecessor's slot holds it by
			// the leases of the claims before it as much as by its own.
			expired := deadline.After(st.validUntil)
			for p := st.pred; p != nil && !expired; p = p.pred {
				expired = p.lost || deadline.After(p.validUntil)
			}
			if expired {
				st.lost = true
				st.stop()
				n++
			}
		}
		s.mu.Unlock()
		if n > 0 {
			e.log.Error("leases could not be renewed in time; their steps were cancelled and will run again elsewhere", "n", n)
		}
	}
}

// leaseMargin is how often the watchdog looks, and half of how long
// before a lease ends by this engine's clock it gives a claim up.
func leaseMargin(lease time.Duration) time.Duration {
	return max(lease/20, 5*time.Millisecond)
}

func (s *Scheduler) maintenanceLoop() {
	defer s.bgWG.Done()
	e := s.e
	reap := time.NewTicker(e.cfg.ReaperInterval)
	defer reap.Stop()
	reconcile := time.NewTicker(e.cfg.ReconcileInterval)
	defer reconcile.Stop()
	for {
		select {
		case <-s.bgCtx.Done():
			return
		case <-reap.C:
			s.sweep()
		case <-reconcile.C:
			s.reconcile()
		}
	}
}

// sweep fires due await timeouts and reaps expired leases; each fails on
// its own (a failing timer sweep does not keep expired leases from being
// reaped).
func (s *Scheduler) sweep() {
	e := s.e
	fired, ferr := e.st.FireTimers(s.bgCtx, e.storeNow())
	if ferr != nil && s.bgCtx.Err() == nil {
		e.outage.fail("fire timers", ferr)
	}
	reaped, rerr := e.st.Reap(s.bgCtx, e.storeNow())
	if rerr != nil && s.bgCtx.Err() == nil {
		e.outage.fail("reap", rerr)
	}
	if ferr != nil || rerr != nil {
		return
	}
	e.outage.ok()
	if reaped > 0 {
		e.tel.reaped.Add(context.Background(), int64(reaped))
		e.log.Warn("reaped expired leases", "n", reaped)
	}
	if fired+reaped > 0 {
		s.WakeAll()
	}
}

// maintenanceLeaseTTL is three sweep intervals, and at least a second, so
// that a slow sweep never lets the lease lapse under its holder.
func maintenanceLeaseTTL(interval time.Duration) time.Duration {
	return max(3*interval, time.Second)
}

// reconcile runs the fleet's reconciler and retention sweep when this
// engine holds the maintenance lease: one engine of the fleet at a time
// sweeps, renewing the lease at each sweep; when it dies, another takes
// over once the lease has expired (see maintenanceLeaseTTL).
func (s *Scheduler) reconcile() {
	e := s.e
	held, err := e.st.AcquireLease(s.bgCtx, store.MaintenanceLease, e.cfg.WorkerID, maintenanceLeaseTTL(e.cfg.ReconcileInterval), e.storeNow())
	if err != nil {
		if s.bgCtx.Err() == nil {
			e.outage.fail("reconcile", err)
		}
		return
	}
	if !held {
		e.outage.ok()
		return
	}
	if _, err := e.reconcile(s.bgCtx); err != nil {
		if s.bgCtx.Err() == nil && !errors.Is(err, context.Canceled) {
			e.outage.fail("reconcile", err)
		}
		return
	}
	e.outage.ok()
}

// scheduleLoop fires the engine's due schedule ticks. It wakes at the next
// tick, and at least every 10 poll intervals to see pauses, resumes and
// ticks other engines recorded.
func (s *Scheduler) scheduleLoop() {
	defer s.bgWG.Done()
	e := s.e
	longest := 10 * e.cfg.PollInterval
	for {
		r := e.fireSchedules(s.bgCtx)
		if s.bgCtx.Err() != nil {
			return
		}
		if r.StoreErr != nil {
			e.outage.fail("schedules", r.StoreErr)
		} else {
			e.outage.ok()
		}
		if r.Errs != nil {
			e.log.Error("schedules: due ticks could not fire; retrying", "err", r.Errs)
		}
		wait := longest
		switch {
		case r.StoreErr != nil:
			wait = e.cfg.PollInterval
		case !r.Next.IsZero():
			wait = min(max(r.Next.Sub(e.cfg.Clock.Now()), time.Millisecond), longest)
		}
		t := time.NewTimer(wait)
		select {
		case <-s.bgCtx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
