package postgres

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// newInternalStore is a store on a fresh migrated schema, for tests that
// drive its statements by hand.
func newInternalStore(t *testing.T) *Store {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	_, err := Migrate(ctx, pool, pgtest.SchemaOf(pool))
	require.NoError(t, err)
	s, err := New(ctx, pool, Options{Schema: pgtest.SchemaOf(pool)})
	require.NoError(t, err)
	return s
}

// lockWaiting reports, for require.Eventually, whether a statement of s
// waits for a lock: one whose text matches like, a LIKE pattern written
// with {schema} for s's schema, as statements are. Matching the schema
// keeps another test's waits on the same server from passing for this
// one's.
func lockWaiting(s *Store, like string) func() bool {
	pattern := render(like, s.schema)
	return func() bool {
		var n int
		err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE $1`, pattern).Scan(&n)
		return err == nil && n > 0
	}
}

func claimOne(t *testing.T, s *Store) store.Claimed {
	t.Helper()
	ctx := context.Background()
	in := store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`)}
	_, err := s.Insert(ctx, []store.NewInstance{in})
	require.NoError(t, err)
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	return res.Claimed[0]
}

func statusOf(t *testing.T, s *Store, id string) store.Status {
	t.Helper()
	in, err := s.Get(context.Background(), id)
	require.NoError(t, err)
	return in.Status
}

// A signal stored but not yet committed holds the instance's row lock: a
// park must wait for it, and its inbox re-check then sees the signal.
func TestParkWaitsForAnUncommittedSignal(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	c := claimOne(t, s)

	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, s.q(sqlSignalStore), c.ID, "go", nil, "", nil)
	require.NoError(t, err)

	parked := make(chan error, 1)
	go func() {
		_, err := s.Complete(ctx, "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeAwait,
			AwaitSignal: "go", Step: "after"}}, time.Time{})
		parked <- err
	}()
	select {
	case err := <-parked:
		t.Fatalf("the park committed while a signal to its row was in flight (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	_, err = tx.Exec(ctx, s.q(sqlSignalWake), c.ID, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	select {
	case err := <-parked:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the park never finished after the signal committed")
	}
	require.Equal(t, store.StatusReady, statusOf(t, s, c.ID), "the park's re-check found the signal")
}

// A park in flight (row locked, status awaiting, not committed) makes a
// signal wait; once the park commits the signal's wake sees it.
func TestSignalWaitsForAnUncommittedPark(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	c := claimOne(t, s)

	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// What the apply statement of Complete does to the row.
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+pgx.Identifier{s.schema}.Sanitize()+`.instances WHERE id = $1 FOR UPDATE`, c.ID)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE `+pgx.Identifier{s.schema}.Sanitize()+`.instances
		SET status = 'awaiting', await_signal = 'go', worker = NULL, lease_expires_at = NULL WHERE id = $1`, c.ID)
	require.NoError(t, err)

	sent := make(chan store.SignalResult, 1)
	go func() {
		res, err := s.Signal(ctx, store.SignalRequest{InstanceID: c.ID, Name: "go"})
		if err != nil {
			t.Error(err)
		}
		sent <- res
	}()
	select {
	case res := <-sent:
		t.Fatalf("the signal committed while a park of its row was in flight (%+v)", res)
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	select {
	case res := <-sent:
		require.Equal(t, store.SignalResult{Woke: true}, res)
	case <-time.After(30 * time.Second):
		t.Fatal("the signal never finished after the park committed")
	}
	require.Equal(t, store.StatusReady, statusOf(t, s, c.ID))
}

// A signal in flight to a blocked row must not make the promotion skip it:
// the holder's outcome promotes the blocked row while the signal's
// transaction still holds its lock on that row.
func TestPromotionDoesNotSkipARowBeingSignalled(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	mk := func() store.NewInstance {
		return store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s",
			State: json.RawMessage(`{}`), Key: "acct:1"}
	}
	holder, waiter := mk(), mk()
	for _, in := range []store.NewInstance{holder, waiter} {
		_, err := s.Insert(ctx, []store.NewInstance{in})
		require.NoError(t, err)
	}
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 10})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.Equal(t, store.StatusBlocked, statusOf(t, s, waiter.ID))

	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, s.q(sqlSignalStore), waiter.ID, "go", nil, "", nil)
	require.NoError(t, err)

	c := res.Claimed[0]
	done := make(chan error, 1)
	go func() {
		_, err := s.Complete(ctx, "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone}}, time.Time{})
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the outcome waits for the signal's transaction")
	}
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, store.StatusReady, statusOf(t, s, waiter.ID), "the blocked row was skipped: its key is free and nobody will promote it")
}

// TestCheckClaimsWaitsForNoRowLock: CheckClaims answers while another
// transaction holds the claimed row's lock (a flush applying its outcome),
// where a heartbeat, which renews the lease, waits for that transaction to
// end: an engine that starts listening checks its claims beside its
// flushes, not behind them.
func TestCheckClaimsWaitsForNoRowLock(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	c := claimOne(t, s)
	refs := []store.ClaimRef{{ID: c.ID, Fence: c.Fence}}
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, s.q(`SELECT 1 FROM {schema}.instances WHERE id = $1 FOR UPDATE`), c.ID)
	require.NoError(t, err)

	quick, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := s.CheckClaims(quick, "w", refs)
	require.NoError(t, err, "the check waited for the row lock")
	require.Empty(t, res.Lost)
	require.Empty(t, res.Canceled)

	short, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	_, err = s.Heartbeat(short, "w", refs, time.Minute, time.Time{})
	require.Error(t, err, "a heartbeat renews the row, so it waits for the lock: this test would not tell the two apart")
}
