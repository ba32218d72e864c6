package postgres

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

// insertStranded inserts, straight into the table, n rows of each of keys
// K = 1 keys named prefix:0.., all blocked with nothing ready or executing
// (stranded: only the reconciler promotes them), after the row counts of
// each key, and done rows last changed an hour before now.
func insertStranded(t *testing.T, s *Store, prefix string, keys, n, done int) {
	t.Helper()
	ctx := context.Background()
	_, err := s.pool.Exec(ctx, `INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, created_at, updated_at)
		SELECT gen_random_uuid(), 'wf', 'q', 'blocked', 's', now(), r, $1 || ':' || k, now(), now()
		FROM generate_series(0, $2 - 1) k, generate_series(0, $3 - 1) r`, prefix, keys, n)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `INSERT INTO instances (id, workflow, queue, status, step, run_at, key, created_at, updated_at)
		SELECT gen_random_uuid(), 'wf', 'q', 'done', 's', now(), NULL, now() - interval '1 hour', now() - interval '1 hour'
		FROM generate_series(1, $1)`, done)
	require.NoError(t, err)
}

// TestReconcileHealsKeysInBoundedTransactions: the blocked keys are read
// and healed a page at a time, each page's K = 1 keys in a transaction of
// their own holding at most reconcileKeyChunk advisory locks; every key of
// every page is healed, also with thousands of stranded keys (in one
// transaction, one lock per key would overflow PostgreSQL's lock table:
// "out of shared memory"), and retention still runs.
func TestReconcileHealsKeysInBoundedTransactions(t *testing.T) {
	ctx := context.Background()
	t.Run("pages", func(t *testing.T) {
		s := newInternalStore(t)
		old := reconcileKeyChunk
		reconcileKeyChunk = 4
		defer func() { reconcileKeyChunk = old }()
		insertStranded(t, s, "acct", 11, 2, 0)
		rep, err := s.Reconcile(ctx, 0, time.Time{})
		require.NoError(t, err)
		require.Equal(t, 11, rep.Promoted, "one row of each key")
	})
	t.Run("12,000 keys", func(t *testing.T) {
		s := newInternalStore(t)
		insertStranded(t, s, "acct", 12_000, 1, 10)
		rep, err := s.Reconcile(ctx, time.Minute, time.Time{})
		require.NoError(t, err)
		require.Equal(t, 12_000, rep.Promoted)
		require.Equal(t, 10, rep.InstancesDeleted)
	})
}

// TestReconcileStepsFailOnTheirOwn: a sweep whose key healing and gate
// repair fail (here: the limits table is gone) still collects buckets and
// deletes what retention asks, and reports both the error and what it did.
func TestReconcileStepsFailOnTheirOwn(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	insertStranded(t, s, "acct", 3, 1, 25)
	_, err := s.pool.Exec(ctx, "ALTER TABLE limits RENAME TO limits_away")
	require.NoError(t, err)
	rep, err := s.Reconcile(ctx, time.Minute, time.Time{})
	require.ErrorContains(t, err, "reconcile: keys")
	require.ErrorContains(t, err, "reconcile: gates")
	require.Equal(t, 25, rep.InstancesDeleted, "retention ran")
	require.Zero(t, rep.Promoted)

	_, err = s.pool.Exec(ctx, "ALTER TABLE limits_away RENAME TO limits")
	require.NoError(t, err)
	rep, err = s.Reconcile(ctx, time.Minute, time.Time{})
	require.NoError(t, err)
	require.Equal(t, 3, rep.Promoted)
}

// TestBlockedKeysReadOneEntryPerKeyWithoutStatistics: the reconciler's read
// of the blocked keys, on a table never analyzed (a bulk insert before
// autoanalyze) with deep backlogs, skips through instances_key_blocked_posix one
// entry per key, with custom and generic plans: no sort but the page's
// own, no other index, and at most one row read per key it returns.
func TestBlockedKeysReadOneEntryPerKeyWithoutStatistics(t *testing.T) {
	s := newInternalStore(t)
	const keys, perKey, page = 300, 200, 100
	insertStranded(t, s, "acct", keys, perKey, 0)
	scan := regexp.MustCompile(`Index (?:Only )?Scan using (\w+) on instances .*rows=(\d+) loops=(\d+)`)
	for _, after := range []string{"", "acct:50"} {
		for _, mode := range []string{"auto", "force_generic_plan"} {
			plan := explainAnalyzed(t, s, mode, sqlBlockedKeys, []any{after, page}, "blocked keys")
			text := strings.Join(plan, "\n")
			for _, l := range plan {
				if strings.Contains(l, "Sort Key:") {
					require.Equal(t, "Sort Key: k.n", strings.TrimSpace(l), "%s (%q) sorts rows of the table:\n%s", mode, after, text)
				}
			}
			require.NotContains(t, text, "Seq Scan", "%s (%q):\n%s", mode, after, text)
			m := scan.FindAllStringSubmatch(text, -1)
			require.NotEmpty(t, m, "%s (%q):\n%s", mode, after, text)
			for _, sc := range m {
				require.Equal(t, "instances_key_blocked_posix", sc[1], "%s (%q):\n%s", mode, after, text)
				rows, _ := strconv.Atoi(sc[2])
				require.LessOrEqual(t, rows, 1, "%s (%q): a probe read more than the key's first entry:\n%s", mode, after, text)
			}
			if after == "" {
				require.Contains(t, text, fmt.Sprintf("rows=%d loops=1", page), "a page of keys:\n%s", text)
			}
		}
	}
}

// TestPolicyChangePromotesInBoundedTransactions: a policy change promotes
// the blocked rows of the queues it changed whose keys have room, reading
// the blocked keys a page at a time (each page's K = 1 keys locked in a
// transaction of their own), every page's, and leaves the blocked rows of
// other queues alone.
func TestPolicyChangePromotesInBoundedTransactions(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	old := reconcileKeyChunk
	reconcileKeyChunk = 4
	defer func() { reconcileKeyChunk = old }()
	insertStranded(t, s, "acct", 11, 2, 0) // queue q
	_, err := s.pool.Exec(ctx, `INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, created_at, updated_at)
		SELECT gen_random_uuid(), 'wf', 'other', 'blocked', 's', now(), 0, 'elsewhere:' || k, now(), now()
		FROM generate_series(0, 5) k`)
	require.NoError(t, err)
	_, err = s.SyncConcurrencyPolicies(ctx, "default", []store.ConcurrencyPolicy{{Queue: "q", MaxActive: 100}}, store.SyncOptions{})
	require.NoError(t, err)
	count := func(queue, status string) (n int) {
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM instances WHERE queue = $1 AND status = $2`, queue, status).Scan(&n))
		return n
	}
	require.Equal(t, 11, count("q", "ready"), "one row of each key of q")
	require.Equal(t, 11, count("q", "blocked"))
	require.Equal(t, 6, count("other", "blocked"), "another queue's rows stay blocked")
}
