package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
)

// TestAdmitReadsAKeyOfSeveralAfterItsLock: the window reads whether a K =
// 1 key is busy before it tries the key's lock, for its rows of one key,
// and sqlClaim checks that read again for a row's key column only. A
// claim whose window read acct:a as free, and then took its lock after
// another claim made acct:a's holder executing and committed, must not
// admit a row of several keys that holds acct:a as another key: admit
// reads acct:a again under the lock; otherwise a row of one key and a row
// holding the same key as its other key run at once.
func TestAdmitReadsAKeyOfSeveralAfterItsLock(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	holder := uuid.NewString()
	_, err := s.Insert(ctx, []store.NewInstance{{ID: holder, Workflow: "wf", Queue: "q", Step: "s", Key: "acct:a"}})
	require.NoError(t, err)
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1, "acct:a's holder executes, committed")

	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// What the window of such a claim leaves: acct:a tried and had (its
	// row of one key read acct:a as free in the window's snapshot).
	_, err = tx.Exec(ctx, s.q(sqlKeyTryLock), []string{"acct:a"}, s.keySalt)
	require.NoError(t, err)
	multi, one := uuid.NewString(), uuid.NewString()
	cc := &claimContext{now: time.Now(), limit: 10, queue: "q", busyOne: map[string]bool{}, tried: map[string]bool{"acct:a": true},
		candidates: []admission.Candidate{
			{ID: multi, Key: "acct:0", Also: []admission.Need{{Key: "acct:a"}}},
			{ID: one, Key: "acct:a"},
		},
		multi: map[string]multiRow{multi: {key: store.KeyRef{Key: "acct:0"}, others: []store.KeyRef{{Key: "acct:a"}}}},
	}
	plan, _, err := s.admit(ctx, tx, cc, false)
	require.NoError(t, err)
	require.Empty(t, plan.Admitted, "acct:a is held")
	require.Equal(t, "acct:a", plan.BlockedOn[multi], "blocked on acct:a, read busy under its lock")
}
