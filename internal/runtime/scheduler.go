package runtime

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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
	// beat asks the heartbeat loop for a heartbeat at once (see notified).
	beat chan struct{}
	// heard is set once the store has listened (see notified).
	heard atomic.Bool

	// handOffs: the store hands slots off (store.HandOffer), so claims ask
	// it for successors too (see took).
	handOffs bool

	// claims are the engine's claims and reservations (see claims).
	claims
	// flushNanos is a moving average of how long a flush of contended
	// outcomes takes (see depth).
	flushNanos atomic.Int64

	execWG  sync.WaitGroup
	pickWG  sync.WaitGroup
	flushWG sync.WaitGroup
	bgWG    sync.WaitGroup
}

func newScheduler(e *Runtime) *Scheduler {
	s := &Scheduler{e: e, queues: map[string]*queueRunner{}, claims: newClaims(),
		beat: make(chan struct{}, 1), flushCh: make(chan flushItem, 1024), handCh: make(chan flushItem, 1024)}
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
		first := !s.heard.Swap(true)
		if c, ok := s.e.st.(store.ClaimChecker); ok && first {
			// The engine's claims are as fresh as its start: they need
			// a check for cancels, not a renewal.
			s.bgWG.Add(1) // the listener's own goroutine is counted: Stop's Wait has not begun
			go s.checkClaims(c)
			return
		}
		// Listening again after a lost connection: the store may have
		// been unreachable, and the claims unrenewed, for a while.
		s.heartbeatNow()
		return
	}
	if n.Queue != "" {
		s.Wake(n.Queue)
	}
	if n.Canceled != "" {
		s.Canceled(n.Canceled)
	}
}

// heartbeatNow asks the heartbeat loop for a heartbeat at once.
func (s *Scheduler) heartbeatNow() {
	select {
	case s.beat <- struct{}{}:
	default: // one is due already
	}
}

// checkClaims asks the store which of the engine's claims it still holds
// and which were canceled, as a heartbeat would, for the cancels committed
// before the store listened. It renews no lease, so a claim's lease stays
// as the engine knows it; if the check fails, a heartbeat runs at once
// instead.
func (s *Scheduler) checkClaims(c store.ClaimChecker) {
	defer s.bgWG.Done()
	refs := s.held()
	if len(refs) == 0 {
		return
	}
	res, err := c.CheckClaims(s.bgCtx, s.e.cfg.WorkerID, refs)
	if err != nil {
		if s.bgCtx.Err() == nil {
			s.heartbeatNow()
		}
		return
	}
	s.renewed(refs, res, time.Time{}) // the zero time extends no lease
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
// every pick loop claims and the engine's claims are checked at once (see
// notified): work that became ready meanwhile is claimed, and a cancel of
// a step this engine runs, committed meanwhile, reaches the step (the
// check's answer names it). The first time, a store.ClaimChecker checks
// them without renewing or locking their rows; after a lost connection,
// or with a store that cannot check, a heartbeat does, renewing them too.
// A scheduler that listens and is not started must be abandoned
// (Abandon). Listen does nothing the second time. Start does not wait for
// it: the first claim would wait for a connection's LISTEN, and the check
// at once covers what a late listener missed.
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
	go func() {
		defer s.bgWG.Done()
		(&maintainer{e: s.e, wake: s.WakeAll}).run(s.bgCtx)
	}()
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
