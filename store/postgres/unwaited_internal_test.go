package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// TestClaimingSkipsTheWaitingRead: an outcome that frees a key's slot
// tells whether a row waits for it (store.OutcomeResult.Unwaited), unless
// the worker says it claims again anyway (store.HandOff.Claiming): then
// the store does not read the key's waiting rows and leaves it false,
// whatever they are.
func TestClaimingSkipsTheWaitingRead(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	unwaited := func(c store.Claimed, claiming bool) bool {
		t.Helper()
		res, handed, err := s.CompleteHandOff(ctx, "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone}},
			time.Time{}, store.HandOff{Claiming: claiming})
		require.NoError(t, err)
		require.Empty(t, handed, "no room: nothing is handed off")
		require.False(t, res[0].Stale)
		require.Equal(t, store.StatusDone, statusOf(t, s, c.ID), "the outcome is committed either way")
		return res[0].Unwaited
	}

	require.True(t, unwaited(holdKey(t, s, "acct:1"), false), "no row of the key waits")
	require.False(t, unwaited(holdKey(t, s, "acct:2"), true), "not read: left false")

	// Keys with a row waiting (both held before either ends, so that no
	// claim takes the other's waiting row): false either way.
	a, b := holdKey(t, s, "acct:3"), holdKey(t, s, "acct:4")
	_, err := s.Insert(ctx, []store.NewInstance{keyedInstance("acct:3"), keyedInstance("acct:4")})
	require.NoError(t, err)
	require.False(t, unwaited(a, false), "a row of the key waits")
	require.False(t, unwaited(b, true))
}
