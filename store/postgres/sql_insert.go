package postgres

// Statements of inserts (see insert.go and insert_copy.go).
// The rules every statement follows (static text, arrays for batches, the
// clock as a parameter, the lock order) are written at the top of sql.go.

// Insert.
const (
	// sqlInsert inserts a batch in input order and returns the queues that
	// received ready rows, which it notifies on channel $14 unless $14 is
	// '': a store-owned insert with insertPlan.wakeAfter (an Insert beside
	// another, an outcome's children, a schedule's tick) notifies them once
	// it has committed, since a NOTIFY holds PostgreSQL's notification lock
	// through the commit, WAL flush included, and concurrent inserts would
	// commit one at a time (see wakeSender); a lone Insert and one in the
	// caller's transaction (InsertTx) notify in the statement. $17 is the
	// store's clock (Options.Clock; null: the database's). With $18, due rows of K =
	// 1 keys go in as admission.InsertBlocked decides (this is its SQL form;
	// $19 is admission.ReadyCap): blocked, with the rounds they would have
	// had ready, when the key is busy (the K = 1 busy check) or already has
	// $19 rows ready (the ready count), counting the batch's rows in
	// (priority, run_at, input) order; a key is K = 1 when its name has no
	// limit (the K = 1 key test). The rounds are the batch's fresh rounds,
	// the queue head read once per queue and priority (h) and each key's
	// last round per key (b); sql.go describes these rules. The statement returns a row
	// ('', 1, key) per key that received blocked rows behind rows already
	// there, for the caller to heal once it has committed (see
	// healInserted), a row ('', 0, key) per key blocked only behind the
	// batch's own rows (no race to close: they commit together), and a row
	// (queue, n, '') per queue that received n ready rows. It takes no row
	// lock on existing rows: its reads are plain snapshot reads. $20 holds
	// each row's other keys, when it has several (the other keys' text), and $21 the key
	// whose line it goes in blocked in ('' for none: its first gate, or its
	// first key; see blockAtGates), in its key column with its intent $22
	// (its other keys' text $20 then holds its first key in a gate's
	// place), with the round it has as a row of its first key.
	sqlInsert = `
WITH t AS (SELECT coalesce($17::timestamptz, now()) AS now),
x AS (
    SELECT x.*, coalesce(x.run_at, t.now + x.delay_us * interval '1 microsecond') AS at,
           coalesce(x.run_at, t.now + x.delay_us * interval '1 microsecond') <= t.now AS due
    FROM unnest($1::uuid[], $2::text[], $3::int[], $4::text[], $5::int[], $6::text[], $7::text[],
                $8::text[], $9::text[], $10::timestamptz[], $11::text[], $12::text[], $13::uuid[], $15::int[],
                $16::bigint[], $20::text[], $21::text[], $22::text[])
         WITH ORDINALITY AS x(id, workflow, version, queue, priority, step, state, key, key_intent,
                              run_at, unique_key, unique_statuses, parent_id, join_gen, delay_us, extras,
                              blocked_in, blocked_intent, ord)
    CROSS JOIN t
),
h AS MATERIALIZED (
    SELECT g.queue, g.priority,
           (SELECT (coalesce(least(
                       (SELECT r.round FROM {schema}.instances r
                        WHERE r.status = 'ready' AND r.key IS NULL AND r.queue = fr.q AND r.priority = fr.p
                        ORDER BY r.round LIMIT 1),
                       (SELECT r.round FROM {schema}.instances r
                        WHERE r.status = 'ready' AND r.key IS NOT NULL AND r.queue = fr.q AND r.priority = fr.p
                        ORDER BY r.round LIMIT 1)), 0) - 1) | 1
            FROM (SELECT g.queue AS q, g.priority AS p) fr) AS head
    FROM (SELECT DISTINCT queue, priority FROM x WHERE due) g
),
b AS (
    SELECT g.queue, g.priority, g.key,
           CASE WHEN fk.last >= h.head THEN fk.last ELSE h.head END AS base,
           CASE WHEN fk.last >= h.head THEN fk.taken ELSE 0 END AS taken, fk.turns
    FROM (SELECT DISTINCT queue, priority, key FROM x WHERE due) g
    JOIN h ON h.queue = g.queue AND h.priority = g.priority
    CROSS JOIN LATERAL (SELECT g.queue AS q, g.priority AS p, nullif(g.key, '') AS k) fr
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
k AS MATERIALIZED (
    SELECT g.k, g.n,
           ((SELECT true FROM {schema}.instances e
             WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
             LIMIT 1) IS NOT NULL
           OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k LIMIT 1) IS NOT NULL) AS busy,
           (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances r WHERE r.key = k AND r.status = 'ready' COLLATE "POSIX"
                                  ORDER BY r.priority, r.run_at, r.seq LIMIT $19) r) AS ready
    FROM (SELECT key AS k, count(*) AS n FROM x WHERE due AND key <> '' AND blocked_in = '' GROUP BY key) g
    WHERE $18::bool AND NOT EXISTS (SELECT 1 FROM {schema}.limits l WHERE l.name = split_part(k, ':', 1))
),
ins AS (
    INSERT INTO {schema}.instances (id, workflow, version, queue, priority, status, step, state,
        key, key_intent, run_at, round, unique_key, unique_statuses, parent_id, join_gen, created_at, updated_at,
        extra_keys, extra_intents)
    SELECT x.id, x.workflow, x.version, x.queue, x.priority,
           CASE WHEN NOT x.due THEN 'scheduled'
                WHEN x.blocked_in <> '' THEN 'blocked'
                WHEN k.k IS NOT NULL AND (k.busy OR k.ready + row_number() OVER (PARTITION BY x.key, x.due, k.k IS NULL
                                                                  ORDER BY x.priority, x.at, x.ord) > $19) THEN 'blocked'
                ELSE 'ready' END,
           x.step, x.state::jsonb, coalesce(nullif(x.blocked_in, ''), nullif(x.key, '')),
           CASE WHEN x.blocked_in <> '' THEN x.blocked_intent ELSE x.key_intent END, x.at,
           CASE WHEN NOT x.due THEN NULL
                WHEN x.key = '' THEN b.base
                ELSE greatest(b.base, b.base - (b.base & 1)
                                      + 2 * ((b.taken + row_number() OVER (PARTITION BY x.queue, x.priority, x.key, x.due
                                                                           ORDER BY x.at, x.ord) - 1) / b.turns))
           END,
           nullif(x.unique_key, ''),
           CASE WHEN x.unique_key <> '' THEN string_to_array(x.unique_statuses, ',') END,
           x.parent_id, x.join_gen, t.now, t.now,
           CASE WHEN x.extras <> '' THEN
               (SELECT array_agg(split_part(e, E'\x1e', 1) ORDER BY n) FROM unnest(string_to_array(nullif(x.extras, ''), E'\x1f')) WITH ORDINALITY AS u(e, n)) END,
           CASE WHEN x.extras <> '' THEN
               (SELECT array_agg(split_part(e, E'\x1e', 2) ORDER BY n) FROM unnest(string_to_array(nullif(x.extras, ''), E'\x1f')) WITH ORDINALITY AS u(e, n)) END
    FROM x CROSS JOIN t
    LEFT JOIN b ON x.due AND b.queue = x.queue AND b.priority = x.priority AND b.key = x.key
    LEFT JOIN k ON x.due AND k.k = x.key AND x.blocked_in = ''
    ORDER BY x.ord
    RETURNING queue, status
)
SELECT q.queue, q.n, '' FROM (SELECT queue, count(*) AS n FROM ins WHERE status = 'ready' GROUP BY queue) q
LEFT JOIN LATERAL (SELECT pg_notify($14, q.queue) WHERE $14 <> '') x ON true
UNION ALL
SELECT '', CASE WHEN k.busy OR k.ready > 0 THEN 1 ELSE 0 END, k.k FROM k
WHERE k.busy OR k.ready + k.n > $19`

	// sqlInsertRounds is the query of the COPY insert path (copyInsert): it
	// returns the clock ($1: Options.Clock; null: the database's) and, for
	// every (queue, priority, key) of the batch ($2..$4, 0-based index i)
	// with a due row (its earliest explicit run_at $5 or its shortest delay
	// $6 is not after the clock), the parts of the fresh round its rows
	// start from (its head is the queue's open round already, which
	// admission.KeyFresh takes as it is: admission.Open is idempotent) and,
	// with $8, whether its key is a K = 1 key (the K = 1 key test), whether
	// that key is busy (the K = 1 busy check) and how many of its rows are
	// ready (the ready count, up to $9: admission.ReadyCap), read by the
	// rules sqlInsert applies (see sql.go); the caller decides which rows go in blocked
	// with admission.InsertBlocked. One row with a null i when no group is due.
	// It notifies on channel $7 the queues of the due groups whose key is
	// not busy (a group of a key at its cap of ready rows is notified for
	// nothing): delivered when the transaction commits, so after the rows it
	// then copies in.
	sqlInsertRounds = `
WITH t AS (SELECT coalesce($1::timestamptz, now()) AS now),
d AS MATERIALIZED (
    SELECT g.* FROM unnest($2::text[], $3::int[], $4::text[], $5::timestamptz[], $6::bigint[]) WITH ORDINALITY
                    AS g(queue, priority, k, run_at, delay_us, ord)
    CROSS JOIN t
    WHERE g.run_at <= t.now OR t.now + g.delay_us * interval '1 microsecond' <= t.now
),
h AS MATERIALIZED (
    SELECT g.queue, g.priority,
           (SELECT (coalesce(least(
                       (SELECT r.round FROM {schema}.instances r
                        WHERE r.status = 'ready' AND r.key IS NULL AND r.queue = fr.q AND r.priority = fr.p
                        ORDER BY r.round LIMIT 1),
                       (SELECT r.round FROM {schema}.instances r
                        WHERE r.status = 'ready' AND r.key IS NOT NULL AND r.queue = fr.q AND r.priority = fr.p
                        ORDER BY r.round LIMIT 1)), 0) - 1) | 1
            FROM (SELECT g.queue AS q, g.priority AS p) fr) AS head
    FROM (SELECT DISTINCT queue, priority FROM d) g
),
g AS MATERIALIZED (
    SELECT (g.ord - 1)::int AS i, g.queue,
           h.head, fk.last, fk.taken, fk.turns,
           o.one,
           o.one AND ((SELECT true FROM {schema}.instances e
                       WHERE e.key = k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
                       LIMIT 1) IS NOT NULL
                     OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = k LIMIT 1) IS NOT NULL) AS busy,
           CASE WHEN o.one THEN (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances r WHERE r.key = k AND r.status = 'ready' COLLATE "POSIX"
                                                       ORDER BY r.priority, r.run_at, r.seq LIMIT $9) r)
                ELSE 0 END AS ready
    FROM d g
    JOIN h ON h.queue = g.queue AND h.priority = g.priority
    -- fr and fk are read inside a subquery: g's own k stays the only k.
    CROSS JOIN LATERAL (SELECT fk.last, fk.taken, fk.turns
                        FROM (SELECT g.queue AS q, g.priority AS p, nullif(g.k, '') AS k) fr
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
                                                                       ORDER BY length(lk.name) DESC LIMIT 1), 1) AS turns OFFSET 0) x) fk) fk
    CROSS JOIN LATERAL (SELECT $8::bool AND g.k <> ''
                               AND NOT EXISTS (SELECT 1 FROM {schema}.limits l WHERE l.name = split_part(k, ':', 1)) AS one) o
),
n AS (SELECT count(pg_notify($7, q.queue)) AS n FROM (SELECT DISTINCT queue FROM g WHERE NOT g.busy) q)
SELECT t.now, g.i, g.head, g.last, g.taken, g.turns, g.one, g.busy, g.ready FROM t CROSS JOIN n LEFT JOIN g ON true`

	// sqlInsertGates reads, for the keys $1 of an insert's due rows of
	// several keys, whether each is a gate key (the key-limit lookup finds
	// a limit) and, for a gate, its free slots: the sum of its counters'
	// free slots, its limit when it has none yet. It locks the counters
	// FOR SHARE SKIP LOCKED (lock order (3); it never waits) and says
	// whether it locked them all: a counter another transaction holds may
	// be having a slot credited, and the gate's rows then go in ready.
	// Held to the insert's commit, the locks make a transaction that
	// credits one of them wait for the insert, so that its promotion (a
	// statement of its own, read after the credit) sees the rows the insert
	// blocked: no row goes in blocked behind a slot freed unseen. For a
	// K = 1 key it reads what sqlInsert's K = 1 rule reads (the K = 1 busy
	// check, and the ready count up to $2: admission.ReadyCap), so that the
	// rows that rule blocks in their first key's line are known; for a
	// gate, whether rows wait blocked in its line, reserved rows apart
	// (admission.InsertBehindFirst; through instances_key_blocked_posix,
	// whose predicate the read repeats).
	sqlInsertGates = `
WITH l AS MATERIALIZED (
    SELECT k, (SELECT lk."limit" FROM {schema}.limits lk
               WHERE lk.name IN (k, split_part(k, ':', 1)) ORDER BY length(lk.name) DESC LIMIT 1) AS lim
    FROM unnest($1::text[]) AS k),
c AS MATERIALIZED (
    SELECT s.key, s.available FROM {schema}.key_slots s
    WHERE s.key = ANY (ARRAY(SELECT k FROM l WHERE lim IS NOT NULL))
    FOR SHARE SKIP LOCKED)
SELECT l.k, l.lim IS NOT NULL,
       CASE WHEN l.lim IS NOT NULL THEN coalesce((SELECT sum(c.available) FROM c WHERE c.key = l.k), l.lim)::int
            ELSE (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances r WHERE r.key = l.k AND r.status = 'ready' COLLATE "POSIX"
                                        ORDER BY r.priority, r.run_at, r.seq LIMIT $2) r)::int END,
       CASE WHEN l.lim IS NOT NULL
            THEN (SELECT count(*) FROM c WHERE c.key = l.k) = (SELECT count(*) FROM {schema}.key_slots s WHERE s.key = l.k)
            ELSE ((SELECT true FROM {schema}.instances e
                   WHERE e.key = l.k AND e.status = 'executing' COLLATE "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL
                   LIMIT 1) IS NOT NULL
                  OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key = l.k LIMIT 1) IS NOT NULL) END,
       l.lim IS NOT NULL AND (SELECT true FROM {schema}.instances b
                              WHERE b.key = l.k AND b.status = 'blocked' COLLATE "POSIX" AND b.worker IS NULL
                              LIMIT 1) IS NOT NULL
FROM l`

	// sqlUniqueLock serializes inserts of the same unique keys ($1). Keys
	// share 1024 lock buckets, taken in order, so that a batch of any size
	// takes a bounded number of locks (the lock table is finite) and
	// concurrent batches cannot deadlock; unrelated keys in one bucket only
	// serialize.
	sqlUniqueLock = `
SELECT pg_advisory_xact_lock(b) FROM (
    SELECT DISTINCT $2::bigint + (hashtextextended(k, 0) & 1023) AS b FROM unnest($1::text[]) AS k
    ORDER BY b) s`

	// sqlUniqueExisting returns, per unique key and status, the oldest
	// instance holding the key (bounded: at most one row per status), and
	// whether it has never been claimed (fence 0: see
	// store.ConflictReplace). A row whose cancel is requested holds it no
	// more.
	sqlUniqueExisting = `
SELECT k, st, h.id::text, h.fence = 0
FROM unnest($1::text[]) AS k
CROSS JOIN unnest(ARRAY['ready','scheduled','blocked','executing','awaiting','awaiting_children',
                        'done','failed','canceled']) AS st
CROSS JOIN LATERAL (SELECT id, fence FROM {schema}.instances
                    WHERE unique_key = k AND status = st AND NOT cancel_requested ORDER BY seq LIMIT 1) h`

	// sqlDebouncePending returns, per debounce unique key of $1, its
	// pending instance (never claimed, not yet started: see
	// store.Debounce), read under the key's lock.
	sqlDebouncePending = `
SELECT k, h.id::text
FROM unnest($1::text[]) AS k
CROSS JOIN LATERAL (SELECT id FROM {schema}.instances
                    WHERE unique_key = k AND status IN ('ready', 'scheduled', 'blocked') AND fence = 0
                      AND NOT cancel_requested
                    ORDER BY seq LIMIT 1) h`

	// sqlDebounce gives pending instance $1 the state $2 and moves its
	// start to now ($5, NULL: now()) + $3 µs, never past its created_at +
	// $4 µs ($4 = 0: no bound), as store.Debounce.RunAt; it returns it, or
	// nothing when it has started meanwhile. A blocked row stays in its
	// key's line; a ready one is scheduled again, its round cleared, so
	// that it takes a fresh round when it falls due (sqlPromoteScheduled),
	// as a row inserted then would.
	sqlDebounce = `
WITH t AS (SELECT coalesce($5::timestamptz, now()) AS now)
UPDATE {schema}.instances i
SET state = $2,
    run_at = CASE WHEN $4::bigint > 0
                  THEN least(t.now + $3::bigint * interval '1 microsecond', i.created_at + $4::bigint * interval '1 microsecond')
                  ELSE t.now + $3::bigint * interval '1 microsecond' END,
    status = CASE WHEN i.status = 'blocked' THEN 'blocked' ELSE 'scheduled' END,
    round = CASE WHEN i.status = 'blocked' THEN i.round END,
    updated_at = t.now
FROM t
WHERE i.id = $1 AND i.fence = 0 AND i.status IN ('ready', 'scheduled', 'blocked') AND NOT i.cancel_requested
RETURNING i.id::text`

	// sqlReplaceState replaces the state of a unique key's holder that
	// has not started ($1, read and locked under the key's lock), and
	// returns it; nothing when it started meanwhile.
	sqlReplaceState = `
UPDATE {schema}.instances SET state = $2, updated_at = coalesce($3::timestamptz, now())
WHERE id = $1 AND fence = 0 AND status IN ('ready', 'scheduled', 'blocked') AND NOT cancel_requested
RETURNING id::text`
)
