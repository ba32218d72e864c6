package postgres

// Statements that free slots (see slots.go).
// The rules every statement follows (static text, arrays for batches, the
// clock as a parameter, the lock order) are written at the top of sql.go.

// Freeing slots: what every path out of executing runs after it (see slots.go).
const (
	// sqlHoldsEnd deletes the key_holds rows (see migration 025) of the
	// rows $1 whose claim has ended (no longer executing under the hold's
	// fence): a release, earlier in the transaction. It returns
	// each hold's key and shard (-1: K = 1), the slots the caller frees. A
	// batch of rows of one key finds no hold: one probe of the primary key
	// per row, of a table that holds only executing rows of several keys.
	sqlHoldsEnd = `
DELETE FROM {schema}.key_holds h
WHERE h.instance_id = ANY ($1::uuid[])
  AND NOT EXISTS (SELECT 1 FROM {schema}.instances i
                  WHERE i.id = h.instance_id AND i.fence = h.fence AND i.status = 'executing' COLLATE "C")
RETURNING h.key, coalesce(h.shard, -1)`

	// sqlHoldsDelete deletes the key_holds rows of the rows $1, whose
	// claims the transaction ended (an outcome batch, which read them with
	// sqlCompleteApply).
	sqlHoldsDelete = `DELETE FROM {schema}.key_holds WHERE instance_id = ANY ($1::uuid[])`

	// sqlHoldsOrphaned deletes every key_holds row whose claim has ended,
	// up to $1 of them: a reaper's sweep, after it took claims back in the
	// same transaction, and the reconciler's, for holds a path missed.
	// Returned as sqlHoldsEnd's.
	sqlHoldsOrphaned = `
DELETE FROM {schema}.key_holds h
WHERE (h.instance_id, h.key) IN (
    SELECT o.instance_id, o.key FROM {schema}.key_holds o
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.instances i
                      WHERE i.id = o.instance_id AND i.fence = o.fence AND i.status = 'executing' COLLATE "C")
    ORDER BY o.instance_id, o.key LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING h.key, coalesce(h.shard, -1)`
)

const (
	// sqlKeyLock takes the advisory lock of each K = 1 key ($1, sorted),
	// waiting for claims that hold it.
	sqlKeyLock = `SELECT pg_advisory_xact_lock(hashtextextended(k, $2::bigint)) FROM unnest($1::text[]) AS k`

	// sqlSlotsLockExisting locks counters in (key, shard) order before a credit.
	sqlSlotsLockExisting = `
SELECT 1 FROM {schema}.key_slots
WHERE (key, shard) IN (SELECT * FROM unnest($1::text[], $2::int[]))
ORDER BY key, shard FOR UPDATE`

	// sqlCredit returns $3[i] slots to shard $2[i] of key $1[i] as
	// admission.Credit decides: that function is the rule's one statement
	// (and says why it cannot over-admit and leaves no drift); this and
	// sqlSlotsDropEmpty are its PostgreSQL form, pinned equal to it by
	// TestCreditMatchesAdmission. In short: never above capacity, and a
	// shard that a lowered limit or shard count left larger than its
	// name's limit gives it (see resizeShards) shrinks, its freed slots
	// going back to the limit, until it is down to its share (0 for a shard
	// the limit no longer has): slots in use become max(0, used − n) and
	// capacity max(min(capacity, share), in use). Counters of a name with
	// no limit keep their capacity (SyncKeyLimits deletes them). The limit
	// comes from the key-limit lookup (see sql.go); the counters are
	// locked already (sqlSlotsLockExisting, lock order (3)).
	sqlCredit = `
WITH x AS (
    SELECT s.key, s.shard, greatest(0, s.capacity - s.available - d.n) AS used,
           CASE WHEN l.name IS NULL THEN s.capacity
                WHEN s.shard >= l.shards THEN 0
                ELSE least(s.capacity, l."limit" / l.shards + CASE WHEN s.shard < l."limit" % l.shards THEN 1 ELSE 0 END)
           END AS share
    FROM unnest($1::text[], $2::int[], $3::int[]) AS d(key, shard, n)
    JOIN {schema}.key_slots s ON s.key = d.key AND s.shard = d.shard
    LEFT JOIN LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk
                       WHERE lk.name IN (s.key, split_part(s.key, ':', 1)) ORDER BY length(lk.name) DESC LIMIT 1) l ON true
)
UPDATE {schema}.key_slots s
SET capacity = greatest(x.share, x.used), available = greatest(x.share, x.used) - x.used
FROM x WHERE s.key = x.key AND s.shard = x.shard`

	// sqlSlotsDropEmpty deletes, among the counters a credit touched, those
	// left with no capacity (admission.Credit's drop): shards the limit no
	// longer has, once the last row they admitted is gone. Claims never
	// create or draw from them.
	sqlSlotsDropEmpty = `
DELETE FROM {schema}.key_slots
WHERE (key, shard) IN (SELECT * FROM unnest($1::text[], $2::int[])) AND capacity = 0`

	// sqlKeysWaiting returns a row when a key of $1 has a row waiting for
	// a slot: a ready row, or a blocked one that is not a reservation (see
	// store.OutcomeResult.Unwaited); it stops at the first. It runs after
	// the freeing transaction's promotions, in its snapshot of them. The
	// probes are scalar subqueries, one key's index entry each: written as
	// EXISTS, a plan may hash one of them instead, reading every blocked row
	// of the table once.
	sqlKeysWaiting = `
SELECT 1 FROM unnest($1::text[]) AS k
WHERE (SELECT true FROM {schema}.instances WHERE key = k AND status = 'ready' COLLATE "POSIX" LIMIT 1)
   OR (SELECT true FROM {schema}.instances WHERE key = k AND status = 'blocked' COLLATE "POSIX" AND worker IS NULL LIMIT 1)
LIMIT 1`

	// sqlPromote makes the first $2[i] blocked rows of each key $1[i]
	// (priority, then FIFO; reserved rows are not waiting: see
	// sqlReserve) ready and returns their queues, which the caller
	// notifies once its transaction has committed (strandedKeys.queues):
	// a NOTIFY in a freeing transaction would hold PostgreSQL's
	// notification lock from its pre-commit to the end of its commit,
	// and every other notifying transaction would wait for it (see
	// wakeSender). It must not wait
	// for row locks, so it skips locked rows: under READ COMMITTED a row lock
	// is also left on rows that failed a locking statement's recheck (a
	// claim's window keeps the lock of a row it saw ready but found blocked;
	// this very statement keeps the lock of a row it saw blocked but found
	// claimed), and waiting for such locks deadlocked with outcome batches.
	// It locks FOR NO KEY UPDATE, which a signal's FOR KEY SHARE does not
	// block. A K = 1 key with no blocked row to promote may have its next
	// row ready (a claim that found the key busy leaves its only row in
	// sight ready: see admission.Decide): the queue of that row is returned
	// too, so that an idle engine claims it now rather than at its next poll.
	// It returns a row (queue, n, '') per queue to notify, a row ('', n,
	// key) per gate key of which it promoted n > 0 rows, and a row
	// ('', 0, key) per key it left stranded (the stranded check, as in
	// sqlStranded; see sql.go) because it skipped locked rows: a key
	// ($4[i]: K = 1) of which it promoted nothing, or a gate key of which
	// it promoted fewer than $2[i] rows while a blocked row it did not
	// promote is left (its free slots would otherwise wait, every row
	// behind them blocked, for the reconciler's sweep). In this statement's snapshot the rows
	// it promotes are still blocked, not ready, so a gate key it promoted
	// some rows of can be reported although they fill its room: the heal
	// then promotes nothing. The freeing call retries the keys after its
	// commit (see heal). The promoted rows are read through instances_key_blocked_posix and
	// locked SKIP LOCKED (lock order (4)).
	sqlPromote = `
WITH f AS (SELECT * FROM unnest($1::text[], $2::int[], $4::bool[]) AS f(key, n, one)),
d AS MATERIALIZED (
    SELECT f.key, b.id FROM f
    CROSS JOIN LATERAL (SELECT id FROM {schema}.instances
                        WHERE key = f.key AND status = 'blocked' COLLATE "POSIX" AND worker IS NULL
                        ORDER BY priority, run_at, seq LIMIT f.n FOR NO KEY UPDATE SKIP LOCKED) b),
p AS (
    UPDATE {schema}.instances i SET status = 'ready', updated_at = coalesce($3::timestamptz, now())
    WHERE i.id = ANY (ARRAY(SELECT id FROM d))
    RETURNING i.queue
)
SELECT q.queue, q.n, '' FROM (SELECT queue, count(*) AS n FROM p GROUP BY queue) q
UNION ALL
SELECT r.queue, 0, '' FROM (
    SELECT DISTINCT r.queue FROM f
    CROSS JOIN LATERAL (SELECT queue FROM {schema}.instances
                        WHERE key = f.key AND status = 'ready' COLLATE "POSIX" AND key IS NOT NULL
                        ORDER BY priority, run_at, seq LIMIT 1) r
    WHERE f.one AND NOT EXISTS (SELECT 1 FROM d WHERE d.key = f.key)) r
UNION ALL
SELECT '', 0, f.key FROM f
WHERE (NOT EXISTS (SELECT 1 FROM d WHERE d.key = f.key)
       OR (NOT f.one AND (SELECT count(*) FROM d WHERE d.key = f.key) < f.n
           AND (SELECT true FROM {schema}.instances b
                WHERE b.key = f.key AND b.status = 'blocked' COLLATE "POSIX" AND b.worker IS NULL
                  AND b.id <> ALL (ARRAY(SELECT d.id FROM d WHERE d.key = f.key))
                ORDER BY b.priority, b.run_at, b.seq LIMIT 1)))
  AND coalesce((SELECT true FROM {schema}.instances b WHERE b.key = f.key AND b.status = 'blocked' COLLATE "POSIX" AND b.worker IS NULL
                ORDER BY b.priority, b.run_at, b.seq LIMIT 1), false)
  AND CASE WHEN f.one
           THEN (SELECT true FROM {schema}.instances r WHERE r.key = f.key AND r.status = 'ready' COLLATE "POSIX"
                 ORDER BY r.priority, r.run_at, r.seq LIMIT 1) IS NULL
                AND (((SELECT true FROM {schema}.instances e
                       WHERE e.key = f.key AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
                       LIMIT 1) IS NULL
                     AND (SELECT true FROM {schema}.key_holds kh WHERE kh.key = f.key LIMIT 1) IS NULL
                      AND (SELECT true FROM {schema}.instances e
                           WHERE e.key = f.key AND e.status = 'executing' COLLATE "POSIX" AND e.key_shard IS NOT NULL
                           LIMIT 1) IS NULL)
                     OR (SELECT (SELECT true FROM {schema}.instances e
                                 WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
                                   AND NOT e.waiters LIMIT 1) IS NOT NULL
                         FROM (SELECT f.key AS k) x))
           ELSE (SELECT a.n > (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances r
                                                     WHERE r.key = f.key AND r.status = 'ready' COLLATE "POSIX"
                                                     ORDER BY r.priority, r.run_at, r.seq LIMIT a.n) r)
                 FROM (SELECT coalesce(sum(s.available), 1) AS n FROM {schema}.key_slots s WHERE s.key = f.key) a) END
UNION ALL
SELECT '', count(*), d.key FROM d JOIN f ON f.key = d.key WHERE NOT f.one GROUP BY d.key`
)

// Handing freed slots off (see slots.go, handOff). The reads run in the
// outcome transaction's first round trip, after the outcomes are applied:
// they name the keys by the ids of the outcomes whose claims were
// contended ($1), as their rows now carry them (a key an outcome changed
// is read under its new name: its old one frees the usual way).
const (
	// sqlHandOffLock takes the advisory locks of the held K = 1 keys (names
	// with no limit), in key order, waiting, as sqlKeyLock does;
	// sqlHandOffBusy then returns the ones that still have an executing row
	// (the executing check, as in sqlKeyBusy; see sql.go, but blind to the
	// holds of the rows $1, whose claims the outcomes ended and whose holds
	// this transaction deletes), read after the locks, once per K = 1 key.
	// Both read the held keys (held) from the rows $1 by primary key, with
	// the keys they hold as other keys (key_holds), as sqlHandOffGates does.
	// Lock order (2): the K = 1 key locks, after the outcome rows (1).
	sqlHandOffLock = `
WITH held AS (SELECT key FROM {schema}.instances WHERE id = ANY ($1::uuid[]) AND key IS NOT NULL
              UNION SELECT key FROM {schema}.key_holds WHERE instance_id = ANY ($1::uuid[])),
one AS MATERIALIZED (
    SELECT k.key, pg_advisory_xact_lock(hashtextextended(k.key, $2::bigint))
    FROM (SELECT h.key FROM held h
          WHERE NOT EXISTS (SELECT 1 FROM {schema}.limits l WHERE l.name = split_part(h.key, ':', 1))
          ORDER BY h.key OFFSET 0) k)
SELECT key FROM one`
	// sqlHandOffBusy: see sqlHandOffLock.
	sqlHandOffBusy = `
WITH held AS (SELECT key FROM {schema}.instances WHERE id = ANY ($1::uuid[]) AND key IS NOT NULL
              UNION SELECT key FROM {schema}.key_holds WHERE instance_id = ANY ($1::uuid[])),
one AS MATERIALIZED (
    SELECT h.key FROM held h
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.limits l WHERE l.name = split_part(h.key, ':', 1)))
SELECT k FROM (SELECT key AS k FROM one) o
WHERE (((SELECT true FROM {schema}.instances e
         WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
         LIMIT 1) IS NOT NULL
       OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k AND kh.instance_id <> ALL ($1::uuid[]) LIMIT 1) IS NOT NULL)
       OR (SELECT true FROM {schema}.instances e
           WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key_shard IS NOT NULL
           LIMIT 1) IS NOT NULL)`

	// sqlHandOffGates returns, for each held key whose name has a limit,
	// the limit (the key-limit lookup; see sql.go) and every counter of the
	// key (read, not locked: a hand-off does not write them).
	sqlHandOffGates = `
WITH held AS (SELECT key FROM {schema}.instances WHERE id = ANY ($1::uuid[]) AND key IS NOT NULL
              UNION SELECT key FROM {schema}.key_holds WHERE instance_id = ANY ($1::uuid[]))
SELECT h.key, l."limit", l.shards, s.shard, s.capacity, s.available
FROM held h
CROSS JOIN LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk
                    WHERE lk.name IN (h.key, split_part(h.key, ':', 1)) ORDER BY length(lk.name) DESC LIMIT 1) l
LEFT JOIN {schema}.key_slots s ON s.key = h.key
ORDER BY h.key, s.shard`

	// sqlHandOffTry tries the advisory locks of the keys $1 (sorted) that
	// are K = 1 keys (the K = 1 key test; see sql.go), never waiting, and
	// returns those it holds; sqlKeyBusy then returns, of the same keys,
	// those with an executing row, read after the locks. The keys are the
	// other keys of the rows of several keys at the head of a freed key's
	// line that no slot of the batch frees (admission.FreeState.Tried).
	// The freeing transaction runs them only when it already holds the
	// lock of every K = 1 key it frees, so that it waits for no K = 1 lock
	// once it holds one out of order (lock order (2)); a lock tried and
	// not used is held to the commit.
	sqlHandOffTry = `
SELECT k FROM unnest($1::text[]) AS x(k)
WHERE CASE WHEN NOT EXISTS (SELECT 1 FROM {schema}.limits l WHERE l.name = split_part(k, ':', 1))
           THEN pg_try_advisory_xact_lock(hashtextextended(k, $2::bigint)) ELSE false END`

	// sqlHandOffCandidates locks and returns the first n waiting rows
	// (ready or blocked, not reserved) of each held key, n being the sum
	// of the wants $2 of the rows $1 that hold it (see outcomeChains.wants;
	// at most one for a row that holds it as another key: a chain follows a
	// row's first key, so its successors are read there, and another key's
	// line is read for the hand-off of its slot, as when such rows asked for
	// no successors), in the key's line (queue, priority, round: the order of
	// instances_key_round, so that the read stops at the first rows of a
	// long line; a gate's rows of one round, its turns, come back first in,
	// first out), skipping rows others hold, like sqlPromote; a ready row of
	// the key that no claim has taken yet stands in the line before the
	// key's later blocked rows. Each comes with what a hand-off must know
	// of it: its turn (priority, round) and the first ready rows of its
	// queue that a claim would take before the group's last candidate, of
	// another key (a range of the keyed pick index that ends at the first
	// row of another key) and without a key (one probe of the keyless
	// pick index), of the workflow versions the worker runs ($3 the names,
	// $4 the versions, pairwise; none: every row; otherwise one such probe
	// per version, of its version pick index, as the claim's start row is
	// found: see sqlClaimCandidates), from which admission.InTurn decides
	// whether it is in turn; whether its queue has a policy, any of its keys
	// a rate limit; and its keys (a row of several keys takes a slot only
	// with a slot of each: admission.Waiting.Also). A held key is a key of a
	// row $1 or one it holds as another key (key_holds).
	//
	// The heads are read once per queue, not per key: the first ready row
	// of another key than a group's is the queue's first keyed ready row
	// (h1), unless that row is of the group's key, and then the first
	// ready row of another key than h1's (h2), read up to the last
	// candidate of h1's key's groups; either counts only before the
	// group's last candidate. The first keyless ready row (f1) counts for
	// a group of its priority or a worse one. Read per group instead, the
	// probes cost about two thirds of the read in a batch of many keys
	// (256 groups, three workflow versions: 11.8 of 18 ms in one plan
	// auto_explain logged); read per candidate, they walk a long line for
	// each (TestHandOffCandidatesReadTheTurnOncePerGroup).
	sqlHandOffCandidates = `
WITH held AS (SELECT k.key, sum(k.n)::int AS n
              FROM unnest($1::uuid[], $2::int[]) AS w(id, n)
              CROSS JOIN LATERAL (SELECT i.key, w.n FROM {schema}.instances i WHERE i.id = w.id AND i.key IS NOT NULL
                                  UNION ALL SELECT kh.key, least(w.n, 1) FROM {schema}.key_holds kh WHERE kh.instance_id = w.id) k(key, n)
              GROUP BY k.key),
c AS MATERIALIZED (
    SELECT b.* FROM held f
    CROSS JOIN LATERAL (SELECT id, key, key_name, key_intent, queue, workflow, version, priority, round, run_at, seq,
                               extra_keys, extra_intents
                        FROM {schema}.instances
                        WHERE key = f.key AND status IN ('ready', 'blocked') AND worker IS NULL
                        ORDER BY queue, priority, round LIMIT f.n FOR NO KEY UPDATE SKIP LOCKED) b),
gk AS MATERIALIZED (SELECT key, queue, priority, max(round) AS last FROM c GROUP BY key, queue, priority),
h1 AS MATERIALIZED (
    SELECT q.queue, o.key, o.priority, o.round FROM (SELECT DISTINCT queue FROM gk) q
    CROSS JOIN LATERAL (
        SELECT x.key, x.priority, x.round FROM (
            (SELECT r.key, r.priority, r.round FROM {schema}.instances r
             WHERE cardinality($3::text[]) = 0 AND r.status = 'ready' AND r.key IS NOT NULL AND r.queue = q.queue
             ORDER BY r.priority, r.round LIMIT 1)
            UNION ALL
            SELECT w.key, w.priority, w.round FROM unnest($3::text[], $4::int[]) AS wf(name, version)
            CROSS JOIN LATERAL (SELECT r.key, r.priority, r.round FROM {schema}.instances r
                                WHERE r.status = 'ready' COLLATE "C" AND r.key IS NOT NULL AND r.queue = q.queue
                                  AND r.workflow = wf.name AND r.version = wf.version
                                ORDER BY r.priority, r.round LIMIT 1) w) x
        ORDER BY x.priority, x.round LIMIT 1) o),
h2 AS MATERIALIZED (
    SELECT h.queue, o.priority, o.round FROM h1 h
    CROSS JOIN LATERAL (SELECT g.priority, g.last FROM gk g WHERE g.queue = h.queue AND g.key = h.key
                        ORDER BY g.priority DESC, g.last DESC LIMIT 1) b
    CROSS JOIN LATERAL (
        SELECT x.priority, x.round FROM (
            (SELECT r.priority, r.round FROM {schema}.instances r
             WHERE cardinality($3::text[]) = 0 AND r.status = 'ready' AND r.key IS NOT NULL AND r.queue = h.queue
               AND (r.priority, r.round) < (b.priority, b.last) AND r.key <> h.key
             ORDER BY r.priority, r.round LIMIT 1)
            UNION ALL
            SELECT w.priority, w.round FROM unnest($3::text[], $4::int[]) AS wf(name, version)
            CROSS JOIN LATERAL (SELECT r.priority, r.round FROM {schema}.instances r
                                WHERE r.status = 'ready' COLLATE "C" AND r.key IS NOT NULL AND r.queue = h.queue
                                  AND r.workflow = wf.name AND r.version = wf.version
                                  AND (r.priority, r.round) < (b.priority, b.last) AND r.key <> h.key
                                ORDER BY r.priority, r.round LIMIT 1) w) x
        ORDER BY x.priority, x.round LIMIT 1) o),
f1 AS MATERIALIZED (
    SELECT q.queue, o.priority, o.round FROM (SELECT DISTINCT queue FROM gk) q
    CROSS JOIN LATERAL (
        SELECT x.priority, x.round FROM (
            (SELECT r.priority, r.round FROM {schema}.instances r
             WHERE cardinality($3::text[]) = 0 AND r.status = 'ready' AND r.key IS NULL AND r.queue = q.queue
             ORDER BY r.priority, r.round LIMIT 1)
            UNION ALL
            SELECT w.priority, w.round FROM unnest($3::text[], $4::int[]) AS wf(name, version)
            CROSS JOIN LATERAL (SELECT r.priority, r.round FROM {schema}.instances r
                                WHERE r.status = 'ready' COLLATE "C" AND r.key IS NULL AND r.queue = q.queue
                                  AND r.workflow = wf.name AND r.version = wf.version
                                ORDER BY r.priority, r.round LIMIT 1) w) x
        ORDER BY x.priority, x.round LIMIT 1) o),
g AS (
    SELECT g.key, g.queue, g.priority, o.priority AS other_priority, o.round AS other_round,
           f.priority AS free_priority, f.round AS free_round
    FROM gk g
    LEFT JOIN h1 ON h1.queue = g.queue
    LEFT JOIN h2 ON h2.queue = g.queue
    LEFT JOIN LATERAL (
        SELECT x.priority, x.round FROM (SELECT h1.priority, h1.round WHERE h1.key <> g.key
                                         UNION ALL
                                         SELECT h2.priority, h2.round WHERE h1.key = g.key) x
        WHERE (x.priority, x.round) < (g.priority, g.last)) o ON true
    LEFT JOIN f1 f ON f.queue = g.queue AND f.priority <= g.priority)
SELECT c.id::text, c.key, c.queue, c.workflow, c.version, c.priority, c.round,
       g.other_priority, g.other_round, g.free_priority, g.free_round,
       EXISTS (SELECT 1 FROM {schema}.queue_policies p WHERE p.queue = c.queue),
       EXISTS (SELECT 1 FROM {schema}.rate_limits rl
               WHERE rl.name = c.key_name
                  OR (c.extra_keys IS NOT NULL AND rl.name = ANY (ARRAY(SELECT split_part(x, ':', 1) FROM unnest(c.extra_keys) x)))),
       c.key_intent, c.extra_keys, c.extra_intents
FROM c JOIN g ON g.key = c.key AND g.queue = c.queue AND g.priority = c.priority
ORDER BY c.key, c.queue, c.priority, c.round, c.run_at, c.seq`

	// sqlHandOff moves the rows a hand-off chose from ready or blocked to
	// executing for worker $2, each with the freed shard it takes ($4[i];
	// -1: a K = 1 key), and returns them; its SET (the move to executing)
	// and its final SELECT (the claimed rows) are sqlClaim's (see sql.go).
	// A row of several keys gets its first key in its key column as
	// sqlClaim gives it ($7..$9, with its first key's shard in $4). A K = 1
	// row moves only while no row of its key executes (the executing check
	// of sqlKeyBusy, written out with the key read as the row's key column
	// after the update): the freeing transaction holds the key's lock and checked
	// that, so this only keeps a flaw from meeting the unique index, which
	// would refuse the whole outcome batch; a row of several keys moves
	// only when $6 names it (admission.Free gave it a slot of each of its
	// keys, and sqlClaimMulti follows with its holds): this keeps a flaw
	// from admitting it under one of its keys alone. The redundant id = ANY gives the
	// generic plan (hand-off transactions run generic plans) an index
	// condition: without it, it read the whole primary key, filtering on
	// status, and hash-joined the ids to it. The rows are locked already
	// (sqlHandOffCandidates).
	sqlHandOff = `
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
    FROM unnest($1::uuid[], $4::int[], $7::text[], $8::text[], $9::text[]) WITH ORDINALITY AS a(id, shard, first, intent, extras, ord), t
    WHERE i.id = a.id AND i.id = ANY ($1::uuid[]) AND i.status IN ('ready', 'blocked') AND i.worker IS NULL
      AND (i.extra_keys IS NULL OR i.id = ANY ($6::uuid[]))
      AND CASE WHEN a.shard >= 0 THEN true
               ELSE (SELECT true FROM {schema}.instances e
                     WHERE e.key = coalesce(a.first, i.key) AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
                     LIMIT 1) IS NULL
                   AND (SELECT true FROM {schema}.key_holds kh WHERE kh.key = coalesce(a.first, i.key) LIMIT 1) IS NULL
                AND (SELECT true FROM {schema}.instances e
                     WHERE e.key = coalesce(a.first, i.key) AND e.status = 'executing' COLLATE "POSIX" AND e.key_shard IS NOT NULL
                     LIMIT 1) IS NULL END
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

	// sqlSuccessorsLock locks, in id order, the reservations of worker $3
	// that outcomes name as their successors ($1, fences $2), and returns
	// those still reserved, with their queue. The outcome transaction runs
	// it in its first round trip and passes each locked one the slot of
	// its predecessor's outcome, if that outcome commits (sqlSucceed).
	// The batch, sorted by id, probes and locks each row in turn, as
	// sqlHeartbeat does.
	sqlSuccessorsLock = `
SELECT i.id::text, i.queue
FROM (SELECT * FROM unnest($1::uuid[], $2::bigint[]) AS x(id, fence) ORDER BY x.id) x
CROSS JOIN LATERAL (
    SELECT i.id, i.queue FROM {schema}.instances i
    WHERE i.id = x.id AND i.worker = $3 AND i.fence = x.fence AND i.status = 'blocked' COLLATE "C"
    FOR UPDATE) i`

	// sqlSucceed makes reservations of worker $2 (locked by
	// sqlSuccessorsLock) executing, each with the slot its predecessor's
	// outcome freed (shard $4[i]; -1: a K = 1 key), under a lease of $3 µs
	// from $5; the fence stays the reservation's, under which the worker
	// may already run the step. It returns their ids, fences and queues
	// (the worker has the rest from the reservations). A reservation that
	// takes a K = 1 key is marked as having waiters (see migration 013):
	// a claim may have blocked rows behind its predecessor, marked, that
	// this transaction's snapshot predates, and the key's slot passes on
	// without a freeing. So is a row of several keys, as every claim of one
	// is (see sqlClaim); its predecessor's holds pass to it next
	// (sqlHoldsPass).
	sqlSucceed = `
WITH t AS (SELECT coalesce($5::timestamptz, now()) AS now),
c AS (
    UPDATE {schema}.instances i
    SET status = 'executing', lease_expires_at = t.now + $3::bigint * interval '1 microsecond',
        started_at = t.now, key_shard = nullif(a.shard, -1), updated_at = t.now,
        waiters = a.shard < 0 OR i.extra_keys IS NOT NULL
    FROM unnest($1::uuid[], $4::int[]) AS a(id, shard), t
    WHERE i.id = a.id AND i.id = ANY ($1::uuid[]) AND i.worker = $2 AND i.status = 'blocked'
    RETURNING i.id::text, i.fence, i.queue
)
SELECT * FROM c`

	// sqlHoldsPass gives the holds of rows $1, whose outcomes the
	// transaction committed, to their successors $2 (a row of the same keys:
	// see admission.Free), which sqlSucceed made executing earlier in the
	// transaction, under the successor's fence: a chain passes every slot
	// its rows hold, as it passes the key column's. The holds are found by
	// their rows' ids, as sqlHoldsDelete finds them.
	sqlHoldsPass = `
UPDATE {schema}.key_holds h SET instance_id = x.succ, fence = i.fence
FROM unnest($1::uuid[], $2::uuid[]) AS x(pred, succ)
JOIN {schema}.instances i ON i.id = x.succ
WHERE h.instance_id = x.pred`

	// sqlReserve reserves waiting rows (locked by sqlHandOffCandidates) for
	// worker $2 as successors (store.Claimed.After): blocked, so that no
	// claim picks them, with the worker, a new fence and a lease of $3 µs
	// from $4, so that no promotion or hand-off takes them (they skip
	// blocked rows with a worker) and the reaper gives back the expired
	// ones. Each row is looked up by the reservable-row probe and made a
	// reservation by the reservation's SET, as in sqlClaimReserve, and it
	// returns the claimed rows, as sqlClaim does (see sql.go).
	sqlReserve = `
WITH t AS (SELECT coalesce($4::timestamptz, now()) AS now),
c AS (
    UPDATE {schema}.instances i
    SET status = 'blocked', worker = $2, fence = nextval('{schema}.fence_seq'),
        lease_expires_at = t.now + $3::bigint * interval '1 microsecond', updated_at = t.now
    FROM (SELECT a.id, a.ord
          FROM (SELECT * FROM unnest($1::uuid[]) WITH ORDINALITY AS a(id, ord) ORDER BY a.id) a
          CROSS JOIN LATERAL (SELECT r.id FROM {schema}.instances r
                              WHERE r.id = a.id AND r.status IN ('ready', 'blocked') AND r.worker IS NULL
                              FOR NO KEY UPDATE) r) a, t
    WHERE i.id = a.id AND i.status IN ('ready', 'blocked') AND i.worker IS NULL
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
)
