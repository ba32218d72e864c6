package enginetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

// The wall-clock tests check, with a Recorder outside the store, that a
// step body that is still running holds its key's slot whatever happens to
// its row: a cancel, a store that can no longer be reached, a heartbeat
// answer about an earlier claim of the same instance.

// holdState is the state of the holding workflow.
type holdState struct {
	Tag string `json:"tag"`
	// Hold is how long the step runs when its context stays alive.
	Hold time.Duration `json:"hold"`
}

// holder is a workflow whose "hold" step runs until its context is
// cancelled (or for the state's Hold when the context stays alive; a
// re-run for 10 ms), and
// then runs on for linger, like a step that cleans up after a cancel, all under the
// Recorder.
type holder struct {
	rec    *Recorder
	linger time.Duration

	mu       sync.Mutex
	started  map[string]time.Time // tag -> first body start
	observed map[string]time.Time // tag -> when the body saw its context end
	ended    map[string]time.Time // tag -> when the body returned
	runs     map[string]int
}

func newHolder(limits gate.Limits, linger time.Duration) *holder {
	return &holder{rec: NewRecorder(limits), linger: linger, started: map[string]time.Time{},
		observed: map[string]time.Time{}, ended: map[string]time.Time{}, runs: map[string]int{}}
}

func (h *holder) workflow() *durable.Workflow[holdState] {
	wf := durable.NewWorkflow[holdState]("hold", "hold", durable.WorkflowOptions{
		Retry: steps.RetryPolicy{MaxAttempts: 3, InitialInterval: 10 * time.Millisecond, MaxInterval: 10 * time.Millisecond, RandomizationFactor: -1},
	})
	wf.Step("hold", func(ctx steps.Context, s holdState) (transitions.Transition, error) {
		exit := h.rec.Enter(ctx.Key())
		hold := s.Hold
		if ctx.Attempt() > 0 {
			hold = 10 * time.Millisecond // a re-run finishes
		}
		h.mu.Lock()
		if _, ok := h.started[s.Tag]; !ok {
			h.started[s.Tag] = time.Now()
		}
		h.runs[s.Tag]++
		h.mu.Unlock()
		var err error
		select {
		case <-ctx.Done():
			h.mu.Lock()
			h.observed[s.Tag] = time.Now()
			h.mu.Unlock()
			time.Sleep(h.linger)
			err = ctx.Err()
		case <-time.After(hold):
		}
		h.mu.Lock()
		h.ended[s.Tag] = time.Now()
		h.mu.Unlock()
		exit()
		if err != nil {
			return transitions.Transition{}, err
		}
		return transitions.Done(s.Tag), nil
	})
	return wf
}

// waitFor polls cond every 2 ms until it holds (true) or d has passed.
func waitFor(cond func() bool, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// timeline describes, for a failure message, when each step started,
// saw its context end and ended, relative to at.
func (h *holder) timeline(at time.Time) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for tag, st := range h.started {
		fmt.Fprintf(&b, "\n  %s: started %v", tag, st.Sub(at).Round(time.Millisecond))
		if o, ok := h.observed[tag]; ok {
			fmt.Fprintf(&b, ", cancelled %v", o.Sub(at).Round(time.Millisecond))
		}
		if e, ok := h.ended[tag]; ok {
			fmt.Fprintf(&b, ", ended %v", e.Sub(at).Round(time.Millisecond))
		}
		fmt.Fprintf(&b, ", runs %d", h.runs[tag])
	}
	return b.String()
}

func (h *holder) when(m map[string]time.Time, tag string) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := m[tag]
	return t, ok
}

func (h *holder) waitStarted(t *testing.T, tag string) time.Time {
	t.Helper()
	var at time.Time
	require.Eventually(t, func() bool {
		var ok bool
		at, ok = h.when(h.started, tag)
		return ok
	}, 20*time.Second, 2*time.Millisecond, "step %s never started", tag)
	return at
}

// WallClockOptions configure the wall-clock tests for one backend.
type WallClockOptions struct {
	// NewStore returns a store shared by the engines of one test (called
	// once per test).
	NewStore func(t *testing.T) store.Store
	// Reserves says that the store reserves successors (see
	// store.HandOff.Reserve), whose steps start in their predecessors'
	// slots before the rows pass them the slot: the successor tests run.
	Reserves bool
}

// WallClock runs every wall-clock test against the backend.
func WallClock(t *testing.T, o WallClockOptions) {
	t.Run("cancel keeps a K=1 key held until the step returns", func(t *testing.T) {
		wallClockCancel(t, o, gate.Identity("acct", "1"), nil)
	})
	t.Run("cancel keeps a gate slot held until the step returns", func(t *testing.T) {
		wallClockCancel(t, o, gate.Gate("api", "1"), []gate.Limit{{Name: "api", Limit: 1}})
	})
	t.Run("a worker cut off from the store cancels its step before its lease ends", func(t *testing.T) {
		wallClockCutOff(t, o)
	})
	t.Run("a heartbeat answer about an earlier claim does not touch the next one", func(t *testing.T) {
		wallClockHeartbeatRace(t, o)
	})
	if o.Reserves {
		t.Run("a successor running in its predecessor's slot stops before that claim's lease ends", func(t *testing.T) {
			wallClockSuccessorCutOff(t, o)
		})
	}
}

func newWallEngine(t *testing.T, cfg durable.Config, defs ...durable.Definition) *durable.Engine {
	t.Helper()
	cfg.HealthInterval = -1
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e, err := durable.New(cfg)
	require.NoError(t, err)
	require.NoError(t, e.Register(defs...))
	require.NoError(t, e.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Stop(ctx)
	})
	return e
}

// wallClockCancel: instance a of key k runs on one of two engines; b of the
// same key waits. a is canceled through the other engine. a's body learns
// of it promptly (long before any heartbeat), runs on for a while, and b
// starts only after a's body returned.
func wallClockCancel(t *testing.T, o WallClockOptions, k gate.ConcurrencyKey, limits []gate.Limit) {
	st := o.NewStore(t)
	gl, err := gate.NewLimits(limits)
	require.NoError(t, err)
	h := newHolder(gl, 300*time.Millisecond)
	var engines []*durable.Engine
	for _, w := range []string{"wall-a", "wall-b"} {
		// Heartbeats every 10 s: a cancel learned within the test's bound
		// came by notification.
		engines = append(engines, newWallEngine(t, durable.Config{Store: st, WorkerID: w, Limits: limits,
			Lease: 30 * time.Second, HeartbeatInterval: 10 * time.Second, PollInterval: 20 * time.Millisecond},
			h.workflow()))
	}
	ctx := t.Context()
	a, err := engines[0].Insert(ctx, "hold", holdState{Tag: "a", Hold: time.Minute}, durable.InsertOptions{Key: k})
	require.NoError(t, err)
	h.waitStarted(t, "a")
	b, err := engines[0].Insert(ctx, "hold", holdState{Tag: "b", Hold: 10 * time.Millisecond}, durable.InsertOptions{Key: k})
	require.NoError(t, err)

	in, err := engines[0].Store().Get(ctx, a) // which engine runs it
	require.NoError(t, err)
	other := engines[0]
	if in.Worker == engines[0].WorkerID() {
		other = engines[1]
	}
	canceledAt := time.Now()
	require.NoError(t, other.Cancel(ctx, a, durable.CancelOptions{}))
	in, err = engines[0].Store().Get(ctx, a)
	require.NoError(t, err)
	if _, ended := h.when(h.ended, "a"); !ended {
		// The body had not returned when the row was read (under load it
		// may have, after its linger): the row must still hold the key.
		require.Equal(t, store.StatusExecuting, in.Status, "the canceled step still runs")
		require.True(t, in.CancelRequested)
	}

	require.Eventually(t, func() bool { _, ok := h.when(h.observed, "a"); return ok },
		3*time.Second, 2*time.Millisecond, "the running step never learned of the cancel")
	obs, _ := h.when(h.observed, "a")
	require.Less(t, obs.Sub(canceledAt), 2*time.Second, "the step learns of a cancel by notification, not at a heartbeat")

	inB := waitTerminal(t, engines[0], b)
	require.Equal(t, store.StatusDone, inB.Status)
	inA := waitTerminal(t, engines[0], a)
	require.Equal(t, store.StatusCanceled, inA.Status)
	endA, _ := h.when(h.ended, "a")
	startB, _ := h.when(h.started, "b")
	require.False(t, startB.Before(endA), "b started %v before a's body returned", endA.Sub(startB))
	require.Empty(t, h.rec.Violations())
	h.mu.Lock()
	require.Equal(t, 1, h.runs["a"], "a canceled step does not run again")
	h.mu.Unlock()
}

func waitTerminal(t *testing.T, e *durable.Engine, id string) durable.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	in, err := e.Wait(ctx, id)
	require.NoError(t, err)
	return in
}

// cutStore is a store that can be cut off from one engine: while cut,
// every call fails as if the database were unreachable. It hides the
// store's notifications from that engine.
type cutStore struct {
	store.Store
	cut atomic.Bool
}

var errCut = errors.New("connection refused (cut off by the test)")

func (c *cutStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if c.cut.Load() {
		return store.ClaimResult{}, errCut
	}
	return c.Store.Claim(ctx, req)
}

func (c *cutStore) Complete(ctx context.Context, w string, o []store.Outcome, now time.Time) ([]store.OutcomeResult, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.Store.Complete(ctx, w, o, now)
}

func (c *cutStore) Heartbeat(ctx context.Context, w string, refs []store.ClaimRef, lease time.Duration, now time.Time) (store.HeartbeatResult, error) {
	if c.cut.Load() {
		return store.HeartbeatResult{}, errCut
	}
	return c.Store.Heartbeat(ctx, w, refs, lease, now)
}

func (c *cutStore) Release(ctx context.Context, w string, refs []store.ClaimRef, now time.Time) error {
	if c.cut.Load() {
		return errCut
	}
	return c.Store.Release(ctx, w, refs, now)
}

func (c *cutStore) Reap(ctx context.Context, now time.Time) (int, error) {
	if c.cut.Load() {
		return 0, errCut
	}
	return c.Store.Reap(ctx, now)
}

func (c *cutStore) FireTimers(ctx context.Context, now time.Time) (int, error) {
	if c.cut.Load() {
		return 0, errCut
	}
	return c.Store.FireTimers(ctx, now)
}

func (c *cutStore) Reconcile(ctx context.Context, retention time.Duration, now time.Time) (store.ReconcileReport, error) {
	if c.cut.Load() {
		return store.ReconcileReport{}, errCut
	}
	return c.Store.Reconcile(ctx, retention, now)
}

func (c *cutStore) DeleteTerminal(ctx context.Context, workflow string, from, before time.Time, limit int) (int, time.Time, error) {
	if c.cut.Load() {
		return 0, from, errCut
	}
	return c.Store.DeleteTerminal(ctx, workflow, from, before, limit)
}

// wallClockCutOff: engine A runs a K = 1 step with a 1 s lease; its store
// becomes unreachable. A must cancel the step before its lease can have
// expired; engine B reaps the row and runs the step again, never while
// A's body still runs.
func wallClockCutOff(t *testing.T, o WallClockOptions) {
	st := o.NewStore(t)
	h := newHolder(gate.Limits{}, 0)
	cut := &cutStore{Store: st}
	lease := time.Second
	k := gate.Identity("acct", "cut")
	a := newWallEngine(t, durable.Config{Store: cut, WorkerID: "wall-cut", Lease: lease, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)}, h.workflow())
	t.Cleanup(func() { cut.cut.Store(false) }) // before a stops: its last outcome is stale, not stuck
	ctx := t.Context()
	id, err := a.Insert(ctx, "hold", holdState{Tag: "x", Hold: time.Minute}, durable.InsertOptions{Key: k})
	require.NoError(t, err)
	h.waitStarted(t, "x")
	cutAt := time.Now()
	cut.cut.Store(true)

	require.Eventually(t, func() bool { _, ok := h.when(h.observed, "x"); return ok },
		3*time.Second, 2*time.Millisecond, "the step of a worker cut off from its store was never cancelled")
	obs, _ := h.when(h.observed, "x")
	require.Less(t, obs.Sub(cutAt), lease, "cancelled before the lease can have expired")

	// Another engine reaps the expired lease and runs the step again; the
	// recorder would see both bodies at once if A's still ran.
	b := newWallEngine(t, durable.Config{Store: st, WorkerID: "wall-other", Lease: 30 * time.Second,
		PollInterval: 20 * time.Millisecond, ReaperInterval: 50 * time.Millisecond}, h.workflow())
	require.Eventually(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.runs["x"] >= 2
	}, 20*time.Second, 5*time.Millisecond, "the step never ran again elsewhere")
	in := waitTerminal(t, b, id)
	require.Equal(t, store.StatusDone, in.Status)
	require.Empty(t, h.rec.Violations())
}

// successorCutStore is a cutStore that hands slots off, and cuts itself
// off from its engine at the first outcome that would pass its slot to a
// successor already running in it: the rows still give the slot to the
// predecessor, whose lease can no longer be renewed.
type successorCutStore struct {
	*cutStore
	ho      store.HandOffer
	tripped atomic.Bool
}

func (c *successorCutStore) CompleteHandOff(ctx context.Context, w string, outs []store.Outcome, now time.Time, h store.HandOff) ([]store.OutcomeResult, []store.Claimed, error) {
	for _, o := range outs {
		if o.Successor.ID != "" && !c.tripped.Swap(true) {
			c.cut.Store(true)
		}
	}
	if c.cut.Load() {
		return nil, nil, errCut
	}
	return c.ho.CompleteHandOff(ctx, w, outs, now, h)
}

// wallClockSuccessorCutOff: engine A works a backlog of one K = 1 key,
// steps of 1.5 s, with a 1 s lease. Once it hands the key's slot off and
// reserves successors, a successor starts in its predecessor's slot the
// moment that step ends, before the outcome that passes the slot commits;
// the store is cut off right then. The successor runs on in the slot the
// rows still give the predecessor, whose lease nobody renews: A must
// cancel it before that lease can have expired. Engine B then reaps the claim
// and the reservations and runs everything, never while a body of A's
// still runs.
func wallClockSuccessorCutOff(t *testing.T, o WallClockOptions) {
	st := o.NewStore(t)
	ho, ok := st.(store.HandOffer)
	require.True(t, ok, "Reserves is set but the store does not hand slots off")
	h := newHolder(gate.Limits{}, 0)
	cut := &successorCutStore{cutStore: &cutStore{Store: st}, ho: ho}
	lease := time.Second
	k := gate.Identity("acct", "succ")
	a := newWallEngine(t, durable.Config{Store: cut, WorkerID: "wall-succ", Lease: lease, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)}, h.workflow())
	t.Cleanup(func() { cut.cut.Store(false) })
	ctx := t.Context()
	var ids []string
	for i := range 4 {
		id, err := a.Insert(ctx, "hold", holdState{Tag: fmt.Sprint(i), Hold: 3 * lease / 2}, durable.InsertOptions{Key: k})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	require.Eventually(t, cut.tripped.Load, 20*time.Second, time.Millisecond, "no successor ever started")
	cutAt := time.Now()

	// Every body of A's ends before the lease of the claim whose slot it
	// runs in can have expired.
	stopped := func() bool {
		h.mu.Lock()
		cancelled := len(h.observed)
		h.mu.Unlock()
		return cancelled > 0 && h.rec.Running(k.String()) == 0
	}
	if !waitFor(stopped, 3*time.Second) {
		t.Fatalf("the cut-off engine's successor was never cancelled, or ran on:%s", h.timeline(cutAt))
	}
	require.Less(t, time.Since(cutAt), lease, "A's last body ended before the lease can have expired")

	b := newWallEngine(t, durable.Config{Store: st, WorkerID: "wall-succ-other", Lease: 30 * time.Second,
		PollInterval: 20 * time.Millisecond, ReaperInterval: 50 * time.Millisecond}, h.workflow())
	for _, id := range ids {
		in := waitTerminal(t, b, id)
		require.Equal(t, store.StatusDone, in.Status)
	}
	require.Empty(t, h.rec.Violations())
}

// raceStore delays the answer of the first heartbeat that names claim
// fence of instance id until the instance has been claimed again, and then
// asks the store: the answer (the old claim is lost) arrives while the
// engine runs the new claim.
type raceStore struct {
	store.Store
	id    atomic.Value // string
	once  sync.Once
	fired atomic.Bool
}

func (r *raceStore) Heartbeat(ctx context.Context, w string, refs []store.ClaimRef, lease time.Duration, now time.Time) (store.HeartbeatResult, error) {
	id, _ := r.id.Load().(string)
	for _, ref := range refs {
		if ref.ID != id || id == "" {
			continue
		}
		var delayed bool
		r.once.Do(func() {
			delayed = true
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				in, err := r.Store.Get(ctx, id)
				if err == nil && in.Status == store.StatusExecuting && in.Fence != ref.Fence {
					break
				}
				time.Sleep(time.Millisecond)
			}
		})
		if delayed {
			r.fired.Store(true)
		}
	}
	return r.Store.Heartbeat(ctx, w, refs, lease, now)
}

// wallClockHeartbeatRace: step "a" commits and the engine claims step "b"
// of the same instance while a heartbeat about "a"'s claim is in flight;
// the answer that "a"'s claim is lost must not cancel "b".
func wallClockHeartbeatRace(t *testing.T, o WallClockOptions) {
	rs := &raceStore{Store: o.NewStore(t)}
	var bCancelled atomic.Bool
	var bRuns atomic.Int32
	wf := durable.NewWorkflow[holdState]("two", "a", durable.WorkflowOptions{})
	wf.Step("a", func(ctx steps.Context, s holdState) (transitions.Transition, error) {
		time.Sleep(100 * time.Millisecond) // a heartbeat names this claim
		return transitions.Next("b", s), nil
	})
	wf.Step("b", func(ctx steps.Context, s holdState) (transitions.Transition, error) {
		bRuns.Add(1)
		select {
		case <-ctx.Done():
			bCancelled.Store(true)
			return transitions.Transition{}, ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
		return transitions.Done("ok"), nil
	})
	e := newWallEngine(t, durable.Config{Store: rs, WorkerID: "wall-race", Lease: 3 * time.Second,
		HeartbeatInterval: 20 * time.Millisecond, PollInterval: 10 * time.Millisecond}, wf)
	id, err := e.Insert(t.Context(), "two", holdState{}, durable.InsertOptions{Key: gate.Identity("acct", "race")})
	require.NoError(t, err)
	rs.id.Store(id)
	in := waitTerminal(t, e, id)
	require.True(t, rs.fired.Load(), "the test did not delay a heartbeat across the two claims")
	require.False(t, bCancelled.Load(), "step b was cancelled by an answer about step a's claim")
	require.Equal(t, store.StatusDone, in.Status)
	require.Equal(t, int32(1), bRuns.Load(), "step b ran once")
	require.Equal(t, 0, in.Attempt)
}
