package postgres

// Statements of inserts (see insert.go and insert_copy.go).
// The rules every statement follows (static text, arrays for batches, the
// clock as a parameter, the lock order) are written at the top of sql.go.

// Insert.
const (
	// sqlInsert inserts a batch in input order and notifies the queues that
	// received ready rows. $14 is the notification channel, $17 the store's
	// clock (Options.Clock; null: the database's). With $18, the due rows of
	// a K = 1 key that is busy (see busyKeyWhere) are inserted blocked, with
	// the rounds they would have had ready; the statement returns a row
	// ('', 0, key) per such key, for the caller to heal once it has
	// committed (see healInserted), and a row (queue, n, '') per notified
	// queue.
	sqlInsert = `
WITH t AS (SELECT coalesce($17::timestamptz, now()) AS now),
x AS (
    SELECT x.*, coalesce(x.run_at, t.now + x.delay_us * interval '1 microsecond') AS at,
           coalesce(x.run_at, t.now + x.delay_us * interval '1 microsecond') <= t.now AS due
    FROM unnest($1::uuid[], $2::text[], $3::int[], $4::text[], $5::int[], $6::text[], $7::text[],
                $8::text[], $9::text[], $10::timestamptz[], $11::text[], $12::text[], $13::uuid[], $15::int[],
                $16::bigint[])
         WITH ORDINALITY AS x(id, workflow, version, queue, priority, step, state, key, key_intent,
                              run_at, unique_key, unique_statuses, parent_id, join_gen, delay_us, ord)
    CROSS JOIN t
),
b AS (
    SELECT g.queue, g.priority, g.key, {schema}.fresh_round(g.queue, g.priority, nullif(g.key, '')) AS base
    FROM (SELECT DISTINCT queue, priority, key FROM x WHERE due) g
),
k AS MATERIALIZED (
    SELECT g.k FROM (SELECT DISTINCT key AS k FROM x WHERE due AND key <> '') g
    WHERE $18::bool AND ` + busyKeyWhere + `
),
ins AS (
    INSERT INTO {schema}.instances (id, workflow, version, queue, priority, status, step, state,
        key, key_intent, run_at, round, unique_key, unique_statuses, parent_id, join_gen, created_at, updated_at)
    SELECT x.id, x.workflow, x.version, x.queue, x.priority,
           CASE WHEN NOT x.due THEN 'scheduled' WHEN k.k IS NOT NULL THEN 'blocked' ELSE 'ready' END,
           x.step, x.state::jsonb, nullif(x.key, ''), x.key_intent, x.at,
           CASE WHEN NOT x.due THEN NULL
                WHEN x.key = '' THEN b.base
                ELSE b.base + row_number() OVER (PARTITION BY x.queue, x.priority, x.key, x.due ORDER BY x.at, x.ord) - 1
           END,
           nullif(x.unique_key, ''),
           CASE WHEN x.unique_key <> '' THEN string_to_array(x.unique_statuses, ',') END,
           x.parent_id, x.join_gen, t.now, t.now
    FROM x CROSS JOIN t
    LEFT JOIN b ON x.due AND b.queue = x.queue AND b.priority = x.priority AND b.key = x.key
    LEFT JOIN k ON x.due AND k.k = x.key
    ORDER BY x.ord
    RETURNING queue, status
)
SELECT q.queue, q.n, '' FROM (SELECT queue, count(*) AS n FROM ins WHERE status = 'ready' GROUP BY queue) q
CROSS JOIN LATERAL (SELECT pg_notify($14, q.queue)) x
UNION ALL
SELECT '', 0, k.k FROM k`

	// sqlInsertRounds is the query of the COPY insert path (copyInsert): it
	// returns the clock ($1: Options.Clock; null: the database's) and, for
	// every (queue, priority, key) of the batch ($2..$4, 0-based index i)
	// with a due row (its earliest explicit run_at $5 or its shortest delay
	// $6 is not after the clock), the fresh round its rows start from and,
	// with $8, whether its key is a busy K = 1 key (see busyKeyWhere: its
	// due rows go in blocked); one row with a null i when no group is due.
	// It notifies on channel $7 the queues of the due groups that are not
	// blocked: delivered when the transaction commits, so after the rows it
	// then copies in.
	sqlInsertRounds = `
WITH t AS (SELECT coalesce($1::timestamptz, now()) AS now),
g AS MATERIALIZED (
    SELECT (g.ord - 1)::int AS i, g.queue,
           {schema}.fresh_round(g.queue, g.priority, nullif(g.k, '')) AS base,
           $8::bool AND g.k <> '' AND ` + busyKeyWhere + ` AS blocked
    FROM unnest($2::text[], $3::int[], $4::text[], $5::timestamptz[], $6::bigint[]) WITH ORDINALITY
         AS g(queue, priority, k, run_at, delay_us, ord)
    CROSS JOIN t
    WHERE g.run_at <= t.now OR t.now + g.delay_us * interval '1 microsecond' <= t.now
),
n AS (SELECT count(pg_notify($7, q.queue)) AS n FROM (SELECT DISTINCT queue FROM g WHERE NOT g.blocked) q)
SELECT t.now, g.i, g.base, g.blocked FROM t CROSS JOIN n LEFT JOIN g ON true`

	// busyKeyWhere is the condition on a key k (text, not empty) under which
	// an insert puts the key's due rows in blocked rather than ready: k is a
	// K = 1 key (its name has no limit) held by an executing row admitted
	// under K = 1 (key_shard is null, so that its end frees the key through
	// the key's advisory lock; see healInserted). It is one probe of the
	// unique index instances_key_one per key, written as a scalar subquery
	// with LIMIT so that the planner cannot turn it into a hashed subplan
	// that reads every executing row. A key that is only waited for (blocked
	// rows, nothing executing: its first row was just promoted) and a key
	// held by a row a gate admitted (its limit was removed since) get ready
	// rows, as before: the claim that finds the key busy blocks them. (The
	// forms of "has the key blocked rows?" tried here were planned to read
	// the blocked rows of every key, as a hashed subplan, or every waiting
	// row of this one.)
	busyKeyWhere = `NOT EXISTS (SELECT 1 FROM {schema}.limits l WHERE l.name = split_part(k, ':', 1))
      AND (SELECT true FROM {schema}.instances e
           WHERE e.key = k AND e.status = 'executing' AND e.key IS NOT NULL AND e.key_shard IS NULL
           LIMIT 1) IS NOT NULL`

	// sqlUniqueLock serializes inserts of the same unique keys ($1). Keys
	// share 1024 lock buckets, taken in order, so that a batch of any size
	// takes a bounded number of locks (the lock table is finite) and
	// concurrent batches cannot deadlock; unrelated keys in one bucket only
	// serialize.
	sqlUniqueLock = `
SELECT pg_advisory_xact_lock(b) FROM (
    SELECT DISTINCT $2::bigint + (hashtextextended(k, 0) & 1023) AS b FROM unnest($1::text[]) AS k
    ORDER BY b) s`

	// sqlUniqueExisting returns, per unique key and status, one instance
	// holding the key (bounded: at most one row per status).
	sqlUniqueExisting = `
SELECT k, st, h.id::text
FROM unnest($1::text[]) AS k
CROSS JOIN unnest(ARRAY['ready','scheduled','blocked','executing','awaiting','awaiting_children',
                        'done','failed','canceled']) AS st
CROSS JOIN LATERAL (SELECT id FROM {schema}.instances
                    WHERE unique_key = k AND status = st ORDER BY seq LIMIT 1) h`
)
