package memory

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/godurable/godurable/store"
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
		nis[i] = store.NewInstance{ID: fmt.Sprintf("hot-%05d", i), Workflow: "wf", Queue: "q", State: json.RawMessage(`{}`), Key: "hot:1", RunAt: t0}
	}
	_, err := s.Insert(ctx, nis)
	require.NoError(t, err)
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 5, Lease: time.Hour, Now: t0})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.Equal(t, backlog-1, s.keys["hot:1"].blocked.Len())
	require.Empty(t, s.queues["q"].prios, "no ready heap left in the queue")

	for i := range 100 {
		_, err := s.Insert(ctx, []store.NewInstance{{ID: fmt.Sprint("cold-", i), Workflow: "wf", Queue: "q", State: json.RawMessage(`{}`), Key: fmt.Sprint("cold:", i), RunAt: t0}})
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
	require.NoError(t, s.Listen(ctx, func(string) {}))
	require.Len(t, s.listeners, 1)
	cancel()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.listeners) == 0
	}, time.Second, time.Millisecond)
}
