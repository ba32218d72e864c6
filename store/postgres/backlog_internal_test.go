package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
)

// TestBacklogBlockedWhenTheKeyIsFullAgain: the first claim to find a gate
// key full blocks the rows of its window only, and commits without
// writing the key's deeper backlog; the next claim that finds the key full
// (hot now) moves that backlog off the pick path.
func TestBacklogBlockedWhenTheKeyIsFullAgain(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	_, err := s.SyncLimits(ctx, []gate.Limit{{Name: "hot", Limit: 1, Shards: 1}})
	require.NoError(t, err)
	const n = 300
	var rows []store.NewInstance
	for range n {
		rows = append(rows, keyedInstance("hot:1"))
	}
	_, err = s.Insert(ctx, rows)
	require.NoError(t, err)
	ready := func() int {
		t.Helper()
		var c int
		require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT count(*) FROM {schema}.instances WHERE status = 'ready'`)).Scan(&c))
		return c
	}
	claim := func() []store.Claimed {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 2, Lease: time.Minute})
		require.NoError(t, err)
		return res.Claimed
	}

	require.Len(t, claim(), 1, "the gate admits one")
	first := ready()
	require.Greater(t, first, admission.ReadyCap, "the backlog beyond the window is still ready")
	require.Less(t, first, n-1, "the window's rows were blocked")

	require.Empty(t, claim(), "the key is full")
	require.LessOrEqual(t, ready(), admission.ReadyCap, "found full again: its backlog is off the pick path")
}
