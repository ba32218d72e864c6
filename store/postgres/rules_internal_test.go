package postgres

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRulesAreWrittenAlike: a rule that several statements apply is
// written out in each of them (sql.go lists the rules); every statement
// that applies one carries the same text, whitespace aside, so that a
// change to one of them that misses the others fails here. The texts below
// are the rules as the statements write them (the key-limit lookup in two
// parts, around the key it is given).
func TestRulesAreWrittenAlike(t *testing.T) {
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	statements := map[string]string{
		"sqlBlock":            sqlBlock,
		"sqlBlockBacklog":     sqlBlockBacklog,
		"sqlChildren":         sqlChildren,
		"sqlClaim":            sqlClaim,
		"sqlClaimCandidates":  sqlClaimCandidates,
		"sqlClaimReserve":     sqlClaimReserve,
		"sqlCompleteApply":    sqlCompleteApply,
		"sqlCredit":           sqlCredit,
		"sqlFireQueueTimers":  sqlFireQueueTimers,
		"sqlFireTimers":       sqlFireTimers,
		"sqlFlagHolders":      sqlFlagHolders,
		"sqlGet":              sqlGet,
		"sqlHandOff":          sqlHandOff,
		"sqlHandOffBusy":      sqlHandOffBusy,
		"sqlHandOffGates":     sqlHandOffGates,
		"sqlHandOffLock":      sqlHandOffLock,
		"sqlHandOffTry":       sqlHandOffTry,
		"sqlHealthGates":      sqlHealthGates,
		"sqlInsert":           sqlInsert,
		"sqlInsertRounds":     sqlInsertRounds,
		"sqlJoinParents":      sqlJoinParents,
		"sqlKeyBusy":          sqlKeyBusy,
		"sqlKeyLimits":        sqlKeyLimits,
		"sqlBlockMulti":       sqlBlockMulti,
		"sqlClaimMulti":       sqlClaimMulti,
		"sqlKeyHolders":       sqlKeyHolders,
		"sqlKeyNext":          sqlKeyNext,
		"sqlKeyOldest":        sqlKeyOldest,
		"sqlLimitOf":          sqlLimitOf,
		"sqlList":             sqlList,
		"sqlListNewest":       sqlListNewest,
		"sqlListScan":         sqlListScan,
		"sqlListScanNewest":   sqlListScanNewest,
		"sqlPromote":          sqlPromote,
		"sqlPromoteIfRoom":    sqlPromoteIfRoom,
		"sqlPromoteScheduled": sqlPromoteScheduled,
		"sqlReap":             sqlReap,
		"sqlRecheckInbox":     sqlRecheckInbox,
		"sqlReclaimWorker":    sqlReclaimWorker,
		"sqlReserve":          sqlReserve,
		"sqlRetry":            sqlRetry,
		"sqlScheduleLock":     sqlScheduleLock,
		"sqlSchedulePause":    sqlSchedulePause,
		"sqlScheduleRecord":   sqlScheduleRecord,
		"sqlSchedulesAll":     sqlSchedulesAll,
		"sqlSetPending":       sqlSetPending,
		"sqlSignalWake":       sqlSignalWake,
		"freshRoundProbe":     freshRoundProbe,
		"sqlSlotsRead":        sqlSlotsRead,
		"sqlSlotsCount":       sqlSlotsCount,
		"sqlStranded":         sqlStranded,
	}
	for _, r := range []struct {
		name, text string
		in         []string
	}{
		{"the key-limit lookup", `LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk WHERE lk.name IN (`,
			[]string{"sqlClaimCandidates", "sqlSlotsRead", "sqlSlotsCount", "sqlCredit", "sqlHandOffGates",
				"sqlPromoteIfRoom", "sqlLimitOf", "sqlHealthGates", "sqlKeyLimits"}},
		{"the key-limit lookup's end", `) ORDER BY length(lk.name) DESC LIMIT 1) l`,
			[]string{"sqlClaimCandidates", "sqlSlotsRead", "sqlSlotsCount", "sqlCredit", "sqlHandOffGates",
				"sqlPromoteIfRoom", "sqlLimitOf", "sqlHealthGates", "sqlKeyLimits"}},
		{"the K = 1 holder probe", `{schema}.instances e WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND
			e.key_shard IS NULL`,
			[]string{"sqlInsert", "sqlInsertRounds", "sqlClaimCandidates", "sqlKeyBusy", "sqlClaim",
				"sqlHandOffBusy", "sqlFlagHolders", "sqlPromoteIfRoom", "sqlBlock", "sqlBlockBacklog",
				"sqlStranded", "sqlPromote"}},
		{"the other keys' keys", `(SELECT array_agg(split_part(e, E'\x1e', 1) ORDER BY n) FROM unnest(string_to_array(nullif(`,
			[]string{"sqlInsert", "sqlCompleteApply", "sqlClaim", "sqlHandOff", "sqlBlockMulti"}},
		{"the other keys' intents", `(SELECT array_agg(split_part(e, E'\x1e', 2) ORDER BY n) FROM unnest(string_to_array(nullif(`,
			[]string{"sqlInsert", "sqlCompleteApply", "sqlClaim", "sqlHandOff", "sqlBlockMulti"}},
		{"the other keys' text's end", `, ''), E'\x1f')) WITH ORDINALITY AS u(e, n))`,
			[]string{"sqlInsert", "sqlCompleteApply", "sqlClaim", "sqlHandOff", "sqlBlockMulti"}},
		{"the first key put back", `key = coalesce(a.first, i.key), key_intent = CASE WHEN a.first IS NULL THEN i.key_intent ELSE
			a.intent END, extra_keys = CASE WHEN a.first IS NULL THEN i.extra_keys ELSE (SELECT array_agg(split_part(e, E'\x1e', 1)
			ORDER BY n) FROM unnest(string_to_array(nullif(a.extras, ''), E'\x1f')) WITH ORDINALITY AS u(e, n)) END,
			extra_intents = CASE WHEN a.first IS NULL THEN i.extra_intents ELSE (SELECT array_agg(split_part(e, E'\x1e', 2) ORDER
			BY n) FROM unnest(string_to_array(nullif(a.extras, ''), E'\x1f')) WITH ORDINALITY AS u(e, n)) END FROM unnest($1::uuid[], $4::int[], $`,
			[]string{"sqlClaim", "sqlHandOff"}},
		{"the K = 1 busy check", `((SELECT true FROM {schema}.instances e WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS
			NOT NULL AND e.key_shard IS NULL LIMIT 1) IS NOT NULL OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k
			LIMIT 1) IS NOT NULL)`,
			[]string{"sqlInsert", "sqlInsertRounds", "sqlClaimCandidates", "sqlKeyBusy", "sqlClaim"}},
		{"the executing check", `(((SELECT true FROM {schema}.instances e WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS
			NOT NULL AND e.key_shard IS NULL LIMIT 1) IS NOT NULL OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k
			LIMIT 1) IS NOT NULL) OR (SELECT true FROM {schema}.instances e
			WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key_shard IS NOT NULL LIMIT 1) IS NOT NULL)`,
			[]string{"sqlKeyBusy", "sqlClaim"}},
		{"the marked-holder mark", `CROSS JOIN LATERAL (SELECT e.id FROM {schema}.instances e WHERE e.key = k AND e.status =
			'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL AND NOT e.waiters LIMIT 1 FOR NO KEY
			UPDATE SKIP LOCKED) h`,
			[]string{"sqlFlagHolders", "sqlPromoteIfRoom"}},
		{"the waited-on check", `(NOT (k = ANY (one)) OR (SELECT true FROM {schema}.instances e WHERE e.key = k AND e.status =
			'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL AND e.waiters LIMIT 1) IS NOT NULL
			OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k LIMIT 1) IS NOT NULL)`,
			[]string{"sqlBlock", "sqlBlockBacklog", "sqlBlockMulti"}},
		{"the ready count", `(SELECT count(*) FROM (SELECT 1 FROM {schema}.instances r WHERE r.key = k AND r.status = 'ready' COLLATE "POSIX"
			ORDER BY r.priority, r.run_at, r.seq LIMIT`,
			[]string{"sqlInsert", "sqlInsertRounds"}},
		{"the K = 1 key test", `NOT EXISTS (SELECT 1 FROM {schema}.limits l WHERE l.name = split_part(k, ':', 1))`,
			[]string{"sqlInsert", "sqlInsertRounds", "sqlHandOffTry"}},
		{"the stranded check", `coalesce((SELECT true FROM {schema}.instances b WHERE b.key = f.key AND b.status = 'blocked' COLLATE "POSIX" AND
			b.worker IS NULL ORDER BY b.priority, b.run_at, b.seq LIMIT 1), false) AND CASE WHEN f.one THEN (SELECT true FROM
			{schema}.instances r WHERE r.key = f.key AND r.status = 'ready' COLLATE "POSIX" ORDER BY r.priority, r.run_at,
			r.seq LIMIT 1) IS NULL AND (((SELECT true FROM {schema}.instances e
			WHERE e.key = f.key AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
			LIMIT 1) IS NULL AND (SELECT true FROM {schema}.key_holds kh WHERE kh.key = f.key LIMIT 1) IS NULL
			AND (SELECT true FROM {schema}.instances e WHERE e.key = f.key AND e.status =
			'executing' COLLATE "POSIX" AND e.key_shard IS NOT NULL LIMIT 1) IS NULL) OR (SELECT (SELECT true FROM {schema}.instances
			e WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL AND
			NOT e.waiters LIMIT 1) IS NOT NULL FROM (SELECT f.key AS k) x)) ELSE (SELECT a.n > (SELECT count(*) FROM
			(SELECT 1 FROM {schema}.instances r WHERE r.key = f.key AND r.status = 'ready' COLLATE "POSIX" ORDER BY
			r.priority, r.run_at, r.seq LIMIT a.n) r) FROM (SELECT coalesce(sum(s.available), 1) AS n FROM
			{schema}.key_slots s WHERE s.key = f.key) a) END`,
			[]string{"sqlStranded", "sqlPromote"}},
		{"the blocked check", `((SELECT true FROM {schema}.instances b WHERE b.key = k AND b.status = 'blocked' COLLATE "POSIX" AND b.worker IS
			NULL LIMIT 1) IS NOT NULL)`,
			[]string{"sqlClaim", "sqlHandOff", "sqlPromoteIfRoom"}},
		{"the fresh round", `(SELECT CASE WHEN fk.last >= fh.head THEN greatest(fk.last, fk.last - (fk.last & 1) + 2 *
			((fk.taken + fr.n) / fk.turns)) ELSE greatest(fh.head, fh.head - (fh.head & 1) + 2 * (fr.n / fk.turns)) END
			FROM (SELECT`,
			[]string{"sqlFireQueueTimers", "sqlFireTimers", "sqlCompleteApply", "sqlJoinParents",
				"sqlSetPending", "sqlRecheckInbox", "sqlRetry", "sqlSignalWake", "freshRoundProbe"}},
		{"the batch's fresh round", `CASE WHEN fk.last >= h.head THEN fk.last ELSE h.head END AS base, CASE WHEN fk.last >=
			h.head THEN fk.taken ELSE 0 END AS taken, fk.turns`,
			[]string{"sqlInsert", "sqlPromoteScheduled"}},
		{"the queue's open round", `(coalesce(least( (SELECT r.round FROM {schema}.instances r WHERE r.status = 'ready' AND r.key IS
			NULL AND r.queue = fr.q AND r.priority = fr.p ORDER BY r.round LIMIT 1), (SELECT r.round FROM
			{schema}.instances r WHERE r.status = 'ready' AND r.key IS NOT NULL AND r.queue = fr.q AND
			r.priority = fr.p ORDER BY r.round LIMIT 1)), 0) - 1) | 1`,
			[]string{"sqlInsert", "sqlInsertRounds", "sqlPromoteScheduled", "sqlFireQueueTimers",
				"sqlFireTimers", "sqlCompleteApply", "sqlJoinParents", "sqlSetPending", "sqlRecheckInbox",
				"sqlRetry", "sqlSignalWake", "freshRoundProbe"}},
		{"the key's last round", `CROSS JOIN LATERAL (SELECT x.last, x.turns, CASE WHEN x.turns = 1 THEN 1 ELSE (SELECT
			count(*) FROM (SELECT 1 FROM {schema}.instances r WHERE r.key = fr.k AND r.queue = fr.q AND
			r.priority = fr.p AND r.status IN ('ready', 'blocked') AND r.round = x.last LIMIT x.turns) c) END
			AS taken FROM (SELECT (SELECT r.round FROM {schema}.instances r WHERE r.key = fr.k AND r.queue =
			fr.q AND r.priority = fr.p AND r.status IN ('ready', 'blocked') ORDER BY r.round DESC LIMIT 1) AS
			last, coalesce((SELECT greatest(lk."limit", 1) FROM {schema}.limits lk WHERE lk.name IN (fr.k,
			split_part(fr.k, ':', 1)) ORDER BY length(lk.name) DESC LIMIT 1), 1) AS turns OFFSET 0) x) fk`,
			[]string{"sqlInsert", "sqlInsertRounds", "sqlPromoteScheduled", "sqlFireQueueTimers",
				"sqlFireTimers", "sqlCompleteApply", "sqlJoinParents", "sqlSetPending", "sqlRecheckInbox",
				"sqlRetry", "sqlSignalWake", "freshRoundProbe"}},
		{"the move to executing", `SET status = 'executing', worker = $2, fence = nextval('{schema}.fence_seq'), lease_expires_at =
			t.now + $3::bigint * interval '1 microsecond', started_at = t.now, key_shard = nullif(a.shard,
			-1), updated_at = t.now, waiters = i.extra_keys IS NOT NULL OR a.shard < 0 AND i.key IS NOT NULL AND (SELECT ((SELECT true
			FROM {schema}.instances b WHERE b.key = k AND b.status = 'blocked' COLLATE "POSIX" AND b.worker IS NULL LIMIT 1)
			IS NOT NULL) FROM (SELECT i.key AS k) x)`,
			[]string{"sqlClaim", "sqlHandOff"}},
		{"the reservation's SET", `SET status = 'blocked', worker = $2, fence = nextval('{schema}.fence_seq'), lease_expires_at =
			t.now + $3::bigint * interval '1 microsecond', updated_at = t.now`,
			[]string{"sqlClaimReserve", "sqlReserve"}},
		{"the claimed rows", `SELECT id::text, workflow, version, queue, priority, status, step, state, attempt, coalesce(key,
			''), key_intent, coalesce(key_shard, -1), run_at, CASE WHEN status = 'awaiting' THEN
			await_signal ELSE '' END, timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at,
			result, coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
			coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents,
			sg.sig_id, sg.sig_name, sg.sig_payload, sg.sig_dedup, sg.sig_created FROM c LEFT JOIN LATERAL (
			SELECT s.id AS sig_id, s.name AS sig_name, s.payload AS sig_payload, coalesce(s.dedup_key, '')
			AS sig_dedup, s.created_at AS sig_created FROM {schema}.signals s WHERE s.instance_id = c.id AND
			s.name = c.await_signal AND s.consumed_at IS NULL AND NOT c.timed_out ORDER BY s.id LIMIT 1) sg
			ON true ORDER BY c.ord`,
			[]string{"sqlClaim", "sqlClaimReserve", "sqlHandOff", "sqlReserve"}},
		{"the reservable-row probe", `CROSS JOIN LATERAL (SELECT r.id FROM {schema}.instances r WHERE r.id = a.id AND r.status IN
			('ready', 'blocked') AND r.worker IS NULL FOR NO KEY UPDATE) r`,
			[]string{"sqlClaimReserve", "sqlReserve"}},
		{"the instance columns", instanceColumns,
			[]string{"sqlGet", "sqlList", "sqlListNewest", "sqlListScan", "sqlListScanNewest", "sqlChildren",
				"sqlKeyHolders", "sqlKeyNext", "sqlKeyOldest", "sqlClaim", "sqlClaimReserve",
				"sqlHandOff", "sqlReserve"}},
		{"the schedule columns", `name, namespace, workflow, cron, time_zone, queue, priority, coalesce(key, ''), key_intent,
			unique_statuses, overlap, catch_up, grace_us, paused, anchor, last_tick,
			coalesce(last_instance::text, ''), last_fired_at, epoch, coalesce(also_keys, '')`,
			[]string{"sqlSchedulesAll", "sqlScheduleLock", "sqlSchedulePause", "sqlScheduleRecord"}},
		{"the held keys", `held AS (SELECT key FROM {schema}.instances WHERE id = ANY ($1::uuid[]) AND key IS NOT NULL
			UNION SELECT key FROM {schema}.key_holds WHERE instance_id = ANY ($1::uuid[]))`,
			[]string{"sqlHandOffLock", "sqlHandOffBusy", "sqlHandOffGates"}},
		{"the take-back", `UPDATE {schema}.instances i SET status = CASE WHEN i.cancel_requested THEN 'canceled' ELSE
			'ready' END, attempt = CASE WHEN i.cancel_requested THEN i.attempt ELSE i.attempt + 1 END,
			worker = NULL, lease_expires_at = NULL, key_shard = NULL, started_at = NULL, updated_at =
			coalesce($1::timestamptz, now()) FROM o WHERE i.id = o.id RETURNING coalesce(o.old_key, ''),
			coalesce(o.old_shard, -1), i.queue, i.status, coalesce(i.parent_id::text, ''), i.join_gen`,
			[]string{"sqlReap", "sqlReclaimWorker"}},
		{"the runnable-row filter", `(cardinality($3::text[]) = 0 OR version::text || ':' || workflow = ANY (ARRAY(SELECT v::text ||
			':' || w FROM unnest($3::text[], $7::int[]) AS x(w, v))))`,
			[]string{"sqlClaimCandidates"}},
	} {
		for _, name := range r.in {
			stmt, ok := statements[name]
			if assert.True(t, ok, "%s: no statement %s", r.name, name) {
				assert.Contains(t, norm(stmt), norm(r.text), "%s in %s", r.name, name)
			}
		}
	}
}

// TestStatementsAreLiterals: every constant of the sql*.go files is one
// string literal, so that a statement reads whole where it is defined and
// no fragment is spliced into several statements (a shared rule is written
// out in each; TestRulesAreWrittenAlike keeps the copies alike).
func TestStatementsAreLiterals(t *testing.T) {
	files, err := filepath.Glob("sql*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	n := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				for i, v := range spec.(*ast.ValueSpec).Values {
					n++
					lit, ok := v.(*ast.BasicLit)
					assert.True(t, ok && lit.Kind == token.STRING, "%s: %s is not one string literal",
						fset.Position(v.Pos()), spec.(*ast.ValueSpec).Names[i].Name)
				}
			}
		}
	}
	require.Greater(t, n, 100, "the statements were not found")
}
