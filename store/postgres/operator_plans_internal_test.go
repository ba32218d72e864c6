package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/stretchr/testify/require"
)

// operatorTable fills s's schema, straight through SQL, with about
// 1,000,000 instances shaped like a production table under retention:
// mostly terminal rows (with history), and live ones of every status, of
// keyless, K = 1 and gated keys (a gate "api" of 10), some K = 1 keys with
// a blocked backlog, and rows of several keys, ended and blocked. It
// returns the id of a failed row (with history and children) and of an
// awaiting one.
func operatorTable(t *testing.T, s *Store) (failed, awaiting string) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO limits (name, "limit", shards) VALUES ('api', 10, 1)`,
		`INSERT INTO rate_limits (name, namespace, "limit", period_us, burst, per_key) VALUES ('api', 'default', 10, 1000000, 10, true)`,
		`INSERT INTO queue_policies (queue, namespace, max_active, max_active_per_key) VALUES ('q', 'default', 100, 2)`,
		// Terminal rows, a day old.
		`INSERT INTO instances (id, workflow, queue, status, step, run_at, key, created_at, updated_at)
		 SELECT gen_random_uuid(), 'wf', 'q', CASE WHEN i % 50 = 0 THEN 'failed' ELSE 'done' END, 's',
		        now() - interval '1 day', CASE WHEN i % 2 = 0 THEN 'acct:' || (i % 100000) END,
		        now() - interval '1 day', now() - interval '1 day'
		 FROM generate_series(1, 900000) i`,
		// Ready: keyless, and K = 1 keys with up to 3 ready rows each.
		`INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, created_at, updated_at)
		 SELECT gen_random_uuid(), CASE WHEN i % 4 = 0 THEN 'next' ELSE 'wf' END, 'q', 'ready', 's', now(), i / 3000,
		        CASE WHEN i % 2 = 0 THEN 'acct:' || (i % 20000) END, now(), now()
		 FROM generate_series(1, 60000) i`,
		// Blocked backlogs of K = 1 keys and of gate keys.
		`INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, created_at, updated_at)
		 SELECT gen_random_uuid(), 'wf', 'q', 'blocked', 's', now(), 100 + i / 1000,
		        CASE WHEN i % 3 = 0 THEN 'api:' || (i % 100) ELSE 'acct:' || (i % 2000) END, now(), now()
		 FROM generate_series(1, 30000) i`,
		// Executing: K = 1 holders, gate holders, keyless.
		`INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, key_shard, worker, lease_expires_at,
		                        started_at, created_at, updated_at)
		 SELECT gen_random_uuid(), 'wf', 'q', 'executing', 's', now(), 0,
		        CASE WHEN i % 3 = 0 THEN 'api:' || (i % 100) WHEN i % 3 = 1 THEN 'acct:' || i END,
		        CASE WHEN i % 3 = 0 THEN 0 END, 'w' || (i % 16), now() + interval '1 minute', now(), now(), now()
		 FROM generate_series(1, 900) i`,
		`INSERT INTO key_slots (key, shard, capacity, available)
		 SELECT 'api:' || k, 0, 10, 7 FROM generate_series(0, 99) k`,
		// Delayed, and parked with timeouts.
		`INSERT INTO instances (id, workflow, queue, status, step, run_at, key, created_at, updated_at)
		 SELECT gen_random_uuid(), 'wf', 'q', 'scheduled', 's', now() + interval '1 hour',
		        CASE WHEN i % 2 = 0 THEN 'acct:' || i END, now(), now()
		 FROM generate_series(1, 5000) i`,
		`INSERT INTO instances (id, workflow, queue, status, step, run_at, await_signal, timeout_at, created_at, updated_at)
		 SELECT gen_random_uuid(), 'wf', 'q', 'awaiting', 's', now(), 'go', now() + interval '1 hour', now(), now()
		 FROM generate_series(1, 5000) i`,
		// Rows of several keys (an account and a gate key): ended ones, a
		// day old, and blocked ones in the gate's line.
		`INSERT INTO instances (id, workflow, queue, status, step, run_at, key, created_at, updated_at, extra_keys, extra_intents)
		 SELECT gen_random_uuid(), 'wf', 'q', 'done', 's', now() - interval '1 day', 'acct:' || (i % 5000),
		        now() - interval '1 day', now() - interval '1 day', ARRAY['api:' || (i % 100)], ARRAY['']
		 FROM generate_series(1, 100000) i`,
		`INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, created_at, updated_at, extra_keys, extra_intents)
		 SELECT gen_random_uuid(), 'wf', 'q', 'blocked', 's', now(), 200 + i / 1000, 'api:' || (i % 100), now(), now(),
		        ARRAY['acct:' || (i % 5000)], ARRAY['']
		 FROM generate_series(1, 2000) i`,
		// History of the failed rows.
		`INSERT INTO history (instance_id, step, attempt, started_at, finished_at, outcome)
		 SELECT id, 's', a, now(), now(), 'error' FROM instances, generate_series(0, 2) a WHERE status = 'failed'`,
	} {
		_, err := s.pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT id::text FROM instances WHERE status = 'failed' LIMIT 1`).Scan(&failed))
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT id::text FROM instances WHERE status = 'awaiting' LIMIT 1`).Scan(&awaiting))
	_, err := s.pool.Exec(ctx, `UPDATE instances SET parent_id = $1 WHERE id IN (SELECT id FROM instances WHERE status = 'done' LIMIT 3)`, failed)
	require.NoError(t, err)
	return failed, awaiting
}

// TestOperatorPlansUseIndexes is the plan guard of the statements off the
// hot path: maintenance (timers, reaper, reconciler, retention), limit
// changes, health, the ui's and the CLI's reads and actions. On a table of
// about 1,000,000 rows, never analyzed (a bulk load before autoanalyze)
// and analyzed, with custom and generic plans, none of them may read
// instances or history sequentially: each reads through an index, however
// many terminal rows the table holds. TestHotPathPlansUseIndexes guards the
// claim's and the outcomes' statements; TestClaimReadsNoBacklogItCannotRun
// the claim's window.
func TestOperatorPlansUseIndexes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a table of 1,000,000 rows")
	}
	ctx := context.Background()
	s := newInternalStore(t)
	failed, awaiting := operatorTable(t, s)
	keys, one := []string{"acct:1", "api:1"}, []bool{true, false}
	now := time.Now()
	statements := []struct {
		name string
		sql  string
		args []any
	}{
		// Maintenance.
		{"fire timers", sqlFireTimers, []any{nil, 1000, "c"}},
		{"reap", sqlReap, []any{nil, 1000}},
		{"reclaim worker", sqlReclaimWorker, []any{nil, "w1"}},
		{"reconcile: gate holders", sqlGateHolders, []any{"", nil}},
		{"reconcile: slots delete idle", sqlSlotsDeleteIdle, []any{keys}},
		{"reconcile: blocked keys", sqlBlockedKeys, []any{"", reconcileKeyChunk}},
		{"reconcile: promote if room", sqlPromoteIfRoom, []any{keys, 1, nil, "c", true}},
		{"reconcile: promote", sqlPromote, []any{keys, []int32{1, 1}, nil, one}},
		{"stranded", sqlStranded, []any{keys, one}},
		{"retention", sqlDeleteTerminal, []any{now.Add(-time.Hour), sweepChunk, now.Add(-2 * time.Hour)}},
		{"retention of a workflow", sqlDeleteTerminalOf, []any{"wf", now.Add(-time.Hour), 1000, now.Add(-2 * time.Hour)}},
		// Limits and policies.
		{"limits: live by name", sqlLiveByName, []any{[]string{"api", "acct"}, gate.LiveCountCap}},
		{"limits: live by key", sqlLiveByKey, []any{[]string{"api:1", "acct:1"}, []string{"api", "acct"}, gate.LiveCountCap}},
		{"limits: keys with counters of names and keys", sqlSlotKeysOfNames, []any{[]string{"api", "acct:1"}}},
		{"limits: counters of keys", sqlSlotsOfKeys, []any{[]string{"api:1", "acct:1"}}},
		{"limits: free counters of keys", sqlSlotsOfKeysFree, []any{[]string{"api:1", "acct:1"}}},
		{"key info: limit of a key", sqlLimitOf, []any{"acct:1"}},
		{"policies: blocked keys of queues", sqlBlockedKeysIn, []any{[]string{"q"}, "", reconcileKeyChunk}},
		{"schedules: instance running", sqlInstanceRunning, []any{failed}},
		// Health.
		{"health: ready", sqlHealthReady, []any{nil}},
		{"health: handed back oldest", sqlHealthHandedBackOldest, nil},
		{"health: handed back", sqlHealthHandedBack, []any{1000}},
		{"health: statuses", sqlHealthStatuses, nil},
		{"health: failed", sqlHealthFailed, []any{1000}},
		{"health: blocked by name", sqlHealthBlockedByName, nil},
		{"health: gates", sqlHealthGates, nil},
		{"health: policy keys", sqlHealthPolicyKeys, []any{nil, 1000}},
		{"health: intents", sqlHealthIntents, []any{1000}},
		// The ui's and the CLI's reads.
		{"get", sqlGet, []any{failed}},
		{"list newest", sqlListNewest, []any{"", []string{}, "", "", nil, 51}},
		{"list newest by status", sqlListScanNewest, []any{"", []string{"failed"}, "", "", nil, 51, 10_000}},
		{"list by key", sqlListScan, []any{"", []string{}, "acct:1", "", nil, 51, 10_000}},
		{"children", sqlChildren, []any{failed}},
		{"history", sqlHistory, []any{failed}},
		{"inbox", sqlInbox, []any{awaiting, 100}},
		{"key holders", sqlKeyHolders, []any{"api:1", 100}},
		{"key waiting", sqlKeyWaiting, []any{"acct:1"}},
		{"key next", sqlKeyNext, []any{"acct:1"}},
		{"key oldest", sqlKeyOldest, []any{"acct:1"}},
		// The CLI's actions.
		{"cancel lock", sqlCancelLock, []any{awaiting}},
		{"cancel", sqlCancel, []any{awaiting, nil}},
		{"status of", sqlStatusOf, []any{failed}},
		{"retry", sqlRetry, []any{failed, nil, "c"}},
		{"signal store", sqlSignalStore, []any{awaiting, "go", "{}", "", nil}},
		{"signal wake", sqlSignalWake, []any{awaiting, nil}},
	}
	check := func(label string) {
		for _, st := range statements {
			for _, mode := range []string{"auto", "force_generic_plan"} {
				plan := explainPrepared(t, s, mode, false, st.sql, st.args, st.name)
				text := strings.Join(plan, "\n")
				for _, table := range []string{"instances", "history"} {
					require.NotContains(t, text, "Seq Scan on "+table, "%s, %s (%s) reads %s whole:\n%s", st.name, label, mode, table, text)
				}
			}
		}
	}
	check("never analyzed")
	_, err := s.pool.Exec(ctx, "ANALYZE "+s.schema+".instances, "+s.schema+".history")
	require.NoError(t, err)
	check("analyzed")
}

// TestKeyWaitingElsewhereReadsLiveRowsOnly: the count of rows that carry a
// key among their other keys and wait in another key's line (KeyInfo's
// WaitingElsewhere, which `durable explain` and the ui's key page show)
// reads the live rows that carry the key, not instances_extra_keys, which
// holds every row that ever carried the key: with 20,000 ended rows of
// the key beside three waiting ones, custom and generic plans, analyzed,
// use instances_live_extra_keys alone, and the count is the three.
func TestKeyWaitingElsewhereReadsLiveRowsOnly(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	for _, q := range []string{
		`INSERT INTO instances (id, workflow, queue, status, step, run_at, key, created_at, updated_at, extra_keys, extra_intents)
		 SELECT gen_random_uuid(), 'wf', 'q', 'done', 's', now(), 'acct:' || (i % 500), now(), now(),
		        ARRAY['api:' || (i % 4)], ARRAY['']
		 FROM generate_series(1, 80000) i`,
		`INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, created_at, updated_at, extra_keys, extra_intents)
		 SELECT gen_random_uuid(), 'wf', 'q', 'blocked', 's', now(), 1, 'acct:' || i, now(), now(), ARRAY['api:3'], ARRAY['']
		 FROM generate_series(1, 3) i`,
		`ANALYZE instances`,
	} {
		_, err := s.pool.Exec(ctx, s.q(q))
		require.NoError(t, err, q)
	}
	for _, mode := range []string{"auto", "force_generic_plan"} {
		plan := strings.Join(explainPrepared(t, s, mode, false, sqlKeyWaiting, []any{"api:3"}, "key waiting"), "\n")
		require.Contains(t, plan, "instances_live_extra_keys", "%s:\n%s", mode, plan)
		require.NotContains(t, plan, "instances_extra_keys", "%s: the read of ended rows is back:\n%s", mode, plan)
	}
	info, err := s.KeyInfo(ctx, "api:3")
	require.NoError(t, err)
	require.Equal(t, 3, info.WaitingElsewhere)
}
