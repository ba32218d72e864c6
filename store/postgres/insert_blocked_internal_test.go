package postgres

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

func keyedInstance(k string) store.NewInstance {
	return store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`), Key: k}
}

// holdKey inserts a row of key k and claims it.
func holdKey(t *testing.T, s *Store, k string) store.Claimed {
	t.Helper()
	_, err := s.Insert(context.Background(), []store.NewInstance{keyedInstance(k)})
	require.NoError(t, err)
	return claimExactly(t, s, 1)[0]
}

// claimExactly claims up to 10 rows (claimN) and requires that the claim
// returned n.
func claimExactly(t *testing.T, s *Store, n int) []store.Claimed {
	t.Helper()
	cs := claimN(t, s, 10)
	require.Len(t, cs, n)
	return cs
}

// beginBlockedInsert inserts a row of key k, which must be busy, the way
// Insert does, in a transaction it leaves open: the insert of a blocked
// row whose commit is delayed.
func beginBlockedInsert(t *testing.T, s *Store, k string) (*insertPlan, func()) {
	t.Helper()
	ctx := context.Background()
	p, err := prepareInsert([]store.NewInstance{keyedInstance(k)})
	require.NoError(t, err)
	p.block = true
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	require.NoError(t, s.runInsert(ctx, tx, p))
	require.Equal(t, []string{k}, p.blocked, "the key is busy: its row goes in blocked")
	return p, func() { require.NoError(t, tx.Commit(ctx)) }
}

// TestInsertBlockedRacingTheHoldersEnd: an insert puts a row behind a busy
// K = 1 key, and the holder's outcome commits before the insert does. The
// outcome's promotion (under the key's advisory lock) cannot see the
// uncommitted row, so after both commits the key is free and its only
// waiting row blocked: a lost wakeup, until the reconciler's sweep. The
// heal Insert runs after its commit promotes it.
func TestInsertBlockedRacingTheHoldersEnd(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	holder := holdKey(t, s, "acct:1")
	p, commit := beginBlockedInsert(t, s, "acct:1")
	id := p.rows[0].in.ID

	res, err := s.Complete(ctx, "w", []store.Outcome{{ID: holder.ID, Fence: holder.Fence, Kind: store.OutcomeDone}}, time.Time{})
	require.NoError(t, err)
	require.False(t, res[0].Stale)
	commit()

	require.Equal(t, store.StatusBlocked, statusOf(t, s, id), "the race: the outcome promoted nothing")
	claimed, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Empty(t, claimed.Claimed)

	s.healInserted(ctx, p.blocked)
	require.Equal(t, store.StatusReady, statusOf(t, s, id))
	claimed, err = s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed.Claimed, 1)
	require.Equal(t, id, claimed.Claimed[0].ID)
}

// TestInsertBlockedHealWaitsForTheFreeingTransaction: the freeing
// transaction holds the key's advisory lock, has ended the holder and run
// its promotion (which found no blocked row: the insert had not committed)
// when the insert commits; the heal waits for the lock, and reads the key
// after the freeing committed, free.
func TestInsertBlockedHealWaitsForTheFreeingTransaction(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	holder := holdKey(t, s, "acct:1")
	p, commit := beginBlockedInsert(t, s, "acct:1")
	id := p.rows[0].in.ID

	free, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer free.Rollback(ctx) //nolint:errcheck
	var freePID int32
	require.NoError(t, free.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&freePID))
	_, err = free.Exec(ctx, s.q(sqlKeyLock), []string{"acct:1"}, s.keySalt)
	require.NoError(t, err)
	_, err = free.Exec(ctx, s.q(`UPDATE {schema}.instances SET status = 'done', worker = NULL, lease_expires_at = NULL
		WHERE id = $1 AND status = 'executing'`), holder.ID)
	require.NoError(t, err)
	rows, err := free.Query(ctx, s.q(sqlPromote), []string{"acct:1"}, []int32{1}, nil, []bool{true})
	require.NoError(t, err)
	promoted, err := scanPromoted(rows, new([]string), func(string) { t.Error("nothing to strand: the blocked row is not committed") }, nil)
	require.NoError(t, err)
	require.Zero(t, promoted)
	commit()

	healed := make(chan struct{})
	go func() {
		s.healInserted(ctx, p.blocked)
		close(healed)
	}()
	require.Eventually(t, func() bool {
		var n int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND $1::int = ANY (pg_blocking_pids(pid))`, freePID).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond, "the heal never waited for the key's lock")
	require.Equal(t, store.StatusBlocked, statusOf(t, s, id))
	require.NoError(t, free.Commit(ctx))
	<-healed
	require.Equal(t, store.StatusReady, statusOf(t, s, id))
}

// TestInsertTxInsertsReadyBehindABusyKey: InsertTx cannot heal after the
// caller's commit, so it inserts the rows ready; a claim that finds their
// key busy leaves one alone ready (see admission.Decide) and blocks two.
func TestInsertTxInsertsReadyBehindABusyKey(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	holdKey(t, s, "acct:1")
	insertTx := func(n int) []string {
		tx, err := s.pool.Begin(ctx)
		require.NoError(t, err)
		var ins []store.NewInstance
		var ids []string
		for range n {
			in := keyedInstance("acct:1")
			in.Version = 1
			ins, ids = append(ins, in), append(ids, in.ID)
		}
		_, err = s.InsertTx(ctx, tx, ins)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		for _, id := range ids {
			require.Equal(t, store.StatusReady, statusOf(t, s, id))
		}
		return ids
	}
	claim := func() {
		res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 10, Lease: time.Minute})
		require.NoError(t, err)
		require.Empty(t, res.Claimed)
	}
	one := insertTx(1)
	claim()
	require.Equal(t, store.StatusReady, statusOf(t, s, one[0]))
	two := insertTx(1)
	claim()
	for _, id := range append(one, two...) {
		require.Equal(t, store.StatusBlocked, statusOf(t, s, id))
	}
}
