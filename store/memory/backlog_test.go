package memory

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestBlockedBacklogLeavesThePickPath proves structurally that a claim never
// scans a saturated key's backlog again: once blocked, those rows are on the
// key's own heap, and the queue's pick heaps hold only other work.
func TestBlockedBacklogLeavesThePickPath(t *testing.T) {
	s := New(Options{})
	ctx := context.Background()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	const backlog = 20_000
	nis := make([]store.NewInstance, backlog)
	for i := range nis {
		nis[i] = store.NewInstance{ID: tid(fmt.Sprintf("hot-%05d", i)), Workflow: "wf", Step: "s", Queue: "q", State: json.RawMessage(`{}`), Key: "hot:1", RunAt: t0}
	}
	_, err := s.Insert(ctx, nis)
	require.NoError(t, err)
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 5, Lease: time.Hour, Now: t0})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.Equal(t, backlog-1, s.keys["hot:1"].blocked.Len())
	require.Empty(t, s.queues["q"].prios, "no ready heap left in the queue")

	for i := range 100 {
		_, err := s.Insert(ctx, []store.NewInstance{{ID: tid(fmt.Sprint("cold-", i)), Workflow: "wf", Step: "s", Queue: "q", State: json.RawMessage(`{}`), Key: fmt.Sprint("cold:", i), RunAt: t0}})
		require.NoError(t, err)
		res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 5, Lease: time.Hour, Now: t0})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 1)
	}
	require.NoError(t, s.check(nil))
}

// TestListenerUnregistersWithItsContext checks that a done ctx removes fn.
func TestListenerUnregistersWithItsContext(t *testing.T) {
	s := New(Options{})
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, s.Listen(ctx, func(store.Notification) {}))
	require.Len(t, s.listeners, 1)
	cancel()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.listeners) == 0
	}, time.Second, time.Millisecond)
}

// TestChildOfEarlierSpawnDoesNotJoinLaterSpawn: a parent canceled while its
// children run, retried, and spawning again waits for its new children only.
func TestChildOfEarlierSpawnDoesNotJoinLaterSpawn(t *testing.T) {
	s := New(Options{})
	ctx := context.Background()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	claim := func() store.Claimed {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1, Lease: time.Hour, Now: t0})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 1)
		return res.Claimed[0]
	}
	commit := func(o store.Outcome) {
		t.Helper()
		res, err := s.Complete(ctx, "w", []store.Outcome{o}, t0)
		require.NoError(t, err)
		require.False(t, res[0].Stale)
	}
	child := func(id string) []store.NewInstance {
		return []store.NewInstance{{ID: tid(id), Workflow: "c", Step: "s", Queue: "later", State: json.RawMessage(`{}`)}}
	}
	_, err := s.Insert(ctx, []store.NewInstance{{ID: tid("p"), Workflow: "wf", Step: "s", Queue: "q", State: json.RawMessage(`{}`), RunAt: t0}})
	require.NoError(t, err)
	c := claim()
	commit(store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeSpawn, Step: "join", Children: child("old")})
	require.NoError(t, s.Cancel(ctx, tid("p"), t0))
	require.NoError(t, s.Retry(ctx, tid("p"), t0))
	c = claim()
	commit(store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeSpawn, Step: "join", Children: child("new")})

	require.NoError(t, s.Cancel(ctx, tid("old"), t0))
	p, err := s.Get(ctx, tid("p"))
	require.NoError(t, err)
	require.Equal(t, store.StatusChildren, p.Status, "the old spawn's child does not end the new join")
	require.Equal(t, 1, p.PendingChildren)
	require.NoError(t, s.Cancel(ctx, tid("new"), t0))
	p, err = s.Get(ctx, tid("p"))
	require.NoError(t, err)
	require.Equal(t, store.StatusReady, p.Status)
	require.NoError(t, s.check(nil))
}

// tid is a stable UUID named by a readable test id.
func tid(name string) string { return uuid.NewSHA1(uuid.NameSpaceURL, []byte(name)).String() }
