package postgres

// Statements of the claim (see admission.go).
// The rules every statement follows (static text, arrays for batches, the
// clock as a parameter, the lock order) are written at the top of sql.go.

// Claim: the statements of the admission transaction (see admission.go).
const (
	// sqlPromoteScheduled moves due delayed rows of a queue onto the pick
	// path, giving each a round unless it kept one (a row rescheduled for a
	// rate limit token): the batch's fresh rounds (see sql.go), the queue
	// head read once per priority (h) and each key's last round per key
	// (b). It locks the rows it
	// moves SKIP LOCKED (lock order (1)), read through instances_scheduled.
	sqlPromoteScheduled = `
WITH d AS MATERIALIZED (
    SELECT id, priority, key, run_at, seq, round FROM {schema}.instances
    WHERE status = 'scheduled' AND queue = $1 AND run_at <= coalesce($2::timestamptz, now())
    ORDER BY run_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED),
h AS MATERIALIZED (
    SELECT g.priority,
           (SELECT (coalesce(least(
                       (SELECT r.round FROM {schema}.instances r
                        WHERE r.status = 'ready' AND r.key IS NULL AND r.queue = fr.q AND r.priority = fr.p
                        ORDER BY r.round LIMIT 1),
                       (SELECT r.round FROM {schema}.instances r
                        WHERE r.status = 'ready' AND r.key IS NOT NULL AND r.queue = fr.q AND r.priority = fr.p
                        ORDER BY r.round LIMIT 1)), 0) - 1) | 1
            FROM (SELECT $1::text AS q, g.priority AS p) fr) AS head
    FROM (SELECT DISTINCT priority FROM d WHERE round IS NULL) g
),
b AS (
    SELECT g.priority, g.key,
           CASE WHEN fk.last >= h.head THEN fk.last ELSE h.head END AS base,
           CASE WHEN fk.last >= h.head THEN fk.taken ELSE 0 END AS taken, fk.turns
    FROM (SELECT DISTINCT priority, key FROM d WHERE round IS NULL) g
    JOIN h ON h.priority = g.priority
    CROSS JOIN LATERAL (SELECT $1::text AS q, g.priority AS p, g.key AS k) fr
    CROSS JOIN LATERAL (SELECT x.last, x.turns,
                               CASE WHEN x.turns = 1 THEN 1
                                    ELSE (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances r
                                                                WHERE r.key = fr.k AND r.queue = fr.q AND r.priority = fr.p
                                                                  AND r.status IN ('ready', 'blocked') AND r.round = x.last
                                                                LIMIT x.turns) c) END AS taken
                        FROM (SELECT (SELECT r.round FROM {schema}.instances r
                                      WHERE r.key = fr.k AND r.queue = fr.q AND r.priority = fr.p
                                        AND r.status IN ('ready', 'blocked')
                                      ORDER BY r.round DESC LIMIT 1) AS last,
                                     coalesce((SELECT greatest(lk."limit", 1) FROM {schema}.limits lk
                                               WHERE lk.name IN (fr.k, split_part(fr.k, ':', 1))
                                               ORDER BY length(lk.name) DESC LIMIT 1), 1) AS turns OFFSET 0) x) fk
),
r AS (
    SELECT d.id, coalesce(d.round, greatest(b.base, b.base - (b.base & 1) + 2 * CASE WHEN d.key IS NULL THEN 0 ELSE
               (b.taken + row_number() OVER (PARTITION BY d.priority, d.key, d.round IS NULL ORDER BY d.run_at, d.seq) - 1)
               / b.turns END)) AS round
    FROM d LEFT JOIN b ON b.priority = d.priority AND b.key IS NOT DISTINCT FROM d.key
)
UPDATE {schema}.instances i SET status = 'ready', round = r.round, updated_at = coalesce($2::timestamptz, now())
FROM r WHERE i.id = r.id`

	// sqlFireQueueTimers makes awaits of a queue whose timeout passed
	// ready, each at its fresh round (see sql.go), locking them SKIP LOCKED
	// (lock order (1)).
	sqlFireQueueTimers = `
WITH d AS MATERIALIZED (
    SELECT id FROM {schema}.instances
    WHERE status = 'awaiting' AND queue = $1 AND timeout_at IS NOT NULL
      AND timeout_at <= coalesce($2::timestamptz, now())
    ORDER BY timeout_at LIMIT $3 FOR UPDATE SKIP LOCKED)
UPDATE {schema}.instances i
SET status = 'ready', timed_out = true, run_at = i.timeout_at, timeout_at = NULL,
    round = (SELECT CASE WHEN fk.last >= fh.head THEN greatest(fk.last, fk.last - (fk.last & 1) + 2 * ((fk.taken + fr.n) / fk.turns))
                         ELSE greatest(fh.head, fh.head - (fh.head & 1) + 2 * (fr.n / fk.turns)) END
             FROM (SELECT i.queue AS q, i.priority AS p, i.key AS k, 0 AS n) fr
             CROSS JOIN LATERAL (SELECT (coalesce(least(
                                            (SELECT r.round FROM {schema}.instances r
                                             WHERE r.status = 'ready' AND r.key IS NULL AND r.queue = fr.q AND r.priority = fr.p
                                             ORDER BY r.round LIMIT 1),
                                            (SELECT r.round FROM {schema}.instances r
                                             WHERE r.status = 'ready' AND r.key IS NOT NULL AND r.queue = fr.q AND r.priority = fr.p
                                             ORDER BY r.round LIMIT 1)), 0) - 1) | 1 AS head) fh
             CROSS JOIN LATERAL (SELECT x.last, x.turns,
                                        CASE WHEN x.turns = 1 THEN 1
                                             ELSE (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances r
                                                                         WHERE r.key = fr.k AND r.queue = fr.q AND r.priority = fr.p
                                                                           AND r.status IN ('ready', 'blocked') AND r.round = x.last
                                                                         LIMIT x.turns) c) END AS taken
                                 FROM (SELECT (SELECT r.round FROM {schema}.instances r
                                               WHERE r.key = fr.k AND r.queue = fr.q AND r.priority = fr.p
                                                 AND r.status IN ('ready', 'blocked')
                                               ORDER BY r.round DESC LIMIT 1) AS last,
                                              coalesce((SELECT greatest(lk."limit", 1) FROM {schema}.limits lk
                                                        WHERE lk.name IN (fr.k, split_part(fr.k, ':', 1))
                                                        ORDER BY length(lk.name) DESC LIMIT 1), 1) AS turns OFFSET 0) x) fk),
    updated_at = coalesce($2::timestamptz, now())
WHERE i.id = ANY (ARRAY(SELECT id FROM d))`

	// sqlClaimCandidates locks the window: the first due ready rows of the
	// queue in claim order (none while the queue is paused: one probe of
	// paused_queues, which PostgreSQL runs once per statement), with their
	// key's limit (NULL: K = 1) and rate limit (NULL: none). Keyless rows
	// ($5 of them: each needs only queue capacity) and keyed rows ($4) are
	// read from their own indexes (instances_pick_free, instances_pick_keyed)
	// and merged, so that keyed rows waiting for their keys never push
	// keyless rows out of the window. The last column is, for a row of a
	// K = 1 key, what the statement found of the key (see oneLocked): busy
	// when it had an executing row in this statement's snapshot (the K = 1
	// busy check, as in sqlInsert; a hint only, read before any lock), and
	// otherwise, in a queue without a policy, whether the key's advisory
	// lock ($6: the salt) was had, tried here so that the claim needs no
	// round trip of its own for it. A policy's queue takes its queue lock first (see admit), so its
	// keys' locks are left to admit. The snapshot predates the locks: the
	// claim's update checks again that no row of the key executes
	// (sqlClaim). The limit comes from the key-limit lookup (see sql.go).
	// Lock order: the window's rows, SKIP LOCKED (1), then the tried key
	// locks (2), which never wait.
	//
	// A claim restricted to workflow versions ($3 non-empty: the names,
	// $7 the versions, pairwise) starts each read at its start row (fs for
	// the keyless read, ks for the keyed one): the smallest (priority,
	// round, run_at, seq) of the first due ready row of each of those
	// versions, found by one probe per version of
	// instances_pick_free_version or instances_pick_keyed_version, whose
	// predicates the probes' status check repeats COLLATE "C" (migration
	// 020). The rows of other workflows or versions ahead of it in claim
	// order (a backlog no running worker can run) are not read at all;
	// those behind it are passed over as the read meets them (the
	// runnable-row filter), so that a claim reads them only in proportion
	// to how they interleave with its own rows. Every row the read skips
	// comes before the first row it may claim, so the window is the same
	// as without the start row. A start row has no row when none of the
	// versions has such a row, and then the read it starts finds nothing.
	// An unrestricted claim starts at the queue's first row: the start row
	// is then the smallest value the columns can hold, which every row
	// passes. Every ready row has a round (a row gets one when it becomes
	// ready), so the comparison never meets a NULL.
	//
	// The runnable-row filter is true for a row of one of the workflow
	// versions, or for every row when $3 is empty. A row's version and
	// workflow are compared as one text value, "version:workflow" (the
	// first colon ends the version), against an array the statement builds
	// once, so that the check stays a scalar filter on each row the ordered
	// read meets, with nothing for the planner to join.
	sqlClaimCandidates = `
WITH fs AS MATERIALIZED (
    SELECT priority, round, run_at, seq FROM (
        SELECT f.priority, f.round, f.run_at, f.seq FROM unnest($3::text[], $7::int[]) AS w(name, version)
        CROSS JOIN LATERAL (SELECT priority, round, run_at, seq FROM {schema}.instances
                            WHERE status = 'ready' COLLATE "C" AND key IS NULL AND queue = $1
                              AND workflow = w.name AND version = w.version
                              AND run_at <= coalesce($2::timestamptz, now())
                            ORDER BY priority, round, run_at, seq LIMIT 1) f
        UNION ALL
        SELECT (-2147483648)::int, (-9223372036854775808)::bigint, '-infinity'::timestamptz, (-9223372036854775808)::bigint
        WHERE cardinality($3::text[]) = 0) s
    ORDER BY priority, round, run_at, seq LIMIT 1),
ks AS MATERIALIZED (
    SELECT priority, round, run_at, seq FROM (
        SELECT f.priority, f.round, f.run_at, f.seq FROM unnest($3::text[], $7::int[]) AS w(name, version)
        CROSS JOIN LATERAL (SELECT priority, round, run_at, seq FROM {schema}.instances
                            WHERE status = 'ready' COLLATE "C" AND key IS NOT NULL AND queue = $1
                              AND workflow = w.name AND version = w.version
                              AND run_at <= coalesce($2::timestamptz, now())
                            ORDER BY priority, round, run_at, seq LIMIT 1) f
        UNION ALL
        SELECT (-2147483648)::int, (-9223372036854775808)::bigint, '-infinity'::timestamptz, (-9223372036854775808)::bigint
        WHERE cardinality($3::text[]) = 0) s
    ORDER BY priority, round, run_at, seq LIMIT 1),
free AS (
    SELECT id, key, key_name, key_intent, extra_keys, extra_intents, priority, round, run_at, seq FROM {schema}.instances
    WHERE status = 'ready' AND key IS NULL AND queue = $1 AND run_at <= coalesce($2::timestamptz, now())
      AND (priority, round, run_at, seq) >= ((SELECT priority FROM fs), (SELECT round FROM fs),
                                             (SELECT run_at FROM fs), (SELECT seq FROM fs))
      AND (cardinality($3::text[]) = 0
           OR version::text || ':' || workflow
              = ANY (ARRAY(SELECT v::text || ':' || w FROM unnest($3::text[], $7::int[]) AS x(w, v))))
      AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queues pq WHERE pq.queue = $1)
    ORDER BY priority, round, run_at, seq
    LIMIT $5 FOR UPDATE SKIP LOCKED),
keyed AS (
    SELECT id, key, key_name, key_intent, extra_keys, extra_intents, priority, round, run_at, seq FROM {schema}.instances
    WHERE status = 'ready' AND key IS NOT NULL AND queue = $1 AND run_at <= coalesce($2::timestamptz, now())
      AND (priority, round, run_at, seq) >= ((SELECT priority FROM ks), (SELECT round FROM ks),
                                             (SELECT run_at FROM ks), (SELECT seq FROM ks))
      AND (cardinality($3::text[]) = 0
           OR version::text || ':' || workflow
              = ANY (ARRAY(SELECT v::text || ':' || w FROM unnest($3::text[], $7::int[]) AS x(w, v))))
      AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queues pq WHERE pq.queue = $1)
    ORDER BY priority, round, run_at, seq
    LIMIT $4 FOR UPDATE SKIP LOCKED)
SELECT c.id::text, coalesce(c.key, ''), l."limit", l.shards, r."limit", r.period_us, r.burst, r.per_key,
       CASE WHEN c.key IS NULL OR l.name IS NOT NULL THEN 0
            WHEN c.extra_keys IS NOT NULL THEN 5
            WHEN ((SELECT true FROM {schema}.instances e
                    WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
                    LIMIT 1) IS NOT NULL
                  OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k LIMIT 1) IS NOT NULL) THEN 1
            WHEN EXISTS (SELECT 1 FROM {schema}.queue_policies p WHERE p.queue = $1) THEN 4
            WHEN pg_try_advisory_xact_lock(hashtextextended(c.key, $6::bigint)) THEN 2
            ELSE 3 END,
       c.extra_keys, c.extra_intents, CASE WHEN c.extra_keys IS NOT NULL THEN c.key_intent END
FROM (SELECT *, key AS k FROM free UNION ALL SELECT *, key AS k FROM keyed) c
LEFT JOIN LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk
                   WHERE lk.name IN (c.key, c.key_name) ORDER BY length(lk.name) DESC LIMIT 1) l ON true
LEFT JOIN {schema}.rate_limits r ON r.name = c.key_name
ORDER BY c.priority, c.round, c.run_at, c.seq`

	// sqlKeyLimits reads the limits the keys $1 run under (the key-limit
	// lookup; see sql.go), their names' rate limits and, for a key with a
	// limit, the free slots of its counters read without a lock (NULL: no
	// counters), in $1's order: the keys of the rows of several keys in a
	// claim's window, whose other keys the window statement returns without
	// their limits (see alsoLimits), and whose gates' free slots tell which
	// rows a full gate will refuse and whether the window fills a gate
	// (see refusedByFullGates).
	sqlKeyLimits = `
SELECT k, l."limit", l.shards, r."limit", r.period_us, r.burst, r.per_key,
       CASE WHEN l.name IS NOT NULL THEN (SELECT sum(s.available)::int FROM {schema}.key_slots s WHERE s.key = k) END
FROM unnest($1::text[]) WITH ORDINALITY AS x(k, ord)
LEFT JOIN LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk
                   WHERE lk.name IN (k, split_part(k, ':', 1)) ORDER BY length(lk.name) DESC LIMIT 1) l ON true
LEFT JOIN {schema}.rate_limits r ON r.name = split_part(k, ':', 1)
ORDER BY x.ord`

	// sqlClaimMulti completes the claim of rows of several keys that
	// sqlClaim (or sqlHandOff), earlier in the transaction, made executing
	// for worker $4 with their first key in their key column, and marked as
	// having waiters (as every row of several keys is, so that its end
	// frees every key the full way): each row gets a key_holds row, under
	// its fence, for each of its other keys ($1..$3: one entry per (row,
	// key), its shard; -1: K = 1). A row sqlClaim left ready gets none. The
	// rows are found by id, as sqlClaim finds them, materialized; the holds
	// are inserted in key order.
	sqlClaimMulti = `
WITH f AS MATERIALIZED (
    SELECT i.id, i.fence FROM {schema}.instances i
    WHERE i.id = ANY ($1::uuid[]) AND i.status = 'executing' COLLATE "C" AND i.worker = $4)
INSERT INTO {schema}.key_holds (instance_id, fence, key, shard)
SELECT h.id, f.fence, h.key, nullif(h.shard, -1)
FROM unnest($1::uuid[], $2::text[], $3::int[]) AS h(id, key, shard)
JOIN f ON f.id = h.id
ORDER BY h.key`

	// sqlBlockMulti blocks rows of several keys of the claim's window
	// ($1, locked already) on the key that refused each ($2, intent $3):
	// that key goes in the key column and the others in extra_keys ($4,
	// the other keys' text: see keysText), so that the row waits in that
	// key's line and that key's freeing promotes it (see migration 025). A
	// row blocked on a K = 1 key of $6 is blocked only as sqlBlock blocks
	// one (the waited-on check, read once per row before the update), and
	// otherwise it stays ready. The update finds its rows by b's ids
	// alone, b the outer side of the join and each row an index probe: a
	// second condition id = ANY ($1) makes the planner read the rows by
	// that array and filter a nested loop over b for each, quadratic in
	// the window (TestHotPathPlansUseIndexes).
	sqlBlockMulti = `
WITH b AS MATERIALIZED (
    SELECT x.id, x.key, x.intent, x.extras
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS x(id, key, intent, extras)
    WHERE (SELECT (NOT (k = ANY (one))
                   OR (SELECT true FROM {schema}.instances e
                       WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
                         AND e.waiters LIMIT 1) IS NOT NULL
                   OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k LIMIT 1) IS NOT NULL)
           FROM (SELECT x.key AS k, $6::text[] AS one) w))
UPDATE {schema}.instances i
SET status = 'blocked', key = b.key, key_intent = b.intent,
    extra_keys = (SELECT array_agg(split_part(e, E'\x1e', 1) ORDER BY n) FROM unnest(string_to_array(nullif(b.extras, ''), E'\x1f')) WITH ORDINALITY AS u(e, n)),
    extra_intents = (SELECT array_agg(split_part(e, E'\x1e', 2) ORDER BY n) FROM unnest(string_to_array(nullif(b.extras, ''), E'\x1f')) WITH ORDINALITY AS u(e, n)),
    updated_at = coalesce($5::timestamptz, now())
FROM b
WHERE i.id = b.id AND i.status = 'ready'`

	// sqlClaimContext returns the claim's now, the queue's policy (NULLs:
	// none) and whether the queue is paused.
	sqlClaimContext = `
SELECT coalesce($2::timestamptz, now()), p.max_active, p.max_active_per_key,
       EXISTS (SELECT 1 FROM {schema}.paused_queues pq WHERE pq.queue = $1)
FROM (SELECT 1) one LEFT JOIN {schema}.queue_policies p ON p.queue = $1`

	// sqlQueueLock serializes the claims of a queue that has a policy, so
	// that each counts the executing rows the others committed.
	sqlQueueLock = `SELECT pg_advisory_xact_lock(hashtextextended($1, $2::bigint))`

	// sqlQueueActive counts the executing rows of a queue and, per key of
	// $2, of that key in the queue. It runs after sqlQueueLock, as its own
	// statement, so that its snapshot sees every claim committed before.
	sqlQueueActive = `
SELECT '', (SELECT count(*) FROM {schema}.instances WHERE queue = $1 AND status = 'executing')
UNION ALL
SELECT k, (SELECT count(*) FROM {schema}.instances WHERE queue = $1 AND status = 'executing' AND key = k)
          + (SELECT count(*) FROM {schema}.key_holds h JOIN {schema}.instances i ON i.id = h.instance_id
             WHERE h.key = k AND i.queue = $1 AND i.status = 'executing' COLLATE "C")
FROM unnest($2::text[]) AS k`

	// sqlBucketsLock creates missing rate buckets (full, as of $3) and locks
	// every bucket of the list, in list order (sorted by the caller).
	sqlBucketsLock = `
INSERT INTO {schema}.rate_buckets AS b (bucket, credit, updated_at)
SELECT x.bucket, x.credit, $3::timestamptz
FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS x(bucket, credit, ord)
ORDER BY x.ord
ON CONFLICT (bucket) DO UPDATE SET credit = b.credit WHERE false`

	// sqlBucketsRead reads the buckets this transaction has locked.
	sqlBucketsRead = `SELECT bucket, credit, updated_at FROM {schema}.rate_buckets WHERE bucket = ANY ($1::text[])`

	// sqlBucketsSet stores the buckets a claim took tokens from.
	sqlBucketsSet = `
UPDATE {schema}.rate_buckets b SET credit = d.credit, updated_at = d.at
FROM unnest($1::text[], $2::bigint[], $3::timestamptz[]) AS d(bucket, credit, at)
WHERE b.bucket = d.bucket`

	// sqlThrottle reschedules window rows that found their rate bucket
	// empty to when their token is due; they keep their round.
	sqlThrottle = `
UPDATE {schema}.instances i SET status = 'scheduled', run_at = d.at, updated_at = $3::timestamptz
FROM unnest($1::uuid[], $2::timestamptz[]) AS d(id, at)
WHERE i.id = d.id AND i.status = 'ready'`

	// sqlKeyTryLock tries the advisory lock of each K = 1 key without waiting.
	sqlKeyTryLock = `SELECT pg_try_advisory_xact_lock(hashtextextended(k, $2::bigint)) FROM unnest($1::text[]) AS k`

	// sqlKeyBusy returns the keys of $1 that have an executing row (the
	// executing check, as in sqlClaim; see sql.go). It
	// must run as its own statement after sqlKeyTryLock so that its
	// snapshot is taken while the locks are held.
	sqlKeyBusy = `
SELECT k FROM unnest($1::text[]) AS k
WHERE (((SELECT true FROM {schema}.instances e
         WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
         LIMIT 1) IS NOT NULL
       OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k LIMIT 1) IS NOT NULL)
       OR (SELECT true FROM {schema}.instances e
           WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key_shard IS NOT NULL
           LIMIT 1) IS NOT NULL)`

	// sqlSlotsEnsure creates the missing counters of the given (key, shard)
	// list (sorted by the caller). Existing counters are neither changed nor
	// locked, so that a claim never waits for a transaction that frees slots.
	sqlSlotsEnsure = `
INSERT INTO {schema}.key_slots AS s (key, shard, capacity, available)
SELECT x.key, x.shard, x.capacity, x.capacity
FROM unnest($1::text[], $2::int[], $3::int[]) WITH ORDINALITY AS x(key, shard, capacity, ord)
WHERE NOT EXISTS (SELECT 1 FROM {schema}.key_slots e WHERE e.key = x.key AND e.shard = x.shard)
ORDER BY x.ord
ON CONFLICT (key, shard) DO NOTHING`

	// sqlSlotsTryLock locks and reads the counters of the given keys that no
	// other transaction holds, in (key, shard) order, with how many counters
	// each key has: a key with fewer rows locked than it has is held by a
	// transaction that frees or takes its slots, and is left for a later
	// claim. The count is a second statement's snapshot, so it sees any
	// counter created before the locks were taken. Lock order (3).
	sqlSlotsTryLock = `
SELECT key, shard, capacity, available FROM {schema}.key_slots
WHERE key = ANY ($1::text[]) ORDER BY key, shard FOR UPDATE SKIP LOCKED`
	// sqlSlotsCount counts the counters of each key of $1 (see
	// sqlSlotsTryLock) and reads the limit each key runs under now (the
	// key-limit lookup; see sql.go). A limit change writes the limit
	// before it locks the key's counters, and commits both together: once
	// a claim holds the counters, this second statement's snapshot reads
	// the limit they were shaped by. The window's may be older: planned
	// with it, a claim would block the rows a raise just promoted, with
	// the raise's slots free and nothing left to promote them.
	sqlSlotsCount = `
SELECT s.key, count(*), l."limit", l.shards FROM {schema}.key_slots s
LEFT JOIN LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk
                   WHERE lk.name IN (s.key, split_part(s.key, ':', 1)) ORDER BY length(lk.name) DESC LIMIT 1) l ON true
WHERE s.key = ANY ($1::text[])
GROUP BY s.key, l."limit", l.shards`

	// sqlSlotsRead reads, without locking them, the counters of the given
	// keys with their epochs and, from the same snapshot, the limit of
	// each key's name (NULL: none): what an optimistic claim plans with
	// (see admission.go). A limit change rewrites the limit and every
	// counter in one transaction, so the two agree. The limit comes from
	// the key-limit lookup (see sql.go).
	sqlSlotsRead = `
SELECT s.key, s.shard, s.capacity, s.available, s.epoch, l."limit", l.shards
FROM {schema}.key_slots s
LEFT JOIN LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk
                   WHERE lk.name IN (s.key, split_part(s.key, ':', 1)) ORDER BY length(lk.name) DESC LIMIT 1) l ON true
WHERE s.key = ANY ($1::text[])
ORDER BY s.key, s.shard`

	// sqlDebitChecked is an optimistic claim's debit, its last statement
	// before the commit, after sqlSlotsLockExisting locked the counters
	// (waiting, in (key, shard) order): it takes $3[i] slots from shard
	// $2[i] of key $1[i] only if that counter still has the capacity $4[i]
	// and epoch $5[i] the claim read and room for them, and fails the
	// transaction (debit_check) unless every counter passed.
	sqlDebitChecked = `
WITH d AS (
    UPDATE {schema}.key_slots s SET available = s.available - w.n
    FROM unnest($1::text[], $2::int[], $3::int[], $4::int[], $5::bigint[]) AS w(key, shard, n, capacity, epoch)
    WHERE s.key = w.key AND s.shard = w.shard
      AND s.available >= w.n AND s.capacity = w.capacity AND s.epoch = w.epoch
    RETURNING 1)
SELECT {schema}.debit_check((SELECT count(*) FROM d), cardinality($1::text[]))`

	// sqlFlagHolders marks the executing rows that hold the K = 1 keys $1
	// as having waiters (see migration 013), skipping the rows another
	// transaction holds locked: an outcome ending them, which reads the
	// flag under that lock, or a heartbeat. It must run before rows of
	// those keys are blocked (sqlBlock and sqlBlockBacklog block a K = 1
	// row only behind a marked holder), in the same transaction, so that
	// the holder's end, which waits for this transaction's lock on it,
	// sees the mark. A holder this claim made executing is its own to mark.
	// The holders are found by the marked-holder mark, as in
	// sqlPromoteIfRoom (see sql.go): one entry of instances_key_one_posix per
	// key. Lock order (4): holders, SKIP LOCKED.
	sqlFlagHolders = `
UPDATE {schema}.instances i SET waiters = true
WHERE i.id = ANY (ARRAY(SELECT h.id FROM unnest($1::text[]) AS k
                        CROSS JOIN LATERAL (SELECT e.id FROM {schema}.instances e
                                            WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL
                                              AND e.key_shard IS NULL AND NOT e.waiters
                                            LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED) h))`

	// sqlBlock takes rows of saturated keys off the pick path: a row of a
	// K = 1 key of $3 only behind a holder marked as having waiters (the
	// waited-on check, as in sqlBlockBacklog; see sql.go), and otherwise it
	// stays ready. The rows are the claim's window, locked already.
	sqlBlock = `
UPDATE {schema}.instances i SET status = 'blocked', updated_at = coalesce($2::timestamptz, now())
WHERE i.id = ANY ($1::uuid[]) AND i.status = 'ready'
  AND (SELECT (NOT (k = ANY (one))
               OR (SELECT true FROM {schema}.instances e
                   WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
                     AND e.waiters LIMIT 1) IS NOT NULL
               OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k LIMIT 1) IS NOT NULL)
       FROM (SELECT i.key AS k, $3::text[] AS one) x)`

	// sqlBlockBacklog moves up to $2 more due ready rows of each saturated
	// key the claim admitted none of ($1: admission.Plan.Backlog; one of
	// the K = 1 keys $5 only behind a marked holder: the waited-on check,
	// as in sqlBlock) off the pick path, past the key's first $4
	// (admission.ReadyCap) ready rows, so that a key's deep backlog does
	// not keep filling the window. A key with fewer rows waiting keeps them
	// ready, as an insert leaves them (see admission.InsertBlocked): taking
	// turns by rounds, each usually comes up after the last one ended, and
	// blocking them all on one conflict cost each a promotion (make bench's
	// scenario 2, ten rows per key, fell from about 18,000 to 9,000 steps/s
	// once the engine claimed ahead and so conflicted more often).
	sqlBlockBacklog = `
WITH d AS MATERIALIZED (
    SELECT b.id FROM (SELECT k FROM unnest($1::text[]) AS k
                      WHERE (SELECT (NOT (k = ANY (one))
                                     OR (SELECT true FROM {schema}.instances e
                                         WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL
                                           AND e.key_shard IS NULL AND e.waiters LIMIT 1) IS NOT NULL
                                     OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k LIMIT 1) IS NOT NULL)
                             FROM (SELECT k, $5::text[] AS one) x)) s
    CROSS JOIN LATERAL (SELECT id FROM {schema}.instances
                        WHERE key = s.k AND status = 'ready' COLLATE "POSIX" AND run_at <= coalesce($3::timestamptz, now())
                        ORDER BY priority, run_at, seq OFFSET $4 LIMIT $2 FOR UPDATE SKIP LOCKED) b)
UPDATE {schema}.instances i SET status = 'blocked', updated_at = coalesce($3::timestamptz, now())
WHERE i.id = ANY (ARRAY(SELECT id FROM d))`

	// sqlDebit takes slots from counters this transaction has locked.
	sqlDebit = `
UPDATE {schema}.key_slots s SET available = s.available - d.n
FROM unnest($1::text[], $2::int[], $3::int[]) AS d(key, shard, n)
WHERE s.key = d.key AND s.shard = d.shard`

	// sqlClaim moves the admitted rows to executing with a new fence and
	// returns them in admission order, each with the oldest unconsumed signal
	// its await was woken by. A row admitted under K = 1 (shard -1) is
	// moved only while no row of its key executes: the window read the key
	// before the claim held its lock (sqlClaimCandidates), and a
	// transaction that made one of the key's rows executing may have
	// committed in between (the executing check, as in sqlKeyBusy, read in
	// the update's own snapshot). Such a row stays ready. Its SET is the
	// move to executing, as in sqlHandOff (a row that takes a K = 1 key
	// with blocked rows, and every row of several keys, is marked as having
	// waiters: see sqlClaimMulti), and it returns the
	// claimed rows, as sqlClaimReserve, sqlHandOff and sqlReserve do (see
	// sql.go). A row of several keys whose key column holds another of its
	// keys than its first (the key it last waited in line for) gets its
	// first key there in the same update ($6, intent $7, its shard in $4)
	// and its other keys ($8, the other keys' text: see keysText); NULLs
	// (or $6 shorter than $1) leave a row's keys as they are. Its
	// executing check reads the key the row ends with in its key column.
	// So such a row is written once: a second update would write each of
	// its indexes again. The rows are also found by id =
	// ANY ($1), as the hand-off's are: joined only to the batch, on a table
	// without statistics (fresh, before its first ANALYZE) the planner read
	// every ready row of the primary key into a hash, 3.5–5.4 ms a claim of
	// 100 rows at 5,000 rows (the peers' keyed run, auto_explain;
	// TestHotPathPlansUseIndexes).
	sqlClaim = `
WITH t AS (SELECT coalesce($5::timestamptz, now()) AS now),
c AS (
    UPDATE {schema}.instances i
    SET status = 'executing', worker = $2, fence = nextval('{schema}.fence_seq'),
        lease_expires_at = t.now + $3::bigint * interval '1 microsecond',
        started_at = t.now, key_shard = nullif(a.shard, -1), updated_at = t.now,
        waiters = i.extra_keys IS NOT NULL
                  OR a.shard < 0 AND i.key IS NOT NULL
                  AND (SELECT ((SELECT true FROM {schema}.instances b
                                WHERE b.key = k AND b.status = 'blocked' COLLATE "POSIX" AND b.worker IS NULL
                                LIMIT 1) IS NOT NULL)
                       FROM (SELECT i.key AS k) x),
        key = coalesce(a.first, i.key),
        key_intent = CASE WHEN a.first IS NULL THEN i.key_intent ELSE a.intent END,
        extra_keys = CASE WHEN a.first IS NULL THEN i.extra_keys
                          ELSE (SELECT array_agg(split_part(e, E'\x1e', 1) ORDER BY n) FROM unnest(string_to_array(nullif(a.extras, ''), E'\x1f')) WITH ORDINALITY AS u(e, n)) END,
        extra_intents = CASE WHEN a.first IS NULL THEN i.extra_intents
                             ELSE (SELECT array_agg(split_part(e, E'\x1e', 2) ORDER BY n) FROM unnest(string_to_array(nullif(a.extras, ''), E'\x1f')) WITH ORDINALITY AS u(e, n)) END
    FROM unnest($1::uuid[], $4::int[], $6::text[], $7::text[], $8::text[]) WITH ORDINALITY AS a(id, shard, first, intent, extras, ord), t
    WHERE i.id = a.id AND i.id = ANY ($1::uuid[]) AND i.status = 'ready'
      AND (i.key IS NULL OR a.shard >= 0
           OR NOT (SELECT (((SELECT true FROM {schema}.instances e
                             WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
                             LIMIT 1) IS NOT NULL
                           OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k LIMIT 1) IS NOT NULL)
                           OR (SELECT true FROM {schema}.instances e
                               WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key_shard IS NOT NULL
                               LIMIT 1) IS NOT NULL)
                   FROM (SELECT coalesce(a.first, i.key) AS k) x))
    RETURNING i.*, a.ord
)
SELECT id::text, workflow, version, queue, priority, status, step, state, attempt,
       coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
       CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
       timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
       coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
       coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents,
       sg.sig_id, sg.sig_name, sg.sig_payload, sg.sig_dedup, sg.sig_created
FROM c
LEFT JOIN LATERAL (
    SELECT s.id AS sig_id, s.name AS sig_name, s.payload AS sig_payload,
           coalesce(s.dedup_key, '') AS sig_dedup, s.created_at AS sig_created
    FROM {schema}.signals s
    WHERE s.instance_id = c.id AND s.name = c.await_signal AND s.consumed_at IS NULL AND NOT c.timed_out
    ORDER BY s.id LIMIT 1) sg ON true
ORDER BY c.ord`

	// sqlClaimReserve reserves rows of the window ($1, locked by
	// sqlClaimCandidates) for worker $2 as successors of the rows $5 that
	// this claim made executing (admission.Plan.Reserved), as sqlReserve
	// does for a hand-off; a row whose predecessor sqlClaim left ready (a
	// K = 1 key taken meanwhile) is not reserved, and stays ready. The
	// rows are looked up as sqlReserve's are (the reservable-row probe: a
	// join with the batch went quadratic on a table without statistics),
	// and made reservations by the same SET; each
	// predecessor by id: its status check is written COLLATE "C" (see
	// sql.go) so that no plan reads instances_active whole instead, as an
	// analyzed table's custom plan did.
	sqlClaimReserve = `
WITH t AS (SELECT coalesce($4::timestamptz, now()) AS now),
c AS (
    UPDATE {schema}.instances i
    SET status = 'blocked', worker = $2, fence = nextval('{schema}.fence_seq'),
        lease_expires_at = t.now + $3::bigint * interval '1 microsecond', updated_at = t.now
    FROM (SELECT a.id, a.ord
          FROM (SELECT * FROM unnest($1::uuid[], $5::uuid[]) WITH ORDINALITY AS a(id, after, ord) ORDER BY a.id) a
          CROSS JOIN LATERAL (SELECT r.id FROM {schema}.instances r
                              WHERE r.id = a.id AND r.status IN ('ready', 'blocked') AND r.worker IS NULL
                              FOR NO KEY UPDATE) r
          WHERE EXISTS (SELECT 1 FROM {schema}.instances h
                        WHERE h.id = a.after AND h.status = 'executing' COLLATE "C" AND h.worker = $2)) a, t
    WHERE i.id = a.id AND i.status = 'ready' AND i.worker IS NULL
    RETURNING i.*, a.ord
)
SELECT id::text, workflow, version, queue, priority, status, step, state, attempt,
       coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
       CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
       timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
       coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
       coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents,
       sg.sig_id, sg.sig_name, sg.sig_payload, sg.sig_dedup, sg.sig_created
FROM c
LEFT JOIN LATERAL (
    SELECT s.id AS sig_id, s.name AS sig_name, s.payload AS sig_payload,
           coalesce(s.dedup_key, '') AS sig_dedup, s.created_at AS sig_created
    FROM {schema}.signals s
    WHERE s.instance_id = c.id AND s.name = c.await_signal AND s.consumed_at IS NULL AND NOT c.timed_out
    ORDER BY s.id LIMIT 1) sg ON true
ORDER BY c.ord`

	// sqlNextDue is the earliest time a delayed row or an await timeout of the queue falls due.
	sqlNextDue = `
SELECT least(
    (SELECT min(run_at) FROM {schema}.instances WHERE status = 'scheduled' AND queue = $1),
    (SELECT min(timeout_at) FROM {schema}.instances
     WHERE status = 'awaiting' AND queue = $1 AND timeout_at IS NOT NULL))`
)
