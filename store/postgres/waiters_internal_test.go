package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
)

// The waiters mark (migration 013): an outcome frees a K = 1 key the full
// way (advisory lock, promotion) only when its row was marked as having
// rows waiting on it; whatever leaves a row waiting marks the holder first,
// or does not leave it waiting.

func waitersOf(t *testing.T, s *Store, id string) bool {
	t.Helper()
	var w bool
	require.NoError(t, s.pool.QueryRow(context.Background(), s.q(`SELECT waiters FROM {schema}.instances WHERE id = $1`), id).Scan(&w))
	return w
}

func completeDone(t *testing.T, s *Store, c store.Claimed) {
	t.Helper()
	res, err := s.Complete(context.Background(), "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone}}, time.Time{})
	require.NoError(t, err)
	require.False(t, res[0].Stale)
}

// lockRow holds row id locked FOR UPDATE in a transaction of its own, as
// an outcome being applied does, until the returned function ends it
// (commit, after running end's statements in it).
func lockRow(t *testing.T, s *Store, id string) (pgx.Tx, func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, s.q(`SELECT 1 FROM {schema}.instances WHERE id = $1 FOR UPDATE`), id)
	require.NoError(t, err)
	return tx, func() { require.NoError(t, tx.Commit(ctx)) }
}

// TestOutcomeSkipsTheFreeingOfAnUnwaitedKey: a holder no one marked ends
// without the key's freeing, so a blocked row put behind it without a
// heal (what the heal exists for) stays blocked; the heal then promotes
// it. Marked by the heal while it still runs, its end promotes the row.
func TestOutcomeSkipsTheFreeingOfAnUnwaitedKey(t *testing.T) {
	ctx := context.Background()
	t.Run("unmarked", func(t *testing.T) {
		s := newInternalStore(t)
		holder := holdKey(t, s, "acct:1")
		require.False(t, waitersOf(t, s, holder.ID), "nothing waits on the key when it is claimed")
		p, commit := beginBlockedInsert(t, s, "acct:1")
		commit()
		completeDone(t, s, holder)
		id := p.rows[0].in.ID
		require.Equal(t, store.StatusBlocked, statusOf(t, s, id), "the outcome skipped the freeing")
		s.healInserted(ctx, p.blocked)
		require.Equal(t, store.StatusReady, statusOf(t, s, id))
	})
	t.Run("marked by the heal", func(t *testing.T) {
		s := newInternalStore(t)
		holder := holdKey(t, s, "acct:1")
		p, commit := beginBlockedInsert(t, s, "acct:1")
		commit()
		s.healInserted(ctx, p.blocked)
		id := p.rows[0].in.ID
		require.Equal(t, store.StatusBlocked, statusOf(t, s, id), "the key is busy")
		require.True(t, waitersOf(t, s, holder.ID))
		completeDone(t, s, holder)
		require.Equal(t, store.StatusReady, statusOf(t, s, id))
	})
}

// TestClaimBlocksOnlyBehindAMarkedHolder: a claim that finds a K = 1 key
// busy with several rows in its window marks the holder before it blocks
// them; when the holder is locked (its outcome being applied, which reads
// the mark), it cannot mark it and leaves the rows ready. Once marked,
// the holder's end promotes the first blocked row.
func TestClaimBlocksOnlyBehindAMarkedHolder(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	holder := holdKey(t, s, "acct:1")
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	var ids []string
	var ins []store.NewInstance
	for range 3 {
		in := keyedInstance("acct:1")
		in.Version = 1
		ins, ids = append(ins, in), append(ids, in.ID)
	}
	_, err = s.InsertTx(ctx, tx, ins) // ready, whatever the key: no heal after the caller's commit
	if err != nil {
		_ = tx.Rollback(ctx)
	}
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	_, unlock := lockRow(t, s, holder.ID)
	claimExactly(t, s, 0)
	for _, id := range ids {
		require.Equal(t, store.StatusReady, statusOf(t, s, id), "the holder could not be marked: nothing is blocked")
	}
	require.False(t, waitersOf(t, s, holder.ID))
	unlock()

	claimExactly(t, s, 0)
	require.True(t, waitersOf(t, s, holder.ID))
	blocked := 0
	for _, id := range ids {
		if statusOf(t, s, id) == store.StatusBlocked {
			blocked++
		}
	}
	require.Equal(t, len(ids), blocked, "marked: the window's rows and the backlog are blocked")
	completeDone(t, s, holder)
	require.Equal(t, store.StatusReady, statusOf(t, s, ids[0]), "the marked holder's end promotes the first")
	require.Equal(t, store.StatusBlocked, statusOf(t, s, ids[1]))
}

// TestClaimMarksWhenItTakesAKeyWithBlockedRows: a row that takes a K = 1
// key that has blocked rows is marked at its claim, so that its end
// promotes the next; a key with none is not.
func TestClaimMarksWhenItTakesAKeyWithBlockedRows(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	holder := holdKey(t, s, "acct:1")
	p, commit := beginBlockedInsert(t, s, "acct:1")
	commit()
	s.healInserted(ctx, p.blocked)
	// A ready row of the key, ahead of the blocked one: claimed once the
	// holder ends, it takes the key with a blocked row behind it.
	_, err := s.pool.Exec(ctx, s.q(`UPDATE {schema}.instances SET status = 'ready' WHERE id = $1`), p.rows[0].in.ID)
	require.NoError(t, err)
	second, commit2 := beginBlockedInsert(t, s, "acct:1")
	commit2()
	s.healInserted(ctx, second.blocked)
	completeDone(t, s, holder)
	next := claimExactly(t, s, 1)[0]
	require.Equal(t, p.rows[0].in.ID, next.ID)
	require.True(t, waitersOf(t, s, next.ID), "a blocked row waits behind it")
	completeDone(t, s, next)
	require.Equal(t, store.StatusReady, statusOf(t, s, second.rows[0].in.ID))

	last := claimExactly(t, s, 1)[0]
	require.False(t, waitersOf(t, s, last.ID), "nothing waits behind the last row")
}

// blockedBehindLockedHolder holds key acct:1 by an executing row, commits
// an insert that puts a row (id) blocked behind it (p, whose blocked keys
// are for its heal), and locks the holder's row in a transaction of its
// own, as the holder's outcome does while it commits. finish ends the
// holder (done) in that transaction and commits it.
func blockedBehindLockedHolder(t *testing.T, s *Store) (p *insertPlan, id string, finish func()) {
	t.Helper()
	holder := holdKey(t, s, "acct:1")
	p, commit := beginBlockedInsert(t, s, "acct:1")
	commit()
	tx, end := lockRow(t, s, holder.ID)
	return p, p.rows[0].in.ID, func() {
		t.Helper()
		_, err := tx.Exec(context.Background(), s.q(`UPDATE {schema}.instances SET status = 'done', worker = NULL,
			lease_expires_at = NULL WHERE id = $1 AND status = 'executing'`), holder.ID)
		require.NoError(t, err)
		end()
	}
}

// TestHealRetriesAHolderItCouldNotMark: the heal of an insert that put a
// row behind a busy key finds the holder locked by its outcome (which
// read no mark, and so frees the key without promoting). It counts the key
// as stranded and tries again once that outcome committed, then finds the
// key free and promotes the row.
func TestHealRetriesAHolderItCouldNotMark(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	p, id, finish := blockedBehindLockedHolder(t, s)
	healed := make(chan struct{})
	go func() {
		s.healInserted(ctx, p.blocked)
		close(healed)
	}()
	// The heal's first attempts meet the lock; it keeps trying for about
	// a quarter of a second (healAttempts), well past the commit below.
	time.Sleep(5 * time.Millisecond)
	require.Equal(t, store.StatusBlocked, statusOf(t, s, id))
	finish()
	<-healed
	require.Equal(t, store.StatusReady, statusOf(t, s, id), "a later attempt found the key free")
}

// TestWaitedKeys: the K = 1 keys a claim marks the holders of are those
// it blocks rows of, and those it passes a row of over while the key is
// held (busy in the window, or taken by the claim itself; for a row of
// several keys, the key in its key column read busy by admit); not those
// it passes over for want of room, nor gate keys, nor rows it reserves or
// reschedules.
func TestWaitedKeys(t *testing.T) {
	g := &gate.Limit{Name: "api", Limit: 2, Shards: 1}
	cc := &claimContext{busyOne: map[string]bool{"acct:busy": true}, candidates: []admission.Candidate{
		{ID: "1", Key: "acct:taken"}, {ID: "2", Key: "acct:taken"}, // admitted, then left behind it
		{ID: "3", Key: "acct:blocked"},   // blocked
		{ID: "4", Key: "acct:busy"},      // left ready: busy
		{ID: "5", Key: "acct:room"},      // left ready: the claim was full
		{ID: "6", Key: "api:x", Gate: g}, // a gate's row, blocked
		{ID: "7", Key: "acct:reserved"}, {ID: "8", Key: "acct:reserved"},
		{ID: "9", Key: ""},
	}}
	plan := admission.Plan{
		Admitted: []admission.Admitted{{ID: "1", Shard: -1}, {ID: "7", Shard: -1}},
		Blocked:  []string{"3", "6"},
		Reserved: []admission.Reservation{{ID: "8", After: "7"}},
	}
	require.Equal(t, []string{"acct:blocked", "acct:busy", "acct:taken"}, waitedKeys(cc, plan))
	require.Equal(t, []string{}, waitedKeys(&claimContext{}, admission.Plan{}), "never nil: a statement argument")
	gated := &claimContext{candidates: []admission.Candidate{{ID: "6", Key: "api:x", Gate: g}}}
	require.Equal(t, []string{}, waitedKeys(gated, admission.Plan{Blocked: []string{"6"}}), "a gate's blocked row marks nothing")

	// Rows of several keys: one left ready as the only row in sight of the
	// busy K = 1 key in its key column marks that key's holder (admit read
	// it busy, under its lock); one left ready for want of room does not.
	also := []admission.Need{{Key: "api:y", Gate: g}}
	multi := &claimContext{busyLocked: map[string]bool{"acct:m": true}, candidates: []admission.Candidate{
		{ID: "m1", Key: "acct:m", Also: also},    // left ready: acct:m busy
		{ID: "m2", Key: "acct:free", Also: also}, // left ready: the claim was full
	}}
	require.Equal(t, []string{"acct:m"}, waitedKeys(multi, admission.Plan{}))
}

// TestHealHandsAKeyItGaveUpOnToTheLateHeal: when the holder stays locked
// past the heal's attempts (a busy server), the insert's heal returns with
// the key still stranded, and the store's late heal promotes the row soon
// after the holder's outcome commits, without a reconciler's sweep.
func TestHealHandsAKeyItGaveUpOnToTheLateHeal(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	p, id, finish := blockedBehindLockedHolder(t, s)
	s.healInserted(ctx, p.blocked) // every attempt meets the lock
	require.Equal(t, store.StatusBlocked, statusOf(t, s, id), "the heal gave up")
	finish()
	require.Eventually(t, func() bool { return statusOf(t, s, id) == store.StatusReady }, 5*time.Second, 20*time.Millisecond,
		"the late heal promotes the row once the key is free")
	require.Eventually(t, func() bool {
		s.late.mu.Lock()
		defer s.late.mu.Unlock()
		return !s.late.running && len(s.late.keys) == 0
	}, 5*time.Second, 20*time.Millisecond, "the late heal ends when no key is left")
}
