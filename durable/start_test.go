package durable_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/transitions"
)

// startCounting is a store that counts what Start asks of it: who listens
// (a Listen call listens until its context is done) and ReclaimWorker calls.
type startCounting struct {
	*memory.Store
	listening atomic.Int64
	reclaims  atomic.Int64
}

func (s *startCounting) Listen(ctx context.Context, fn func(store.Notification)) error {
	s.listening.Add(1)
	context.AfterFunc(ctx, func() { s.listening.Add(-1) })
	return s.Store.Listen(ctx, fn)
}

func (s *startCounting) ReclaimWorker(ctx context.Context, worker string, now time.Time) (int, error) {
	s.reclaims.Add(1)
	return s.Store.ReclaimWorker(ctx, worker, now)
}

func stop(t *testing.T, e *durable.Engine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, e.Stop(ctx))
}

// TestStartListensWhileItSyncsAndStopsListeningWhenRefused: Start opens the
// store's notifications while it syncs limits and reclaims (Scheduler.Listen);
// a Start that is refused stops listening before it returns, and a started
// engine listens until Stop.
func TestStartListensWhileItSyncsAndStopsListeningWhenRefused(t *testing.T) {
	ctx := waitCtx(t)
	st := &startCounting{Store: memory.New(memory.Options{})}
	_, err := st.SyncKeyLimits(ctx, store.DefaultNamespace, store.KeyLimits{Limits: []gate.Limit{{Name: "api", Limit: 2}}}, store.SyncOptions{})
	require.NoError(t, err)
	_, err = st.Insert(ctx, []store.NewInstance{{ID: "6f1c1f8e-8a7e-4c41-9d5a-0b3a1b7f3c12", Workflow: "count", Version: 1,
		Queue: "other", Step: "inc", State: json.RawMessage(`{}`), Key: "api:1"}})
	require.NoError(t, err)

	refused := newEngine(t, durable.Config{Store: st, Strict: true, Limits: []gate.Limit{{Name: "api", Limit: 9}}}, counterWorkflow())
	require.ErrorIs(t, refused.Start(ctx), gate.ErrPrefixCapture)
	require.Eventually(t, func() bool { return st.listening.Load() == 0 }, 5*time.Second, time.Millisecond,
		"a refused Start leaves no listener")

	e := newEngine(t, durable.Config{Store: st, WorkerID: "w2"}, counterWorkflow())
	require.NoError(t, e.Start(ctx))
	require.Eventually(t, func() bool { return st.listening.Load() == 1 }, 5*time.Second, time.Millisecond,
		"a started engine listens")
	stop(t, e)
	require.Eventually(t, func() bool { return st.listening.Load() == 0 }, 5*time.Second, time.Millisecond,
		"Stop stops listening")
}

// TestStartReclaimsOnlyUnderAStableWorkerID: an engine started under the
// worker id of a dead predecessor takes its claims back at once; one whose
// id New generated has nothing to take back and does not ask the store.
func TestStartReclaimsOnlyUnderAStableWorkerID(t *testing.T) {
	ctx := waitCtx(t)
	st := &startCounting{Store: memory.New(memory.Options{})}
	const id = "6f1c1f8e-8a7e-4c41-9d5a-0b3a1b7f3c12"
	_, err := st.Insert(ctx, []store.NewInstance{{ID: id, Workflow: "count", Version: 1,
		Queue: durable.DefaultQueue, Step: "inc", State: json.RawMessage(`{"n":0}`)}})
	require.NoError(t, err)
	res, err := st.Claim(ctx, store.ClaimRequest{Queue: durable.DefaultQueue, Worker: "pod-1", Limit: 1, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1, "the dead predecessor's claim")

	fresh := newEngine(t, durable.Config{Store: st}, counterWorkflow())
	require.NoError(t, fresh.Start(ctx))
	require.Zero(t, st.reclaims.Load(), "a generated worker id has nothing to reclaim")
	stop(t, fresh)
	got, err := st.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, store.StatusExecuting, got.Status, "the claim of pod-1 waits for its lease")

	again := newEngine(t, durable.Config{Store: st, WorkerID: "pod-1"}, counterWorkflow())
	require.NoError(t, again.Start(ctx))
	require.EqualValues(t, 1, st.reclaims.Load())
	require.Eventually(t, func() bool {
		got, err := st.Get(ctx, id)
		return err == nil && got.Status == store.StatusDone
	}, 10*time.Second, time.Millisecond, "pod-1's successor reclaims the row and runs it")
	stop(t, again)
}

// lateListener is a store that starts listening only once open is closed.
type lateListener struct {
	*memory.Store
	open chan struct{}
}

func (s *lateListener) Listen(ctx context.Context, fn func(store.Notification)) error {
	select {
	case <-s.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.Listen(ctx, fn)
}

// notChecking is a store that listens as its lateListener does but is not
// a store.ClaimChecker (nor any other optional interface but Notifier):
// its Store is the store.Store interface alone.
type notChecking struct {
	store.Store
	late *lateListener
}

func (s notChecking) Listen(ctx context.Context, fn func(store.Notification)) error {
	return s.late.Listen(ctx, fn)
}

// TestStartRunsBeforeTheStoreListensAndCancelsStillArrive: a started engine
// claims and runs steps before its store listens (Start does not wait for
// it); a cancel committed before then, whose notification nobody heard,
// reaches the running step as soon as the store listens, by a check of
// the engine's claims at once (store.ClaimChecker), or by a heartbeat at
// once from a store that cannot check, not at the next heartbeat (an hour
// away here).
func TestStartRunsBeforeTheStoreListensAndCancelsStillArrive(t *testing.T) {
	for _, checks := range []bool{true, false} {
		t.Run(fmt.Sprintf("checks=%v", checks), func(t *testing.T) {
			late := &lateListener{Store: memory.New(memory.Options{}), open: make(chan struct{})}
			var st store.Store = late
			if !checks {
				st = notChecking{Store: late, late: late}
			}
			_, ok := st.(store.ClaimChecker)
			require.Equal(t, checks, ok)
			startsBeforeListening(t, st, late.open)
		})
	}
}

// runBlocked starts an engine on st (leases of 3 hours, a heartbeat an
// hour) with one instance whose step runs until its context is done, and
// returns once the step runs: the instance's id, and the channel its step's
// context error is sent on when it ends.
func runBlocked(t *testing.T, ctx context.Context, st store.Store) (string, <-chan error) {
	t.Helper()
	running := make(chan struct{}, 1)
	ended := make(chan error, 1)
	wf := durable.NewWorkflow[counter]("block", "wait", durable.WorkflowOptions{})
	wf.Step("wait", func(sc steps.Context, s counter) (transitions.Transition, error) {
		running <- struct{}{}
		<-sc.Done()
		ended <- sc.Err()
		return transitions.Transition{}, sc.Err()
	})
	e := newEngine(t, durable.Config{Store: st, Lease: 3 * time.Hour, HeartbeatInterval: time.Hour}, wf)
	id, err := e.Insert(ctx, "block", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	start(t, e)
	select {
	case <-running:
	case <-ctx.Done():
		t.Fatal("the step never ran")
	}
	return id, ended
}

func startsBeforeListening(t *testing.T, st store.Store, open chan struct{}) {
	ctx := waitCtx(t)
	id, ended := runBlocked(t, ctx, st)                // the store does not listen yet
	require.NoError(t, st.Cancel(ctx, id, time.Now())) // another process's cancel: only notified
	select {
	case err := <-ended:
		t.Fatalf("the step ended (%v) before the store listened: the cancel was heard somehow", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(open)
	select {
	case err := <-ended:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("the cancel did not reach the step once the store listened")
	}
}

// relistening is a lateListener that counts heartbeats and claim checks,
// and listens again (as after a lost connection) once again is closed.
type relistening struct {
	*lateListener
	again             chan struct{}
	beats, checks     atomic.Int64
	beatRefs, chkRefs atomic.Int64
}

func (s *relistening) Heartbeat(ctx context.Context, w string, refs []store.ClaimRef, lease time.Duration, now time.Time) (store.HeartbeatResult, error) {
	s.beats.Add(1)
	s.beatRefs.Add(int64(len(refs)))
	return s.Store.Heartbeat(ctx, w, refs, lease, now)
}

func (s *relistening) CheckClaims(ctx context.Context, w string, refs []store.ClaimRef) (store.HeartbeatResult, error) {
	s.checks.Add(1)
	s.chkRefs.Add(int64(len(refs)))
	return s.Store.CheckClaims(ctx, w, refs)
}

func (s *relistening) Listen(ctx context.Context, fn func(store.Notification)) error {
	if err := s.lateListener.Listen(ctx, fn); err != nil {
		return err
	}
	select {
	case <-s.again:
		fn(store.Notification{}) // listening again
	case <-ctx.Done():
	}
	<-ctx.Done()
	return nil
}

// TestListeningAgainRenewsTheClaims: when its store first listens, an
// engine checks the claims it made before (store.ClaimChecker) without a
// heartbeat; when the store listens again, as after a lost connection
// during which the claims may have gone unrenewed, it renews them by a
// heartbeat at once, not at the next one (an hour away here).
func TestListeningAgainRenewsTheClaims(t *testing.T) {
	ctx := waitCtx(t)
	st := &relistening{lateListener: &lateListener{Store: memory.New(memory.Options{}), open: make(chan struct{})},
		again: make(chan struct{})}
	id, _ := runBlocked(t, ctx, st)
	defer func() { _ = st.Cancel(ctx, id, time.Now()) }() // the step ends now, not at the engine's stop deadline
	close(st.open)
	require.Eventually(t, func() bool { return st.chkRefs.Load() >= 1 }, 5*time.Second, time.Millisecond,
		"the first listen checks the running claim")
	require.Zero(t, st.beats.Load(), "no heartbeat at the first listen")
	close(st.again)
	require.Eventually(t, func() bool { return st.beatRefs.Load() >= 1 }, 5*time.Second, time.Millisecond,
		"listening again renews the running claim by a heartbeat at once")
	require.Equal(t, int64(1), st.beats.Load())
	require.Equal(t, int64(1), st.checks.Load(), "the claims are checked at the first listen only")
}
