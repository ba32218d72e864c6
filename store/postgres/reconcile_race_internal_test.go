package postgres

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// TestReconcileNeverOverwritesACounterItDidNotLock reproduces the
// over-credit the chaos run sampled ("has 2 free and 1 executing, capacity
// 2"): a gate key's counters do not exist when a reconciler sweep takes its
// locks (an idle key's counters are deleted); a claim then creates them and
// admits a row, the sweep reads the executing rows, a second claim debits
// the counter, and the sweep, computing the counter from its older read,
// overwrote the second debit. A sweep must only create a counter it did not
// lock, never overwrite it.
func TestReconcileNeverOverwritesACounterItDidNotLock(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	_, err := s.SyncLimits(ctx, []gate.Limit{{Name: "api", Limit: 2}, {Name: "aaa", Limit: 1}})
	require.NoError(t, err)
	var ids []string
	for range 2 {
		id := uuid.NewString()
		ids = append(ids, id)
		_, err := s.Insert(ctx, []store.NewInstance{{ID: id, Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`), Key: "api:k"}})
		require.NoError(t, err)
	}
	// A counter that sorts first, held by T0, stops the sweep's lock of
	// every counter after its snapshot was taken.
	_, err = s.pool.Exec(ctx, s.q(`INSERT INTO {schema}.key_slots VALUES ('aaa:blocker', 0, 1, 1)`))
	require.NoError(t, err)
	t0, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer t0.Rollback(ctx) //nolint:errcheck
	_, err = t0.Exec(ctx, s.q(`SELECT 1 FROM {schema}.key_slots WHERE key = 'aaa:blocker' FOR UPDATE`))
	require.NoError(t, err)

	swept := make(chan error, 1)
	go func() {
		_, err := s.Reconcile(ctx, 0, time.Time{})
		swept <- err
	}()
	require.Eventually(t, lockWaiting(s, "%{schema}.key_slots%FOR UPDATE%"), 10*time.Second, 5*time.Millisecond, "the sweep never waited for its locks")

	// The first claim creates the key's counter and admits one row.
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	second := ids[0]
	if res.Claimed[0].ID == second {
		second = ids[1]
	}

	// A second claim debits the counter and holds it, uncommitted, while
	// the sweep (released now) reads the executing rows and then reaches
	// the counter.
	t2, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer t2.Rollback(ctx) //nolint:errcheck
	_, err = t2.Exec(ctx, s.q(`UPDATE {schema}.key_slots SET available = available - 1 WHERE key = 'api:k' AND shard = 0`))
	require.NoError(t, err)
	_, err = t2.Exec(ctx, s.q(`UPDATE {schema}.instances SET status = 'executing', worker = 'w2', key_shard = 0,
		fence = nextval('{schema}.fence_seq'), lease_expires_at = now() + interval '1 minute', started_at = now()
		WHERE id = $1`), second)
	require.NoError(t, err)
	require.NoError(t, t0.Commit(ctx))
	// Give the sweep the time to read the executing rows (without the
	// second one: uncommitted) and to reach the counter the second claim
	// holds, if it writes it at all.
	require.Eventually(t, func() bool {
		if lockWaiting(s, "%INSERT INTO {schema}.key_slots%")() {
			return true
		}
		select {
		case err := <-swept:
			swept <- err
			return true
		default:
			return false
		}
	}, 10*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, t2.Commit(ctx))
	require.NoError(t, <-swept)

	var capacity, available, executing int
	require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT capacity, available FROM {schema}.key_slots WHERE key = 'api:k' AND shard = 0`)).Scan(&capacity, &available))
	require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT count(*) FROM {schema}.instances WHERE key = 'api:k' AND status = 'executing'`)).Scan(&executing))
	require.Equal(t, 2, executing)
	require.LessOrEqual(t, available+executing, capacity, "over-credit: %d free and %d executing, capacity %d", available, executing, capacity)
}

// TestReconcileWorksInChunksOfKeys: with chunks of two keys, a sweep
// repairs the counters of every key, and promotes the blocked rows of keys
// it found without counters, across chunk boundaries.
func TestReconcileWorksInChunksOfKeys(t *testing.T) {
	old := reconcileChunk
	reconcileChunk = 2
	defer func() { reconcileChunk = old }()
	ctx := context.Background()
	s := newInternalStore(t)
	_, err := s.SyncLimits(ctx, []gate.Limit{{Name: "api", Limit: 1}})
	require.NoError(t, err)
	keys := []string{"api:a", "api:b", "api:c", "api:d", "api:e"}
	for _, k := range keys {
		for range 2 {
			_, err := s.Insert(ctx, []store.NewInstance{{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`), Key: k}})
			require.NoError(t, err)
		}
	}
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 10, Lease: time.Millisecond})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 5, "one row per key; the other of each is blocked")
	time.Sleep(5 * time.Millisecond)
	n, err := s.Reap(ctx, time.Time{})
	require.NoError(t, err)
	require.Equal(t, 5, n, "reaped without credit: every counter owes a slot")

	rep, err := s.Reconcile(ctx, 0, time.Time{})
	require.NoError(t, err)
	require.Equal(t, 5, rep.CountersRepaired, "every key's counter, over three chunks")
	require.Equal(t, 5, rep.Drift)
	var free int
	require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT coalesce(sum(available), 0) FROM {schema}.key_slots`)).Scan(&free))
	require.Equal(t, 5, free)
	res, err = s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 20, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 5, "each key runs one row again")
}
