package memory_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/store/storetest"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s := memory.New(memory.Options{})
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func newInst(queue, key string) store.NewInstance {
	return store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: queue, Step: "s", State: json.RawMessage(`{}`), Key: key, RunAt: t0}
}

func TestClockIsUsedForZeroTimes(t *testing.T) {
	now := t0.Add(time.Hour)
	s := memory.New(memory.Options{Clock: func() time.Time { return now }})
	ctx := t.Context()
	ni := newInst("q", "")
	ni.RunAt = time.Time{}
	_, err := s.Insert(ctx, []store.NewInstance{ni})
	require.NoError(t, err)
	got, err := s.Get(ctx, ni.ID)
	require.NoError(t, err)
	require.Equal(t, now, got.RunAt)
	require.Equal(t, now, got.CreatedAt)

	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.Equal(t, now.Add(time.Minute), res.Claimed[0].LeaseExpiresAt)

	now = now.Add(2 * time.Minute)
	n, err := s.Reap(ctx, time.Time{})
	require.NoError(t, err)
	require.Equal(t, 1, n, "a zero reap time is the clock's now")
}

// notified collects Listen calls.
type notified struct {
	mu       sync.Mutex
	qs       []string
	canceled []string
}

func (n *notified) fn(x store.Notification) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case x.Canceled != "":
		n.canceled = append(n.canceled, x.Canceled)
	case x.Queue != "":
		n.qs = append(n.qs, x.Queue)
	}
}

// take returns and clears the queues notified so far.
func (n *notified) take() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := n.qs
	n.qs = nil
	return out
}

func TestListenNotifiesWhenWorkMayBeReady(t *testing.T) {
	s := memory.New(memory.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	var n notified
	require.NoError(t, s.Listen(ctx, n.fn))

	// Insert.
	a, b := newInst("qa", "account:1"), newInst("qb", "account:1")
	_, err := s.Insert(t.Context(), []store.NewInstance{a})
	require.NoError(t, err)
	require.Equal(t, []string{"qa"}, n.take())
	_, err = s.Insert(t.Context(), []store.NewInstance{b})
	require.NoError(t, err)
	require.Equal(t, []string{"qb"}, n.take())

	// A claim that blocks b notifies nothing.
	ca, err := s.Claim(t.Context(), store.ClaimRequest{Queue: "qa", Worker: "w", Limit: 1, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	cb, err := s.Claim(t.Context(), store.ClaimRequest{Queue: "qb", Worker: "w", Limit: 1, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	require.Empty(t, cb.Claimed)
	require.Empty(t, n.take())

	// a awaits: its freed slot promotes b in queue qb.
	c := ca.Claimed[0]
	_, err = s.Complete(t.Context(), "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeAwait, AwaitSignal: "go", TimeoutAt: t0.Add(time.Hour)}}, t0)
	require.NoError(t, err)
	require.Equal(t, []string{"qb"}, n.take())

	// A signal wakes a in qa.
	_, err = s.Signal(t.Context(), store.SignalRequest{InstanceID: a.ID, Name: "go", Now: t0})
	require.NoError(t, err)
	require.Equal(t, []string{"qa"}, n.take())

	// A timer fires.
	ca, err = s.Claim(t.Context(), store.ClaimRequest{Queue: "qa", Worker: "w", Limit: 1, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	require.Len(t, ca.Claimed, 1)
	c = ca.Claimed[0]
	_, err = s.Complete(t.Context(), "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeAwait, AwaitSignal: "go", TimeoutAt: t0.Add(time.Minute), ConsumeSignal: c.Signal.ID}}, t0)
	require.NoError(t, err)
	n.take()
	fired, err := s.FireTimers(t.Context(), t0.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, 1, fired)
	require.Equal(t, []string{"qa"}, n.take())

	// After ctx is done, fn is no longer called.
	cancel()
	require.Eventually(t, func() bool {
		_, err := s.Insert(t.Context(), []store.NewInstance{newInst("qc", "")})
		require.NoError(t, err)
		return !slices.Contains(n.take(), "qc")
	}, time.Second, time.Millisecond)
	_, err = s.Insert(t.Context(), []store.NewInstance{newInst("qd", "")})
	require.NoError(t, err)
	require.Empty(t, n.take())
}

func TestListenerMayCallTheStore(t *testing.T) {
	s := memory.New(memory.Options{})
	done := make(chan int, 1)
	require.NoError(t, s.Listen(t.Context(), func(n store.Notification) {
		if n.Queue == "" {
			return // listening
		}
		res, err := s.Claim(context.Background(), store.ClaimRequest{Queue: n.Queue, Worker: "w", Limit: 10, Lease: time.Minute, Now: t0})
		if err == nil {
			done <- len(res.Claimed)
		}
	}))
	_, err := s.Insert(t.Context(), []store.NewInstance{newInst("q", "")})
	require.NoError(t, err)
	require.Equal(t, 1, <-done, "fn runs after the store's lock is released")
}

func TestClosedStoreRefusesCalls(t *testing.T) {
	s := memory.New(memory.Options{})
	ctx := t.Context()
	ni := newInst("q", "")
	_, err := s.Insert(ctx, []store.NewInstance{ni})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	calls := map[string]error{}
	_, calls["insert"] = s.Insert(ctx, []store.NewInstance{newInst("q", "")})
	_, calls["claim"] = s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1, Lease: time.Minute})
	_, calls["complete"] = s.Complete(ctx, "w", nil, t0)
	_, calls["heartbeat"] = s.Heartbeat(ctx, "w", nil, time.Minute, t0)
	calls["release"] = s.Release(ctx, "w", nil, t0)
	_, calls["signal"] = s.Signal(ctx, store.SignalRequest{InstanceID: ni.ID, Name: "x"})
	calls["cancel"] = s.Cancel(ctx, ni.ID, t0)
	calls["retry"] = s.Retry(ctx, ni.ID, t0)
	_, calls["get"] = s.Get(ctx, ni.ID)
	_, calls["list"] = s.List(ctx, store.ListFilter{})
	_, calls["children"] = s.Children(ctx, ni.ID)
	_, calls["history"] = s.History(ctx, ni.ID)
	_, calls["keyinfo"] = s.KeyInfo(ctx, "a:b")
	_, calls["timers"] = s.FireTimers(ctx, t0)
	_, calls["reap"] = s.Reap(ctx, t0)
	_, calls["reclaim"] = s.ReclaimWorker(ctx, "w", t0)
	_, calls["reconcile"] = s.Reconcile(ctx, 0, t0)
	_, calls["synclimits"] = s.SyncLimits(ctx, nil)
	_, calls["limits"] = s.Limits(ctx)
	calls["listen"] = s.Listen(ctx, func(store.Notification) {})
	for name, err := range calls {
		require.True(t, errors.Is(err, store.ErrClosed), "%s after close: %v", name, err)
	}
}

func TestMalformedCompleteCommitsNothing(t *testing.T) {
	s := memory.New(memory.Options{})
	ctx := t.Context()
	a, b := newInst("q", ""), newInst("q", "")
	_, err := s.Insert(ctx, []store.NewInstance{a, b})
	require.NoError(t, err)
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 2, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 2)
	ok := store.Outcome{ID: res.Claimed[0].ID, Fence: res.Claimed[0].Fence, Kind: store.OutcomeDone}
	for name, bad := range map[string]store.Outcome{
		"unknown kind": {ID: res.Claimed[1].ID, Fence: res.Claimed[1].Fence},
		"invalid key":  {ID: res.Claimed[1].ID, Fence: res.Claimed[1].Fence, Kind: store.OutcomeReady, SetKey: true, Key: "nocolon"},
		"invalid json": {ID: res.Claimed[1].ID, Fence: res.Claimed[1].Fence, Kind: store.OutcomeReady, State: json.RawMessage(`{`)},
		"taken child":  {ID: res.Claimed[1].ID, Fence: res.Claimed[1].Fence, Kind: store.OutcomeSpawn, Children: []store.NewInstance{{ID: a.ID, Workflow: "c", Queue: "q"}}},
		"no signal":    {ID: res.Claimed[1].ID, Fence: res.Claimed[1].Fence, Kind: store.OutcomeAwait},
	} {
		_, err := s.Complete(ctx, "w", []store.Outcome{ok, bad}, t0)
		require.Error(t, err, name)
		got, err := s.Get(ctx, ok.ID)
		require.NoError(t, err)
		require.Equal(t, store.StatusExecuting, got.Status, "%s: the valid outcome of a malformed batch did not commit", name)
	}
}

// BenchmarkClaimBehindSaturatedKey measures a claim of one fresh row while
// a single key's backlog of blocked rows sits in the same queue.
func BenchmarkClaimBehindSaturatedKey(b *testing.B) {
	for _, backlog := range []int{1_000, 100_000} {
		b.Run(fmt.Sprint("backlog=", backlog), func(b *testing.B) {
			s := memory.New(memory.Options{})
			ctx := context.Background()
			nis := make([]store.NewInstance, backlog)
			for i := range nis {
				nis[i] = newInst("q", "hot:1")
			}
			_, err := s.Insert(ctx, nis)
			require.NoError(b, err)
			_, err = s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 10, Lease: time.Hour, Now: t0})
			require.NoError(b, err) // one holder; the rest are now blocked
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				ni := newInst("q", fmt.Sprint("cold:", i))
				_, err := s.Insert(ctx, []store.NewInstance{ni})
				require.NoError(b, err)
				b.StartTimer()
				res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 5, Lease: time.Hour, Now: t0})
				if err != nil || len(res.Claimed) != 1 {
					b.Fatalf("claim: %v, %d rows", err, len(res.Claimed))
				}
			}
		})
	}
}

func TestRetriedCompleteOfASpawnIsStale(t *testing.T) {
	s := memory.New(memory.Options{})
	ctx := t.Context()
	_, err := s.Insert(ctx, []store.NewInstance{newInst("q", "")})
	require.NoError(t, err)
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	c := res.Claimed[0]
	o := store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeSpawn, Step: "join",
		Children: []store.NewInstance{newInst("q", "")}}
	out, err := s.Complete(ctx, "w", []store.Outcome{o}, t0)
	require.NoError(t, err)
	require.False(t, out[0].Stale)
	out, err = s.Complete(ctx, "w", []store.Outcome{o}, t0)
	require.NoError(t, err, "the children exist now, but the outcome is stale, not malformed")
	require.True(t, out[0].Stale)
}
