package durable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
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
//	flusher (one per engine) ◀─────────────────────────────────────────┘
//	   group-commits every outcome that arrived while the previous flush was in flight,
//	   then wakes the pick loops (a freed slot may admit blocked work).
//	heartbeat loop: extends the leases of every claim not yet committed; a lost
//	   claim's step context is cancelled and its outcome will be stale.
//	maintenance loop: fires due await timeouts, reaps expired leases, reconciles counters.
//
// Claims are sized to free executor slots, so a claimed row never waits long
// in the buffer; buffered rows hold their slots (they are claimed), and are
// released, not run, once Stop begins.

type scheduler struct {
	e        *Engine
	runCtx   context.Context // cancelled when Stop's deadline passes
	hardStop context.CancelFunc
	bgCtx    context.Context // cancelled when the loops must exit
	bgStop   context.CancelFunc
	stopping atomic.Bool

	queues  map[string]*queueRunner
	flushCh chan store.Outcome

	mu       sync.Mutex
	inflight map[string]*claimState

	execWG  sync.WaitGroup
	pickWG  sync.WaitGroup
	flushWG sync.WaitGroup
	bgWG    sync.WaitGroup
}

type claimState struct {
	ref    store.ClaimRef
	cancel context.CancelFunc
	lost   bool
}

type queueRunner struct {
	name   string
	n      int
	wakeCh chan struct{}
	work   chan store.Claimed
	busy   atomic.Int64 // claimed and not yet finished executing
}

func (q *queueRunner) wake() {
	select {
	case q.wakeCh <- struct{}{}:
	default:
	}
}

func newScheduler(e *Engine) *scheduler {
	s := &scheduler{e: e, queues: map[string]*queueRunner{}, inflight: map[string]*claimState{},
		flushCh: make(chan store.Outcome, 1024)}
	s.runCtx, s.hardStop = context.WithCancel(context.Background())
	s.bgCtx, s.bgStop = context.WithCancel(context.Background())
	for name, n := range e.cfg.Queues {
		s.queues[name] = &queueRunner{name: name, n: n, wakeCh: make(chan struct{}, 1), work: make(chan store.Claimed, n)}
	}
	return s
}

func (s *scheduler) wake(queue string) {
	if q := s.queues[queue]; q != nil {
		q.wake()
	}
}

func (s *scheduler) wakeAll() {
	for _, q := range s.queues {
		q.wake()
	}
}

func (s *scheduler) start() {
	for _, q := range s.queues {
		for i := 0; i < q.n; i++ {
			s.execWG.Add(1)
			go s.executor(q)
		}
		s.pickWG.Add(1)
		go s.pickLoop(q)
	}
	s.flushWG.Add(1)
	go s.flusher()
	s.bgWG.Add(2)
	go s.heartbeatLoop()
	go s.maintenanceLoop()
	if n, ok := s.e.st.(store.Notifier); ok {
		s.bgWG.Add(1)
		go func() {
			defer s.bgWG.Done()
			err := n.Listen(s.bgCtx, s.wake)
			if err != nil && s.bgCtx.Err() == nil {
				s.e.log.Warn("notifications stopped; falling back to polling", "err", err)
			}
		}()
	}
}

// stop drains the scheduler: no new claims; buffered claims are released;
// running steps get until ctx's deadline, then their contexts are cancelled.
func (s *scheduler) stop(ctx context.Context) error {
	s.stopping.Store(true)
	s.wakeAll()
	s.pickWG.Wait()
	for _, q := range s.queues {
		close(q.work)
	}
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
	s.flushWG.Wait()
	s.bgStop()
	s.bgWG.Wait()
	s.hardStop()
	return err
}

// outage logs a failing loop once per outage, not once per attempt.
type outage struct {
	log  *slog.Logger
	what string
	down bool
	b    *backoff.ExponentialBackOff
}

func newOutage(log *slog.Logger, what string) *outage {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 50*time.Millisecond, 5*time.Second, 0
	return &outage{log: log, what: what, b: b}
}

// fail records an error and returns how long to wait before trying again.
func (o *outage) fail(err error) time.Duration {
	if !o.down {
		o.down = true
		o.log.Error("store unavailable; retrying with backoff", "loop", o.what, "err", err)
	}
	return o.b.NextBackOff()
}

func (o *outage) ok() {
	if o.down {
		o.down = false
		o.log.Info("store available again", "loop", o.what)
	}
	o.b.Reset()
}

func (s *scheduler) pickLoop(q *queueRunner) {
	defer s.pickWG.Done()
	e := s.e
	out := newOutage(e.log, "claim "+q.name)
	workflows := e.workflowNames()
	var nextDue time.Time
	for !s.stopping.Load() {
		wait := e.cfg.PollInterval
		if free := q.n - int(q.busy.Load()); free > 0 {
			if !nextDue.IsZero() && !e.cfg.Clock.Now().Before(nextDue) {
				if _, err := e.st.FireTimers(s.bgCtx, e.storeNow()); err != nil && s.bgCtx.Err() == nil {
					e.log.Warn("fire timers", "err", err)
				}
			}
			res, err := e.st.Claim(s.bgCtx, store.ClaimRequest{Queue: q.name, Worker: e.cfg.WorkerID, Limit: free,
				Lease: e.cfg.Lease, Now: e.storeNow(), Workflows: workflows})
			if err != nil {
				if s.bgCtx.Err() != nil {
					return
				}
				wait = out.fail(err)
			} else {
				out.ok()
				for _, c := range res.Claimed {
					s.track(c)
					q.busy.Add(1)
					q.work <- c
				}
				if len(res.Claimed) == free {
					continue // there may be more ready work
				}
				nextDue = res.NextDue
				if !nextDue.IsZero() {
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

func (s *scheduler) track(c store.Claimed) {
	s.mu.Lock()
	s.inflight[c.ID] = &claimState{ref: store.ClaimRef{ID: c.ID, Fence: c.Fence}}
	s.mu.Unlock()
}

func (s *scheduler) untrack(id string, fence int64) {
	s.mu.Lock()
	if st := s.inflight[id]; st != nil && st.ref.Fence == fence {
		delete(s.inflight, id)
	}
	s.mu.Unlock()
}

func (s *scheduler) executor(q *queueRunner) {
	defer s.execWG.Done()
	var toRelease []store.ClaimRef
	for c := range q.work {
		s.mu.Lock()
		st := s.inflight[c.ID]
		lost := st == nil || st.lost
		ctx, cancel := context.WithCancel(s.runCtx)
		if st != nil {
			st.cancel = cancel
		}
		s.mu.Unlock()
		switch {
		case lost:
			cancel()
			s.untrack(c.ID, c.Fence)
		case s.stopping.Load():
			cancel()
			toRelease = append(toRelease, store.ClaimRef{ID: c.ID, Fence: c.Fence})
		default:
			out := s.e.execute(ctx, c)
			hard := s.runCtx.Err() != nil
			cancel()
			if hard {
				// Cut short by the stop deadline: not the step's fault, so the
				// claim goes back with its attempt unchanged.
				toRelease = append(toRelease, store.ClaimRef{ID: c.ID, Fence: c.Fence})
			} else {
				s.flushCh <- out
			}
		}
		q.busy.Add(-1)
		q.wake()
	}
	if len(toRelease) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.e.st.Release(ctx, s.e.cfg.WorkerID, toRelease, s.e.storeNow()); err != nil {
			s.e.log.Warn("release buffered claims; the reaper will take them back", "n", len(toRelease), "err", err)
		}
		cancel()
		for _, r := range toRelease {
			s.untrack(r.ID, r.Fence)
		}
	}
}

func (s *scheduler) flusher() {
	defer s.flushWG.Done()
	e := s.e
	out := newOutage(e.log, "flush")
	max := e.cfg.MaxFlushBatch
	for first := range s.flushCh {
		batch := []store.Outcome{first}
	drain:
		for len(batch) < max {
			select {
			case o, ok := <-s.flushCh:
				if !ok {
					break drain
				}
				batch = append(batch, o)
			default:
				break drain
			}
		}
		s.commit(batch, out)
	}
}

// commit flushes one batch, retrying with backoff while the store is down,
// until the stop deadline passes (then the leases expire and the reaper
// retries the steps: at-least-once).
func (s *scheduler) commit(batch []store.Outcome, out *outage) {
	e := s.e
	for {
		res, err := e.st.Complete(s.runCtx, e.cfg.WorkerID, batch, e.storeNow())
		if err == nil {
			out.ok()
			for i, r := range res {
				if r.Stale {
					e.staleOutcomes.Add(1)
					e.tel.stale.Add(context.Background(), 1)
					e.log.Warn("stale outcome discarded: the claim was reaped or cancelled", "instance", r.ID)
				}
				s.untrack(batch[i].ID, batch[i].Fence)
			}
			e.notifyFlushed()
			s.wakeAll()
			return
		}
		if s.runCtx.Err() != nil {
			e.log.Error("outcomes not committed before stop; the reaper will retry their steps", "n", len(batch), "err", err)
			return
		}
		t := time.NewTimer(out.fail(err))
		select {
		case <-t.C:
		case <-s.runCtx.Done():
		}
		t.Stop()
	}
}

func (s *scheduler) heartbeatLoop() {
	defer s.bgWG.Done()
	e := s.e
	out := newOutage(e.log, "heartbeat")
	tick := time.NewTicker(e.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-s.bgCtx.Done():
			return
		case <-tick.C:
		}
		s.mu.Lock()
		refs := make([]store.ClaimRef, 0, len(s.inflight))
		for _, st := range s.inflight {
			refs = append(refs, st.ref)
		}
		s.mu.Unlock()
		if len(refs) == 0 {
			continue
		}
		sort.Slice(refs, func(i, j int) bool { return refs[i].ID < refs[j].ID })
		lost, err := e.st.Heartbeat(s.bgCtx, e.cfg.WorkerID, refs, e.cfg.Lease, e.storeNow())
		if err != nil {
			if s.bgCtx.Err() == nil {
				out.fail(err)
			}
			continue
		}
		out.ok()
		s.mu.Lock()
		for _, id := range lost {
			if st := s.inflight[id]; st != nil {
				st.lost = true
				if st.cancel != nil {
					st.cancel()
				}
			}
		}
		s.mu.Unlock()
	}
}

func (s *scheduler) maintenanceLoop() {
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

// sweep fires due await timeouts and reaps expired leases.
func (s *scheduler) sweep() {
	e := s.e
	fired, err := e.st.FireTimers(s.bgCtx, e.storeNow())
	if err != nil {
		if s.bgCtx.Err() == nil {
			e.log.Warn("fire timers", "err", err)
		}
		return
	}
	reaped, err := e.st.Reap(s.bgCtx, e.storeNow())
	if err != nil {
		if s.bgCtx.Err() == nil {
			e.log.Warn("reap", "err", err)
		}
		return
	}
	if reaped > 0 {
		e.tel.reaped.Add(context.Background(), int64(reaped))
		e.log.Warn("reaped expired leases", "n", reaped)
	}
	if fired+reaped > 0 {
		s.wakeAll()
	}
}

func (s *scheduler) reconcile() {
	if _, err := s.e.reconcile(s.bgCtx); err != nil && s.bgCtx.Err() == nil && !errors.Is(err, context.Canceled) {
		s.e.log.Warn("reconcile", "err", err)
	}
}
