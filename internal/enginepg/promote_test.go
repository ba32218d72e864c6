package enginepg

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// blockedBehindRunning inserts two rows of one K = 1 key and claims: the
// first runs, the second is blocked behind it.
func blockedBehindRunning(t *testing.T, ctx context.Context, st store.Store) (running store.Claimed, blocked string) {
	t.Helper()
	a := store.NewInstance{ID: uuid.NewString(), Workflow: "w", Queue: "q", Step: "s", State: json.RawMessage(`{}`), Key: "acct:1"}
	b := store.NewInstance{ID: uuid.NewString(), Workflow: "w", Queue: "q", Step: "s", State: json.RawMessage(`{}`), Key: "acct:1"}
	_, err := st.Insert(ctx, []store.NewInstance{a})
	require.NoError(t, err)
	_, err = st.Insert(ctx, []store.NewInstance{b})
	require.NoError(t, err)
	res, err := st.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 2, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	in, err := st.Get(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, store.StatusBlocked, in.Status)
	return res.Claimed[0], b.ID
}

// TestSkippedPromotionIsRetried frees a K = 1 key while its only blocked row
// is row-locked by another transaction, as a claim's window leaves it: under
// READ COMMITTED, FOR UPDATE SKIP LOCKED keeps the lock of a row it found
// ready in its snapshot but blocked when it locked it (the row fails the
// recheck and is not returned). The promotion skips locked rows (waiting
// for them deadlocked with outcome batches), so it promotes nothing; the
// outcome batch finds the key stranded and retries its promotion after
// committing, and the retry promotes the row once the lock is gone. Before,
// the key sat idle until the reconciler's sweep (the stress test caught it
// under load).
func TestSkippedPromotionIsRetried(t *testing.T) {
	st, pool := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	c, blocked := blockedBehindRunning(t, ctx, st)

	tx, err := pool.Begin(ctx) // the claim that holds the blocked row's lock
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM instances WHERE id = $1 FOR UPDATE", blocked)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := st.Complete(ctx, "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone, Result: json.RawMessage(`1`)}}, time.Time{})
		done <- err
	}()
	time.Sleep(20 * time.Millisecond) // the outcome commits and its first retries find the row still locked
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)
	requireStatus(t, ctx, st, blocked, store.StatusReady)
}

// TestStrandedKeyBeyondTheRetriesIsHealedOnceFree holds the blocked row's
// lock past every retry of the outcome's heal: the key stays stranded while
// the lock is held, and once it goes the row is promoted once, by the
// store's late heal (healLater), which keeps trying the key, or by the
// reconciler's sweep, whichever comes first (the late heal's first try is
// 50 ms after the heal gave up, so on a loaded machine the sweep below may
// find the row promoted already).
func TestStrandedKeyBeyondTheRetriesIsHealedOnceFree(t *testing.T) {
	st, pool := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	c, blocked := blockedBehindRunning(t, ctx, st)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM instances WHERE id = $1 FOR UPDATE", blocked)
	require.NoError(t, err)
	_, err = st.Complete(ctx, "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone, Result: json.RawMessage(`1`)}}, time.Time{})
	require.NoError(t, err)
	requireStatus(t, ctx, st, blocked, store.StatusBlocked) // the heal's retries are spent
	require.NoError(t, tx.Commit(ctx))

	rep, err := st.Reconcile(ctx, 0, time.Time{})
	require.NoError(t, err)
	require.LessOrEqual(t, rep.Promoted, 1, "promoted once, by the sweep or by the late heal before it")
	requireStatus(t, ctx, st, blocked, store.StatusReady)
}

// TestPromotionDoesNotWaitForASignal checks the other holder of a blocked
// row's lock: a signal being stored locks its instance FOR KEY SHARE (to
// serialize with a park), which the promotion's FOR NO KEY UPDATE does not
// wait for, so freeing the key neither waits for the signal nor skips the
// row.
func TestPromotionDoesNotWaitForASignal(t *testing.T) {
	st, pool := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	c, blocked := blockedBehindRunning(t, ctx, st)

	tx, err := pool.Begin(ctx) // a signal to the blocked row, in flight
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM instances WHERE id = $1 FOR KEY SHARE", blocked)
	require.NoError(t, err)
	_, err = st.Complete(ctx, "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone, Result: json.RawMessage(`1`)}}, time.Time{})
	require.NoError(t, err)
	requireStatus(t, ctx, st, blocked, store.StatusReady)
	require.NoError(t, tx.Commit(ctx))
}

func requireStatus(t *testing.T, ctx context.Context, st store.Store, id string, want store.Status) {
	t.Helper()
	in, err := st.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, want, in.Status)
}
