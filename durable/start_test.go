package durable_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
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
	_, err := st.SyncKeyLimits(ctx, store.DefaultNamespace, store.KeyLimits{Limits: []gate.Limit{{Name: "api", Limit: 2}}})
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
	require.EqualValues(t, 1, st.listening.Load())
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
