package postgres

// Statements of the maintenance sweeps (see maintenance.go).
// The rules every statement follows (static text, arrays for batches, the
// clock as a parameter, the lock order) are written at the top of sql.go.

// Timers, reaper, reconciler.
const (
	// sqlFireTimers makes up to $2 awaits whose timeout passed ready, each
	// at its fresh round (see sql.go), locking them SKIP LOCKED (lock order
	// (1)), and notifies their queues on channel $3.
	sqlFireTimers = `
WITH d AS MATERIALIZED (
    SELECT id FROM {schema}.instances
    WHERE status = 'awaiting' AND timeout_at IS NOT NULL AND timeout_at <= coalesce($1::timestamptz, now())
    ORDER BY timeout_at LIMIT $2 FOR UPDATE SKIP LOCKED),
w AS (
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
        updated_at = coalesce($1::timestamptz, now())
    WHERE i.id = ANY (ARRAY(SELECT id FROM d))
    RETURNING i.queue
)
SELECT q.queue, q.n FROM (SELECT queue, count(*) AS n FROM w GROUP BY queue) q
CROSS JOIN LATERAL (SELECT pg_notify($3, q.queue)) x`

	// sqlReap takes back up to $2 claims whose lease expired before $1,
	// and up to $2 such reservations (store.Claimed.After), which held no
	// slot (no key to free), read through instances_lease and
	// instances_reserved and locked SKIP LOCKED (lock order (1)). Its
	// UPDATE is the take-back, as in sqlReclaimWorker: each row of o ends,
	// at $1, ready with attempt + 1, or canceled when its cancel was
	// requested; it returns what takeBack needs to free the slot and count
	// a canceled child for its parent.
	sqlReap = `
WITH e AS MATERIALIZED (
    SELECT id, key AS old_key, key_shard AS old_shard FROM {schema}.instances
    WHERE status = 'executing' AND lease_expires_at < coalesce($1::timestamptz, now())
    ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED),
r AS MATERIALIZED (
    SELECT id, NULL::text AS old_key, NULL::int AS old_shard FROM {schema}.instances
    WHERE status = 'blocked' AND worker IS NOT NULL AND lease_expires_at < coalesce($1::timestamptz, now())
    ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED),
o AS (SELECT * FROM e UNION ALL SELECT * FROM r)
UPDATE {schema}.instances i
SET status = CASE WHEN i.cancel_requested THEN 'canceled' ELSE 'ready' END,
    attempt = CASE WHEN i.cancel_requested THEN i.attempt ELSE i.attempt + 1 END, worker = NULL, lease_expires_at = NULL,
    key_shard = NULL, started_at = NULL, updated_at = coalesce($1::timestamptz, now())
FROM o
WHERE i.id = o.id
RETURNING coalesce(o.old_key, ''), coalesce(o.old_shard, -1), i.queue,
          i.status, coalesce(i.parent_id::text, ''), i.join_gen`

	// sqlReclaimWorker takes back every claim and reservation of worker
	// $2, locked in id order (lock order (1)), by the take-back, as in
	// sqlReap. Its condition names the predicates of
	// instances_lease and instances_reserved: written as status IN (...),
	// it had no index path, and Start read the whole table (6 ms at
	// 20,000 rows).
	sqlReclaimWorker = `
WITH o AS MATERIALIZED (
    SELECT id, CASE WHEN status = 'executing' THEN key END AS old_key, key_shard AS old_shard
    FROM {schema}.instances
    WHERE (status = 'executing' OR (status = 'blocked' AND worker IS NOT NULL)) AND worker = $2
    ORDER BY id FOR UPDATE)
UPDATE {schema}.instances i
SET status = CASE WHEN i.cancel_requested THEN 'canceled' ELSE 'ready' END,
    attempt = CASE WHEN i.cancel_requested THEN i.attempt ELSE i.attempt + 1 END, worker = NULL, lease_expires_at = NULL,
    key_shard = NULL, started_at = NULL, updated_at = coalesce($1::timestamptz, now())
FROM o
WHERE i.id = o.id
RETURNING coalesce(o.old_key, ''), coalesce(o.old_shard, -1), i.queue,
          i.status, coalesce(i.parent_id::text, ''), i.join_gen`

	// sqlNotifyPolicyQueues notifies the queues of $1 that have a policy:
	// rows of theirs left executing, so capacity may have freed for claims
	// waiting in other engines.
	sqlNotifyPolicyQueues = `
SELECT pg_notify($2, q) FROM unnest($1::text[]) AS q
WHERE EXISTS (SELECT 1 FROM {schema}.queue_policies p WHERE p.queue = q)`

	// sqlNotifyQueues notifies each queue of $1.
	sqlNotifyQueues = `SELECT q FROM unnest($1::text[]) AS q CROSS JOIN LATERAL (SELECT pg_notify($2, q)) x`

	// sqlSlotsLockAll locks every counter in (key, shard) order.
	//
	// A sweep works through the counters in chunks of keys, one transaction
	// each, so that it never holds every counter's lock at once: a chunk is
	// the keys after $1 up to and including $2 (NULL: every key after $1).
	sqlSlotsLockAll = `
SELECT key, shard, capacity, available FROM {schema}.key_slots
WHERE key > $1 AND ($2::text IS NULL OR key <= $2::text) ORDER BY key, shard FOR UPDATE`

	// sqlSlotsChunkEnd is the last of the first $2 counter keys after $1,
	// and how many there are.
	sqlSlotsChunkEnd = `
SELECT max(key), count(*) FROM (SELECT DISTINCT key FROM {schema}.key_slots WHERE key > $1 ORDER BY key LIMIT $2) k`

	// sqlGateHolders counts, over the chunk's keys ($1, $2 as above),
	// executing rows per (key, shard) for gated rows, and per key for rows
	// of limited names admitted at K = 1 (shard -1), then the same of the
	// holds of rows of several keys (key_holds; the caller adds the counts
	// up).
	sqlGateHolders = `
SELECT key, key_shard, count(*) FROM {schema}.instances
WHERE status = 'executing' COLLATE "POSIX" AND key_shard IS NOT NULL AND key > $1 AND ($2::text IS NULL OR key <= $2::text)
GROUP BY key, key_shard
UNION ALL
SELECT i.key, -1, count(*) FROM {schema}.instances i JOIN {schema}.limits l ON l.name = i.key_name
WHERE i.status = 'executing' COLLATE "POSIX" AND i.key IS NOT NULL AND i.key_shard IS NULL
  AND i.key > $1 AND ($2::text IS NULL OR i.key <= $2::text)
GROUP BY i.key
UNION ALL
SELECT h.key, coalesce(h.shard, -1), count(*) FROM {schema}.key_holds h
WHERE h.key > $1 AND ($2::text IS NULL OR h.key <= $2::text)
  AND (h.shard IS NOT NULL OR EXISTS (SELECT 1 FROM {schema}.limits l WHERE l.name = split_part(h.key, ':', 1)))
GROUP BY h.key, h.shard`

	// sqlSlotsInsert creates counters or overwrites them, with a new epoch
	// (see sqlDebitChecked); the caller holds the locks of the counters it
	// overwrites (it read them under those locks, with the holders read
	// after them).
	//
	// sqlSlotsCreate creates counters that did not exist when the caller
	// took its locks, and leaves alone any a claim created meanwhile: that
	// claim may have debited it after the caller read the executing rows,
	// and overwriting it from that older read would credit the slot of a
	// row that still executes.
	sqlSlotsCreate = `
INSERT INTO {schema}.key_slots (key, shard, capacity, available)
SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::int[])
ON CONFLICT (key, shard) DO NOTHING`
	// sqlSlotsInsert: see sqlSlotsCreate.
	sqlSlotsInsert = `
INSERT INTO {schema}.key_slots (key, shard, capacity, available)
SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::int[])
ON CONFLICT (key, shard) DO UPDATE
SET capacity = excluded.capacity, available = excluded.available, epoch = nextval('{schema}.slot_epoch_seq')`

	// sqlSlotsDeleteIdle deletes counters of keys with nothing executing,
	// every slot free and no row waiting.
	sqlSlotsDeleteIdle = `
DELETE FROM {schema}.key_slots s
WHERE s.key = ANY ($1::text[])
  AND NOT EXISTS (SELECT 1 FROM {schema}.instances i
                  WHERE i.key = s.key AND i.status IN ('ready', 'blocked'))`

	// sqlSlotsDelete deletes counters of keys whose name lost its limit.
	sqlSlotsDelete = `DELETE FROM {schema}.key_slots WHERE key = ANY ($1::text[])`

	// sqlBlockedKeys lists the first $2 distinct keys after $1 that have
	// blocked rows (not reservations), in key order, with their limits
	// (NULL: K = 1), skipping through instances_key_blocked_posix one key at a
	// time: each probe's condition is that index's predicate and its order
	// the index's first column, so that it reads one entry per key with or
	// without statistics (a probe whose condition is no index's predicate
	// needs statistics to be steered to one; without them its plan may
	// read and sort every waiting row after the key, once per key).
	sqlBlockedKeys = `
WITH RECURSIVE k AS (
    (SELECT key, 1 AS n FROM {schema}.instances
     WHERE key > $1 AND status = 'blocked' COLLATE "POSIX" AND worker IS NULL
     ORDER BY key LIMIT 1)
    UNION ALL
    SELECT (SELECT i.key FROM {schema}.instances i
            WHERE i.key > k.key AND i.status = 'blocked' COLLATE "POSIX" AND i.worker IS NULL
            ORDER BY i.key LIMIT 1), k.n + 1
    FROM k WHERE k.key IS NOT NULL AND k.n < $2
)
SELECT k.key, l."limit"
FROM k LEFT JOIN {schema}.limits l ON l.name = split_part(k.key, ':', 1)
WHERE k.key IS NOT NULL
ORDER BY k.n`

	// sqlStranded returns the keys of $1 still stranded after a heal
	// attempt's promotion ($2[i]: K = 1), by the stranded check, as in
	// sqlPromote (see sql.go).
	sqlStranded = `
SELECT f.key FROM unnest($1::text[], $2::bool[]) AS f(key, one)
WHERE coalesce((SELECT true FROM {schema}.instances b WHERE b.key = f.key AND b.status = 'blocked' COLLATE "POSIX" AND b.worker IS NULL
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
                 FROM (SELECT coalesce(sum(s.available), 1) AS n FROM {schema}.key_slots s WHERE s.key = f.key) a) END`

	// sqlPromoteIfRoom promotes up to $2 blocked rows of each key of $1 that
	// has room now: a K = 1 key with no executing row (the caller holds its
	// advisory lock), or a gate key with free slots (or no counters yet);
	// with $5, only the room its ready rows will not take: none for a K = 1
	// key with a ready row, a gate key's free slots less its ready rows. Like sqlPromote it skips
	// rows locked FOR NO KEY UPDATE or stronger. The K = 1 holder of a key
	// with blocked rows (the blocked check) is marked as having waiters (fl,
	// the marked-holder mark, as in sqlFlagHolders), so that its end
	// promotes them: a blocked row an insert put behind it, or one a claim
	// of an engine from before migration 013 did. A key's limit comes from
	// the key-limit lookup (see sql.go). It locks holders and promoted rows
	// SKIP LOCKED (lock order (4)), after the caller's key locks (2).
	sqlPromoteIfRoom = `
WITH fl AS (
    UPDATE {schema}.instances i SET waiters = true
    WHERE i.id = ANY (ARRAY(SELECT h.id FROM unnest($1::text[]) AS k
                            CROSS JOIN LATERAL (SELECT e.id FROM {schema}.instances e
                                                WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL
                                                  AND e.key_shard IS NULL AND NOT e.waiters
                                                LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED) h
                            WHERE ((SELECT true FROM {schema}.instances b
                                    WHERE b.key = k AND b.status = 'blocked' COLLATE "POSIX" AND b.worker IS NULL
                                    LIMIT 1) IS NOT NULL)))
),
d AS MATERIALIZED (
    SELECT b.id FROM unnest($1::text[]) AS k
    LEFT JOIN LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk
                       WHERE lk.name IN (k, split_part(k, ':', 1)) ORDER BY length(lk.name) DESC LIMIT 1) l ON true
    CROSS JOIN LATERAL (
        SELECT CASE WHEN l.name IS NULL THEN
                    CASE WHEN $5::bool AND (SELECT true FROM {schema}.instances x
                                            WHERE x.key = k AND x.status = 'ready' COLLATE "POSIX"
                                            ORDER BY x.priority, x.run_at, x.seq LIMIT 1) THEN 0
                         WHEN (((SELECT true FROM {schema}.instances e
                                  WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
                                  LIMIT 1) IS NOT NULL
                                OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k LIMIT 1) IS NOT NULL)
                               OR (SELECT true FROM {schema}.instances e
                                   WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key_shard IS NOT NULL
                                   LIMIT 1) IS NOT NULL)
                         THEN 0 ELSE 1 END
               ELSE (SELECT a.n - CASE WHEN $5::bool
                                       THEN (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances x
                                                                   WHERE x.key = k AND x.status = 'ready' COLLATE "POSIX"
                                                                   ORDER BY x.priority, x.run_at, x.seq LIMIT a.n) x)
                                       ELSE 0 END
                     FROM (SELECT coalesce((SELECT sum(available) FROM {schema}.key_slots s WHERE s.key = k), l."limit") AS n) a)
               END AS room) r
    CROSS JOIN LATERAL (SELECT id FROM {schema}.instances
                        WHERE key = k AND status = 'blocked' COLLATE "POSIX" AND worker IS NULL
                        ORDER BY priority, run_at, seq LIMIT least(r.room, $2) FOR NO KEY UPDATE SKIP LOCKED) b),
p AS (
    UPDATE {schema}.instances i SET status = 'ready', updated_at = coalesce($3::timestamptz, now())
    WHERE i.id = ANY (ARRAY(SELECT id FROM d))
    RETURNING i.queue
)
SELECT q.queue, q.n FROM (SELECT queue, count(*) AS n FROM p GROUP BY queue) q
CROSS JOIN LATERAL (SELECT pg_notify($4, q.queue)) x`

	// sqlDeleteTerminalOf is sqlDeleteTerminal for workflow $1's own
	// retention: the $3 oldest terminal rows of the workflow last changed
	// before $2 and not before $4, read from instances_terminal_workflow
	// (migration 019) in its order.
	sqlDeleteTerminalOf = `
WITH d AS (
    DELETE FROM {schema}.instances WHERE id IN (
        SELECT id FROM {schema}.instances
        WHERE workflow = $1 AND status IN ('done', 'failed', 'canceled') AND updated_at < $2::timestamptz
          AND updated_at >= coalesce($4::timestamptz, '-infinity')
        ORDER BY updated_at LIMIT $3)
    RETURNING updated_at)
SELECT count(*), max(updated_at) FROM d`

	// sqlDeleteTerminal deletes up to $2 terminal rows last changed before
	// $1 and not before $3 (NULL: no bound), oldest first, read from
	// instances_terminal in its order, and returns how many it deleted and
	// the last one's updated_at (NULL: none), the $3 of the sweep's next
	// chunk. Each chunk starts where the last ended, so that it does not
	// walk again the index entries of the rows the sweep's earlier chunks
	// deleted: until a vacuum, and while any snapshot older than their
	// deletion is open, each of those is a heap visit, and the chunks of a
	// sweep would read them over and over.
	sqlDeleteTerminal = `
WITH d AS (
    DELETE FROM {schema}.instances WHERE id IN (
        SELECT id FROM {schema}.instances
        WHERE status IN ('done', 'failed', 'canceled') AND updated_at < $1::timestamptz
          AND updated_at >= coalesce($3::timestamptz, '-infinity')
        ORDER BY updated_at LIMIT $2)
    RETURNING updated_at)
SELECT count(*), max(updated_at) FROM d`
)

// Named leases (see store.Store.AcquireLease).
const (
	// sqlLeaseAcquire takes lease $1 for holder $2 until $4 (NULL: now())
	// plus $3 µs when it is free, held by $2, or expired; it returns a row
	// only then.
	sqlLeaseAcquire = `
INSERT INTO {schema}.leases AS l (name, holder, expires_at)
VALUES ($1, $2, coalesce($4::timestamptz, now()) + $3::bigint * interval '1 microsecond')
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at < coalesce($4::timestamptz, now())
RETURNING holder`
)
