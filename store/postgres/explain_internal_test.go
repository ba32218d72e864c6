package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestHotPathPlansUseIndexes guards the plans of the hot statements: on a
// table of 5,000 rows (small enough that a missing index path shows as a
// sequential scan) none of them may scan the whole instances table,
// with custom plans or with the generic plans PostgreSQL switches prepared
// statements to. Statements that run in the store's batch transactions are
// explained under the setting those transactions carry (sqlNoSeqScan); the
// others (heartbeat and the signal's implicit transaction) as they run.
// insertKeyState is the K = 1 busy check and the ready count (cap $2) of
// keys $1, as sqlInsert and sqlInsertRounds write them (see sql.go), for
// plans of those probes alone.
const insertKeyState = `
SELECT k,
       ((SELECT true FROM {schema}.instances e
         WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
         LIMIT 1) IS NOT NULL),
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances r WHERE r.key = k AND r.status = 'ready' COLLATE "POSIX"
                              ORDER BY r.priority, r.run_at, r.seq LIMIT $2) r)
FROM unnest($1::text[]) AS k`

func TestHotPathPlansUseIndexes(t *testing.T) {
	t.Run("analyzed", func(t *testing.T) { checkHotPathPlans(t, true, 32) })
	// A table PostgreSQL has no statistics of yet (a fresh schema, before
	// autovacuum's first ANALYZE; autovacuum off), claimed 100 rows at a
	// time: the claim's update read every ready row of the primary key
	// into a hash (about 4 ms a claim at 5,000 rows in the peers' keyed
	// run) until it probed the batch's ids (see sqlClaim).
	t.Run("never analyzed", func(t *testing.T) { checkHotPathPlans(t, false, 100) })
}

// checkHotPathPlans explains the hot statements (in both plan cache modes)
// on a store of 5,000 rows, analyzed or not, with batches of n ids.
func checkHotPathPlans(t *testing.T, analyze bool, n int) {
	ctx := context.Background()
	s := newInternalStore(t)
	ins := make([]store.NewInstance, 5_000)
	for i := range ins {
		key := ""
		if i%2 == 0 {
			key = "acct:" + uuid.NewString()[:8] // about one row per key
		}
		ins[i] = store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`), Key: key}
	}
	_, err := s.Insert(ctx, ins)
	require.NoError(t, err)
	if analyze {
		_, err = s.pool.Exec(ctx, "ANALYZE "+s.schema+".instances")
		require.NoError(t, err)
	}

	ids := make([]string, n)
	fences := make([]int64, n)
	shards := make([]int32, n)
	for i := range ids {
		ids[i], shards[i] = ins[i].ID, -1
	}
	outcome := store.Outcome{ID: ids[0], Kind: store.OutcomeDone}
	complete := s.completeArgs("w", []store.Outcome{outcome}, time.Time{}, outcomeChains{})
	several, err := prepareInsert([]store.NewInstance{{ID: uuid.NewString(), Workflow: "wf", Version: 1, Queue: "q", Step: "s",
		State: json.RawMessage(`{}`), Key: "acct:abcd", Also: []store.KeyRef{{Key: "api:x", Intent: gate.GateIntent}}}})
	require.NoError(t, err)
	// Statements that do not run in a batchTx, and so without sqlNoSeqScan.
	outsideBatch := map[string]bool{"heartbeat": true, "check claims": true, "signal wake": true,
		"key waiting": true, "key next": true, "key oldest": true, "inbox": true, "insert busy keys": true}
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{
		"promote scheduled":                {sqlPromoteScheduled, []any{"q", nil, 1000}},
		"fire queue timers":                {sqlFireQueueTimers, []any{"q", nil, 1000}},
		"candidates":                       {sqlClaimCandidates, []any{"q", nil, []string{}, 64, 32, int64(1), []int32{}}},
		"candidates of workflows":          {sqlClaimCandidates, []any{"q", nil, []string{"wf", "other"}, 64, 32, int64(1), []int32{1, 1}}},
		"key busy":                         {sqlKeyBusy, []any{[]string{"acct:abcd"}}},
		"next due":                         {sqlNextDue, []any{"q"}},
		"claim":                            {sqlClaim, []any{ids, "w", int64(60e6), shards, nil, nil, nil, nil}},
		"claim reserve":                    {sqlClaimReserve, []any{ids, "w", int64(60e6), nil, ids}},
		"join parents":                     {sqlJoinParents, []any{ids, make([]int32, len(ids)), nil, "c", make([]int32, len(ids))}},
		"set pending":                      {sqlSetPending, []any{ids, make([]int32, len(ids)), nil, "c"}},
		"block backlog":                    {sqlBlockBacklog, []any{[]string{"acct:abcd"}, 1000, nil, 64, []string{"acct:abcd"}}},
		"block":                            {sqlBlock, []any{ids, nil, []string{"acct:abcd"}}},
		"flag holders":                     {sqlFlagHolders, []any{[]string{"acct:abcd"}}},
		"promote if room":                  {sqlPromoteIfRoom, []any{[]string{"acct:abcd"}, 1, nil, "c", true}},
		"complete apply":                   {sqlCompleteApply, complete},
		"hand-off lock":                    {sqlHandOffLock, []any{ids, int64(1)}},
		"hand-off busy":                    {sqlHandOffBusy, []any{ids}},
		"hand-off gates":                   {sqlHandOffGates, []any{ids}},
		"hand-off candidates":              {sqlHandOffCandidates, []any{ids, make([]int32, len(ids)), []string{}, []int32{}}},
		"hand-off candidates of workflows": {sqlHandOffCandidates, []any{ids, make([]int32, len(ids)), []string{"wf", "other"}, []int32{1, 1}}},
		"hand-off":                         {sqlHandOff, []any{ids, "w", int64(60e6), shards, nil, ids[:1], nil, nil, nil}},
		"hand-off try":                     {sqlHandOffTry, []any{[]string{"a:1", "a:2"}, int64(1)}},
		"successors lock":                  {sqlSuccessorsLock, []any{ids, fences, "w"}},
		"succeed":                          {sqlSucceed, []any{ids, "w", int64(60e6), shards, nil}},
		"reserve":                          {sqlReserve, []any{ids, "w", int64(60e6), nil}},
		"promote":                          {sqlPromote, []any{[]string{"acct:abcd"}, []int32{1}, nil, []bool{true}}},
		"stranded":                         {sqlStranded, []any{[]string{"acct:abcd"}, []bool{true}}},
		"paused queues":                    {sqlPausedQueues, nil},
		"heartbeat":                        {sqlHeartbeat, []any{"w", ids, fences, nil, int64(1)}},
		"check claims":                     {sqlCheckClaims, []any{"w", ids, fences}},
		"release":                          {sqlRelease, []any{"w", ids, fences, nil}},
		"recheck inbox":                    {sqlRecheckInbox, []any{ids, nil}},
		"reap":                             {sqlReap, []any{nil, 1000}},
		"reclaim worker":                   {sqlReclaimWorker, []any{nil, "w"}},
		"signal wake":                      {sqlSignalWake, []any{ids[0], nil}},
		"queue active":                     {sqlQueueActive, []any{"q", []string{"acct:abcd"}}},
		"throttle":                         {sqlThrottle, []any{ids, make([]time.Time, len(ids)), time.Now()}},
		// Rows of several keys (see several_keys.go).
		"key limits":     {sqlKeyLimits, []any{[]string{"acct:abcd", "api:x"}}},
		"claim multi":    {sqlClaimMulti, []any{ids[:2], []string{"api:x", "api:y"}, []int32{0, 0}, "w"}},
		"block multi":    {sqlBlockMulti, []any{ids, slices.Repeat([]string{"api:x"}, n), slices.Repeat([]string{"gate"}, n), slices.Repeat([]string{"acct:abcd\x1e"}, n), nil, []string{}}},
		"holds delete":   {sqlHoldsDelete, []any{ids}},
		"holds pass":     {sqlHoldsPass, []any{ids, ids}},
		"holds end":      {sqlHoldsEnd, []any{ids}},
		"holds orphaned": {sqlHoldsOrphaned, []any{1000}},
		// KeyInfo (durable explain, the ui's key page) and the ui's inbox.
		"key waiting": {sqlKeyWaiting, []any{"acct:abcd"}},
		"key next":    {sqlKeyNext, []any{"acct:abcd"}},
		"key oldest":  {sqlKeyOldest, []any{"acct:abcd"}},
		"inbox":       {sqlInbox, []any{ids[0], 100}},
		// The fresh round's probes (see sql.go), each alone.
		"fresh round: head of keyless": {`SELECT r.round FROM {schema}.instances r
			WHERE r.status = 'ready' AND r.key IS NULL AND r.queue = $1 AND r.priority = $2 ORDER BY r.round LIMIT 1`, []any{"q", 0}},
		"fresh round: head of keyed": {`SELECT r.round FROM {schema}.instances r
			WHERE r.status = 'ready' AND r.key IS NOT NULL AND r.queue = $1 AND r.priority = $2 ORDER BY r.round LIMIT 1`, []any{"q", 0}},
		"fresh round: key's last": {`SELECT r.round FROM {schema}.instances r
			WHERE r.key = $3 AND r.queue = $1 AND r.priority = $2 AND r.status IN ('ready', 'blocked')
			ORDER BY r.round DESC LIMIT 1`, []any{"q", 0, "acct:abcd"}},
		"fresh round: key's turns taken": {`SELECT count(*) FROM (SELECT 1 FROM {schema}.instances r
			WHERE r.key = $3 AND r.queue = $1 AND r.priority = $2 AND r.status IN ('ready', 'blocked') AND r.round = $4
			LIMIT $5) c`, []any{"q", 0, "acct:abcd", int64(3), 10}},
		// The state of an insert's K = 1 keys (sqlInsert, sqlInsertRounds).
		"insert busy keys": {insertKeyState,
			[]any{[]string{"acct:abcd"}, 16}},
		// An insert with rows of several keys: its reads (blockAtGates),
		// then the insert, in one transaction (insertSeveral).
		"insert gates":   {sqlInsertGates, []any{[]string{"acct:abcd", "api:x"}, 16}},
		"insert several": {sqlInsert, s.insertArgs(&insertPlan{rows: several.rows, block: true, wakeAfter: true})},
		// The round query of the COPY insert path: no scan of the table.
		"insert rounds": {sqlInsertRounds, []any{nil, []string{"q", "q"}, []int32{0, 0}, []string{"", "acct:abcd"},
			[]*time.Time{nil, nil}, []int64{0, 0}, "c", true, 16}},
	} {
		if !analyze && outsideBatch[name] {
			// Without sqlNoSeqScan, PostgreSQL may rightly read a small
			// table it has no statistics of in one pass (it still knows
			// its pages); none of these runs per step.
			continue
		}
		for _, mode := range []string{"auto", "force_generic_plan"} {
			plan := explainPrepared(t, s, mode, !outsideBatch[name], q.sql, q.args, name)
			text := strings.Join(plan, "\n")
			require.NotContains(t, text, "Seq Scan on instances", "%s (%s) scans the table:\n%s", name, mode, text)
			if !outsideBatch[name] {
				// Under sqlNoSeqScan a scan with no index path still runs,
				// marked by PostgreSQL's disable cost: a read of the whole
				// table at every call (and, were JIT on, a compilation too).
				require.NotContains(t, text, "cost=10000000000", "%s (%s) has a scan with no index path:\n%s", name, mode, text)
			}
			if byID[name] {
				scans := unboundedIndexScans(plan)
				if !analyze {
					// Without statistics, a read of a partial index of the
					// rows a fleet holds (executing, reserved) once, not per
					// batch row, is not counted: it grows with the fleet's
					// concurrency, not with the table.
					scans = slices.DeleteFunc(scans, func(scan string) bool {
						return slices.ContainsFunc(concurrencyIndexes, func(ix string) bool { return strings.Contains(scan, ix) })
					})
				}
				require.Empty(t, scans, "%s (%s) reads a whole index of instances:\n%s", name, mode, text)
				// A join on id (alone or with the fence) left to a nested
				// loop's filter compares every row found with every row of
				// the batch: quadratic in the batch (sqlReserve's, on
				// generic plans; sqlHeartbeat's, on id and fence).
				require.NotRegexp(t, `Join Filter: \(+\w+\.(id|fence) = \w+\.(id|fence)\b`, text,
					"%s (%s) joins its batch by filtering a nested loop:\n%s", name, mode, text)
			}
			if ok, in := byStatus[name]; in {
				for _, scan := range unboundedIndexScans(plan) {
					require.True(t, slices.ContainsFunc(ok, func(ix string) bool { return strings.Contains(scan, ix) }),
						"%s (%s) reads a whole index other than %v:\n%s", name, mode, ok, text)
				}
			}
		}
	}
}

// byID are the statements of TestHotPathPlansUseIndexes that look rows up
// by the ids (or keys) of a batch: every index scan of instances in their
// plans must have an index condition (a scan without one reads the whole
// index, filtering; a partial index of executing rows still grows with the
// fleet's concurrency, not with the batch).
var byID = map[string]bool{"complete apply": true, "claim": true, "claim reserve": true, "key busy": true,
	"hand-off": true, "hand-off lock": true, "hand-off busy": true, "hand-off gates": true, "hand-off candidates": true,
	"hand-off try":                     true,
	"hand-off candidates of workflows": true,
	"release":                          true, "heartbeat": true, "check claims": true, "successors lock": true, "succeed": true, "reserve": true,
	"join parents": true, "set pending": true, "block multi": true}

// concurrencyIndexes are the partial indexes of instances whose size is
// bounded by what the fleet holds (executing rows, reservations), not by
// the table.
var concurrencyIndexes = []string{"instances_lease", "instances_active", "instances_reserved"}

// byStatus are the statements of TestHotPathPlansUseIndexes that look rows
// up by a status whose rows are few (executing, reserved): they may read
// only the partial indexes of those rows whole, not one that grows with
// the table (with sqlNoSeqScan, a statement with no index path read the
// primary key's).
var byStatus = map[string][]string{"reclaim worker": concurrencyIndexes}

// unboundedIndexScans returns the index scans of instances in an EXPLAIN
// text plan that have no Index Cond.
func unboundedIndexScans(plan []string) []string {
	var out []string
	node := regexp.MustCompile(`(Index Scan|Index Only Scan|Bitmap Index Scan)( Backward)? (using|on) (\S+)( on instances)?`)
	for i, l := range plan {
		m := node.FindStringSubmatch(l)
		if m == nil || (m[1] != "Bitmap Index Scan" && m[5] == "") || (m[1] == "Bitmap Index Scan" && !strings.HasPrefix(m[4], "instances")) {
			continue
		}
		indent := len(l) - len(strings.TrimLeft(l, " ->"))
		bounded := false
		for _, d := range plan[i+1:] {
			if len(d)-len(strings.TrimLeft(d, " ")) < indent || strings.Contains(d, "->") {
				break
			}
			if strings.Contains(d, "Index Cond:") {
				bounded = true
				break
			}
		}
		if !bounded {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

// TestNewestListReadsThePrimaryKeyBackwards guards the plan of the ui's and
// the CLI's newest-first list: unfiltered or by workflow, it reads a page
// off the primary key (time-ordered ids), not the table. An ORDER BY that
// resolved to the output column id::text sorted every row instead.
func TestNewestListReadsThePrimaryKeyBackwards(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	ins := make([]store.NewInstance, 20_000)
	for i := range ins {
		ins[i] = store.NewInstance{ID: store.NewInstanceID(), Workflow: "wf", Version: 1, Queue: "q", Step: "s", State: json.RawMessage(`{}`)}
	}
	_, err := s.Insert(ctx, ins)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, "ANALYZE "+s.schema+".instances")
	require.NoError(t, err)
	for name, args := range map[string][]any{
		"unfiltered":  {"", []string{}, "", "", nil, 51},
		"by workflow": {"wf", []string{}, "", "", nil, 51},
		"next page":   {"", []string{}, "", "", ins[10_000].ID, 51},
	} {
		rows, err := s.pool.Query(ctx, "EXPLAIN "+s.q(sqlListNewest), append([]any{pgx.QueryExecModeExec}, args...)...)
		require.NoError(t, err, name)
		plan := planLines(t, rows, name)
		text := strings.Join(plan, "\n")
		require.Contains(t, text, "Backward using instances_pkey", "%s:\n%s", name, text)
		require.NotContains(t, text, "Sort", "%s:\n%s", name, text)
	}
}

// TestScanListReadsAtMostScanLimitRows guards the plan of ListPage with
// ScanLimit (the ui's list by key, queue or workflow): it reads the primary
// key backwards (forwards for the id order), no more than ScanLimit rows
// when matches are rare and no more than the page when they are not, and
// sorts nothing.
func TestScanListReadsAtMostScanLimitRows(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	ins := make([]store.NewInstance, 20_000)
	for i := range ins {
		ins[i] = store.NewInstance{ID: store.NewInstanceID(), Workflow: "wf", Version: 1, Queue: "q", Step: "s", State: json.RawMessage(`{}`)}
		if i%5_000 == 0 {
			ins[i].Key = "acct:rare"
		}
	}
	_, err := s.Insert(ctx, ins)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, "ANALYZE "+s.schema+".instances")
	require.NoError(t, err)
	scanned := regexp.MustCompile(`Index Scan (?:Backward )?using instances_pkey.*actual time=\S+ rows=(\d+)`)
	for name, c := range map[string]struct {
		sql  string
		args []any
		max  int
	}{
		"rare key":          {sqlListScanNewest, []any{"", []string{}, "acct:rare", "", nil, 51, 1_000}, 1_000},
		"missing queue":     {sqlListScanNewest, []any{"", []string{}, "", "nowhere", ins[15_000].ID, 51, 1_000}, 1_000},
		"rare key, by id":   {sqlListScan, []any{"", []string{}, "acct:rare", "", nil, 51, 1_000}, 1_000},
		"every row matches": {sqlListScanNewest, []any{"wf", []string{}, "", "", nil, 51, 1_000}, 53},
	} {
		rows, err := s.pool.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+s.q(c.sql), append([]any{pgx.QueryExecModeExec}, c.args...)...)
		require.NoError(t, err, name)
		plan := planLines(t, rows, name)
		text := strings.Join(plan, "\n")
		require.Contains(t, text, "using instances_pkey", "%s:\n%s", name, text)
		require.NotContains(t, text, "Sort", "%s:\n%s", name, text)
		m := scanned.FindStringSubmatch(text)
		require.NotNil(t, m, "%s:\n%s", name, text)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		require.LessOrEqual(t, n, c.max, "%s reads %d rows of the primary key:\n%s", name, n, text)
	}
}

// TestKeyProbesReadTheirIndexWithoutStatistics pins what migration 011 is
// for: on a table never analyzed (the benchmark's and the peers' case, and
// any table whose statistics lag), the probes of a key's blocked and ready
// rows that freeing transactions, inserts and claim backlogs run read
// instances_key_blocked_posix and instances_key_ready_posix, whose predicates are their
// conditions, with custom and generic plans, and never instances_key_round.
// Before 011, auto_explain caught live runs (the peers' keyed scenario, 100
// rows per key) taking instances_key_round and a sort for these probes; a
// table filled here without that churn did not reproduce it, so this test
// guards the index use, not that exact misplan.
func TestKeyProbesReadTheirIndexWithoutStatistics(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	const hot = "acct:hot"
	ins := make([]store.NewInstance, 5_000)
	for i := range ins {
		ins[i] = store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`), Key: hot}
	}
	_, err := s.Insert(ctx, ins) // ReadyCap rows ready, the rest blocked; no ANALYZE
	require.NoError(t, err)
	keys, one := []string{hot}, []bool{true}
	for name, q := range map[string]struct {
		sql   string
		args  []any
		wants []string
	}{
		"promote":         {sqlPromote, []any{keys, []int32{1}, nil, one}, []string{"instances_key_blocked", "instances_key_ready"}},
		"stranded":        {sqlStranded, []any{keys, one}, []string{"instances_key_blocked", "instances_key_ready"}},
		"promote if room": {sqlPromoteIfRoom, []any{keys, 1, nil, "c", true}, []string{"instances_key_blocked", "instances_key_ready"}},
		"block backlog":   {sqlBlockBacklog, []any{keys, 1000, nil, 64, []string{}}, []string{"instances_key_ready"}},
		"insert key state": {insertKeyState,
			[]any{keys, 64}, []string{"instances_key_ready"}},
	} {
		for _, mode := range []string{"auto", "force_generic_plan"} {
			plan := explainPrepared(t, s, mode, true, q.sql, q.args, name)
			text := strings.Join(plan, "\n")
			for _, want := range q.wants {
				require.Contains(t, text, want, "%s (%s):\n%s", name, mode, text)
			}
			require.NotContains(t, text, "instances_key_round", "%s (%s) walks the key's waiting rows:\n%s", name, mode, text)
		}
	}
}

// planLines reads the lines of an EXPLAIN's rows (name labels failures).
func planLines(t *testing.T, rows pgx.Rows, name string) []string {
	t.Helper()
	var plan []string
	for rows.Next() {
		var l string
		require.NoError(t, rows.Scan(&l), name)
		plan = append(plan, l)
	}
	require.NoError(t, rows.Err(), name)
	return plan
}

// explainPrepared returns the plan of statement sql with args, prepared (so
// that plan_cache_mode = mode, force_generic_plan included, applies) in a
// transaction of its own, with sqlNoSeqScan as the batch transactions run
// when noSeqScan is set.
func explainPrepared(t *testing.T, s *Store, mode string, noSeqScan bool, sql string, args []any, name string) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }() // a failed check must not hold the pool's connection
	_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode)
	require.NoError(t, err)
	if noSeqScan {
		_, err = tx.Exec(ctx, sqlNoSeqScan)
		require.NoError(t, err)
	}
	sd, err := tx.Prepare(ctx, "", "EXPLAIN "+s.q(sql))
	require.NoError(t, err, name)
	rows, err := tx.Query(ctx, sd.SQL, args...)
	require.NoError(t, err, name)
	return planLines(t, rows, name)
}

// TestHandOffCandidatesReadTheTurnOncePerGroup: the hand-off's candidates
// read whether they are in turn once per key, queue and priority (the CTE
// g is materialized), not once per candidate: inlined into the final join,
// its probe of the keyed pick index ran for each of a long line's
// candidates and walked the line each time (make bench's scenario 4, a
// gate of 1,000 over 20,000 rows, fell to about 3,000 steps/s in the runs
// where its key got hot; 200 candidates of one key read 11,060 buffers
// against 1,508 materialized).
func TestHandOffCandidatesReadTheTurnOncePerGroup(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	ins := make([]store.NewInstance, 300)
	for i := range ins {
		ins[i] = store.NewInstance{ID: store.NewInstanceID(), Workflow: "wf", Version: 1, Queue: "q", Step: "s",
			State: json.RawMessage(`{}`), Key: "api:one"}
	}
	_, err := s.Insert(ctx, ins)
	require.NoError(t, err)
	// Every workflow, and the workflow versions of a worker (one probe
	// each of the version pick index).
	for _, workflows := range [][]store.WorkflowVersion{{}, {{Workflow: "wf", Version: 1}, {Workflow: "other", Version: 1}}} {
		text := explainHandOffCandidates(t, s, []string{ins[0].ID}, []int32{100}, workflows)
		requireProbesOnce(t, text, `keyed`, workflows, "the turn was read per candidate, not per group")
		require.Contains(t, text, "rows=100 loops=1", "%v: the candidates read:\n%s", workflows, text)
	}
}

// TestHandOffCandidatesReadTheTurnOncePerQueue: with many keys in one
// batch (an outcome flush of rows of distinct K = 1 keys), the heads that
// decide the turn are read once per queue, not once per key: each probe of
// the pick indexes runs once, or once per workflow version the worker
// runs, whatever the number of keys.
func TestHandOffCandidatesReadTheTurnOncePerQueue(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	ins := make([]store.NewInstance, 60)
	ids := make([]string, 50)
	wants := make([]int32, len(ids))
	for i := range ins {
		key := fmt.Sprintf("acct:%d", i)
		if i >= len(ids) {
			key = "" // keyless rows, for the probe of the keyless pick index
		}
		ins[i] = store.NewInstance{ID: store.NewInstanceID(), Workflow: "wf", Version: 1, Queue: "q", Step: "s",
			State: json.RawMessage(`{}`), Key: key}
		if i < len(ids) {
			ids[i], wants[i] = ins[i].ID, 1
		}
	}
	_, err := s.Insert(ctx, ins)
	require.NoError(t, err)
	for _, workflows := range [][]store.WorkflowVersion{{}, {{Workflow: "wf", Version: 1}, {Workflow: "other", Version: 1}}} {
		text := explainHandOffCandidates(t, s, ids, wants, workflows)
		requireProbesOnce(t, text, `(?:keyed|free)`, workflows, "the turn was read per key, not per queue")
		require.Contains(t, text, fmt.Sprintf("rows=%d loops=1", len(ids)), "%v: the candidates read:\n%s", workflows, text)
	}
}

// requireProbesOnce checks, in an EXPLAIN ANALYZE text, that every probe
// of the pick indexes named by index (a pattern: "keyed", "free") ran once,
// or once per workflow version the worker runs, and that there is one.
func requireProbesOnce(t *testing.T, text, index string, workflows []store.WorkflowVersion, msg string) {
	t.Helper()
	probe := regexp.MustCompile(`Index (?:Only )?Scan using instances_pick_` + index + `(?:_version)? on instances \w+ .*loops=(\d+)`)
	m := probe.FindAllStringSubmatch(text, -1)
	require.NotEmpty(t, m, "%v: no probe of the pick indexes:\n%s", workflows, text)
	want := "1"
	if len(workflows) > 0 {
		want = fmt.Sprint(len(workflows))
	}
	for _, p := range m {
		require.Equal(t, want, p[1], "%v: %s:\n%s", workflows, msg, text)
	}
}

// explainHandOffCandidates runs sqlHandOffCandidates under EXPLAIN ANALYZE
// with a generic plan, in a transaction rolled back (the read locks its
// candidates), and returns the plan's text.
func explainHandOffCandidates(t *testing.T, s *Store, ids []string, wants []int32, workflows []store.WorkflowVersion) string {
	t.Helper()
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, sqlNoSeqScan)
	require.NoError(t, err)
	sd, err := tx.Prepare(ctx, "", "EXPLAIN (ANALYZE, COSTS OFF) "+s.q(sqlHandOffCandidates))
	require.NoError(t, err)
	names, versions := workflowArrays(workflows)
	rows, err := tx.Query(ctx, sd.SQL, ids, wants, names, versions)
	require.NoError(t, err)
	return strings.Join(planLines(t, rows, "hand-off candidates"), "\n")
}

// TestLimitChangeCountsLiveRowsThroughAnIndex: a limit change counts the
// live rows of each changed name and key, in any position (sqlLiveByName,
// sqlLiveByKey), once the change is in force; the counts read
// instances_live_key_name_key_c for the key column and
// instances_live_extra_keys for the other keys, not the table,
// analyzed or not, with custom and generic plans.
func TestLimitChangeCountsLiveRowsThroughAnIndex(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	_, err := s.pool.Exec(ctx, `INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, extra_keys, created_at, updated_at)
		SELECT gen_random_uuid(), 'wf', 'q', CASE WHEN i % 10 = 0 THEN 'ready' ELSE 'done' END, 's', now(), 0,
		       CASE WHEN i % 2 = 0 THEN 'api:' || (i % 100) WHEN i % 3 = 0 THEN 'acct:' || i END,
		       CASE WHEN i % 3 = 0 AND i % 2 <> 0 THEN ARRAY['api:' || (i % 100)] END, now(), now()
		FROM generate_series(1, 20000) i`)
	require.NoError(t, err)
	for _, analyze := range []bool{false, true} {
		if analyze {
			_, err = s.pool.Exec(ctx, "ANALYZE "+s.schema+".instances")
			require.NoError(t, err)
		}
		for _, mode := range []string{"auto", "force_generic_plan"} {
			for _, c := range []struct {
				name, sql string
				args      []any
			}{
				{"live by name", sqlLiveByName, []any{[]string{"api", "other"}, gate.LiveCountCap}},
				{"live by key", sqlLiveByKey, []any{[]string{"api:1", "api:3"}, []string{"api", "api"}, gate.LiveCountCap}},
			} {
				plan := explainPrepared(t, s, mode, false, c.sql, c.args, c.name)
				text := strings.Join(plan, "\n")
				require.Contains(t, text, "instances_live_key_name_key_c", "%s, analyzed %v (%s):\n%s", c.name, analyze, mode, text)
				require.Contains(t, text, "instances_live_extra_keys", "%s, analyzed %v (%s):\n%s", c.name, analyze, mode, text)
				require.NotContains(t, text, "Seq Scan on instances", "%s, analyzed %v (%s):\n%s", c.name, analyze, mode, text)
			}
		}
	}
}

// TestPerKeyLiveCountReadsTheKeysEntries: a per-key limit's change counts
// the live rows of its key (sqlLiveByKey) by the key, in either position:
// in the key column by an index condition on the key
// (instances_live_key_name_key_c, migration 030), and among other keys by
// the key's entries (instances_live_extra_keys, migration 031), whatever
// the number of live rows of its name. With 30,000 live rows of one name
// over 1,000 keys (a tenant's gate), reading them through the name took
// the planner to a sequential scan of the table, each `durable limits set`
// of a tenant's limit reading every row; with as many rows holding the
// tenant's key beside an account's, reading them through the name read
// every one of them (0.7 s for one key among 700,000 such rows).
func TestPerKeyLiveCountReadsTheKeysEntries(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	for _, q := range []string{
		`INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, created_at, updated_at)
		 SELECT gen_random_uuid(), 'wf', 'q', CASE WHEN i % 31 = 0 THEN 'done' ELSE 'ready' END, 's', now(), i / 1000,
		        'api:t' || (i % 1000), now(), now()
		 FROM generate_series(1, 31000) i`,
		`INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, extra_keys, extra_intents, created_at, updated_at)
		 SELECT gen_random_uuid(), 'wf', 'q', CASE WHEN i % 31 = 0 THEN 'done' ELSE 'blocked' END, 's', now(), i / 1000,
		        'acct:' || i, ARRAY['api:t' || (i % 1000)], ARRAY[''], now(), now()
		 FROM generate_series(1, 31000) i`,
		`VACUUM ANALYZE instances`, // the GIN index's pending entries into its tree, as autovacuum moves them
	} {
		_, err := s.pool.Exec(ctx, s.q(q))
		require.NoError(t, err, q)
	}
	args := []any{[]string{"api:t7"}, []string{"api"}, gate.LiveCountCap}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		text := strings.Join(explainPrepared(t, s, mode, false, sqlLiveByKey, args, "live by key"), "\n")
		require.Regexp(t, `Index (Only )?Scan using instances_live_key_name_key_c on instances[^\n]*\n\s+Index Cond: \(\(key_name = [^\n]*AND \(key = `, text, "%s:\n%s", mode, text)
		require.Contains(t, text, "instances_live_extra_keys", "%s:\n%s", mode, text)
		require.NotContains(t, text, "Seq Scan on instances", "%s:\n%s", mode, text)
		// The key's 60 live rows lie on as many pages at most, and the index
		// holds a few; the name's 60,000 live rows fill some 1,600.
		require.Less(t, explainBuffers(t, s, mode, sqlLiveByKey, args, "live by key"), 200, mode)
	}
	var n int64
	require.NoError(t, s.pool.QueryRow(ctx, s.q(sqlLiveByKey), args...).Scan(new(string), &n))
	require.Equal(t, int64(60), n, "api:t7's 31 rows in the key column and 31 among other keys, one of each done")

	// The name's count stops at its cap, and counts every row below it.
	for limit, want := range map[int]int64{100: 100, gate.LiveCountCap: gate.LiveCountCap, 100_000: 60_000} {
		require.NoError(t, s.pool.QueryRow(ctx, s.q(sqlLiveByName), []string{"api"}, limit).Scan(new(string), &n))
		require.Equal(t, want, n, "cap %d", limit)
	}
	// With a cap of 100 it reads a few pages of the name's 60,000 live
	// rows, not their 1,600.
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		require.Less(t, explainBuffers(t, s, mode, sqlLiveByName, []any{[]string{"api"}, 100}, "live by name"), 200, mode)
	}
	// Rows whose versions churn leave the other keys' index entries of the
	// old versions until vacuum, and a read through it visits their pages
	// first; a name whose key column alone reaches the cap is not read
	// there at all.
	for range 2 {
		_, err := s.pool.Exec(ctx, s.q(`UPDATE instances SET updated_at = now(), status = CASE status WHEN 'blocked' THEN 'ready' ELSE 'blocked' END
			WHERE extra_keys IS NOT NULL AND status IN ('ready', 'blocked')`))
		require.NoError(t, err)
	}
	args = []any{[]string{"api"}, 100}
	require.NoError(t, s.pool.QueryRow(ctx, s.q(sqlLiveByName), args...).Scan(new(string), &n))
	require.Equal(t, int64(100), n)
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		require.Less(t, explainBuffers(t, s, mode, sqlLiveByName, args, "live by name"), 300, "churned, %s", mode)
	}
}
