package postgres

// Every statement the backend runs. {schema} is replaced by the quoted schema
// name once per Store, so each statement's text is fixed and pgx caches its
// prepared form. Batches travel as arrays (unnest), never as one parameter per
// value, so no batch size meets the 65,535-parameter ceiling. The clock
// reaches SQL as a nullable parameter: coalesce($now, now()).
//
// Lock order, followed by every transaction so that none can deadlock with
// another: (1) the instance rows being transitioned, by id (claims take
// ready rows SKIP LOCKED and never wait); (2) K = 1 key advisory locks, by
// key (claims only try them and never wait); (3) gate counter rows, by
// (key, shard); (4) other instance rows: blocked rows being promoted (SKIP
// LOCKED, see sqlPromote) and parents, by id.

// Migrator bookkeeping.
const (
	sqlMigrationLock = `SELECT pg_advisory_xact_lock($1::bigint)`

	sqlMigrationsTableExists = `SELECT to_regclass(format('%I.schema_migrations', $1::text)) IS NOT NULL`

	sqlMigrationsInit = `
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version    int         PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

	sqlMigrationsApplied = `SELECT version FROM {schema}.schema_migrations ORDER BY version`

	sqlMigrationRecord = `INSERT INTO {schema}.schema_migrations (version, name) VALUES ($1, $2)`

	sqlMigrationForget = `DELETE FROM {schema}.schema_migrations WHERE version = $1`
)

// instanceColumns is the column list every Instance is scanned from (see scanInstance).
const instanceColumns = `id::text, workflow, version, queue, priority, status, step, state, attempt,
	coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
	CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
	timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
	coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
	coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since`

// Insert.
const (
	// sqlInsert inserts a batch in input order and notifies the queues that
	// received due rows. $14 is the notification channel, $17 the store's
	// clock (Options.Clock; null: the database's).
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
ins AS (
    INSERT INTO {schema}.instances (id, workflow, version, queue, priority, status, step, state,
        key, key_intent, run_at, round, unique_key, unique_statuses, parent_id, join_gen, created_at, updated_at)
    SELECT x.id, x.workflow, x.version, x.queue, x.priority,
           CASE WHEN x.due THEN 'ready' ELSE 'scheduled' END,
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
    ORDER BY x.ord
    RETURNING queue, status
)
SELECT q.queue, q.n FROM (SELECT queue, count(*) AS n FROM ins WHERE status = 'ready' GROUP BY queue) q
CROSS JOIN LATERAL (SELECT pg_notify($14, q.queue)) x`

	// sqlInsertRounds is the query of the COPY insert path (copyInsert): it
	// returns the clock ($1: Options.Clock; null: the database's) and, for
	// every (queue, priority, key) of the batch ($2..$4, 0-based index i)
	// with a due row (its earliest explicit run_at $5 or its shortest delay
	// $6 is not after the clock), the fresh round its rows start from; one
	// row with a null i when no group is due. It notifies on channel $7 the
	// queues of the due groups: delivered when the transaction commits, so
	// after the rows it then copies in.
	sqlInsertRounds = `
WITH t AS (SELECT coalesce($1::timestamptz, now()) AS now),
g AS MATERIALIZED (
    SELECT (g.ord - 1)::int AS i, g.queue,
           {schema}.fresh_round(g.queue, g.priority, nullif(g.key, '')) AS base
    FROM unnest($2::text[], $3::int[], $4::text[], $5::timestamptz[], $6::bigint[]) WITH ORDINALITY
         AS g(queue, priority, key, run_at, delay_us, ord)
    CROSS JOIN t
    WHERE g.run_at <= t.now OR t.now + g.delay_us * interval '1 microsecond' <= t.now
),
n AS (SELECT count(pg_notify($7, q.queue)) AS n FROM (SELECT DISTINCT queue FROM g) q)
SELECT t.now, g.i, g.base FROM t CROSS JOIN n LEFT JOIN g ON true`

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

// Claim: the statements of the admission transaction (see admission.go).
const (
	// sqlPromoteScheduled moves due delayed rows of a queue onto the pick
	// path, giving each a round unless it kept one (a row rescheduled for a
	// rate limit token): rows of one key take consecutive rounds.
	sqlPromoteScheduled = `
WITH d AS MATERIALIZED (
    SELECT id, priority, key, run_at, seq, round FROM {schema}.instances
    WHERE status = 'scheduled' AND queue = $1 AND run_at <= coalesce($2::timestamptz, now())
    ORDER BY run_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED),
b AS (
    SELECT g.priority, g.key, {schema}.fresh_round($1, g.priority, g.key) AS base
    FROM (SELECT DISTINCT priority, key FROM d WHERE round IS NULL) g
),
r AS (
    SELECT d.id, coalesce(d.round, b.base + CASE WHEN d.key IS NULL THEN 0 ELSE
               row_number() OVER (PARTITION BY d.priority, d.key, d.round IS NULL ORDER BY d.run_at, d.seq) - 1 END) AS round
    FROM d LEFT JOIN b ON b.priority = d.priority AND b.key IS NOT DISTINCT FROM d.key
)
UPDATE {schema}.instances i SET status = 'ready', round = r.round, updated_at = coalesce($2::timestamptz, now())
FROM r WHERE i.id = r.id`

	// sqlFireQueueTimers makes awaits of a queue whose timeout passed ready.
	sqlFireQueueTimers = `
WITH d AS MATERIALIZED (
    SELECT id FROM {schema}.instances
    WHERE status = 'awaiting' AND queue = $1 AND timeout_at IS NOT NULL
      AND timeout_at <= coalesce($2::timestamptz, now())
    ORDER BY timeout_at LIMIT $3 FOR UPDATE SKIP LOCKED)
UPDATE {schema}.instances i
SET status = 'ready', timed_out = true, run_at = i.timeout_at, timeout_at = NULL,
    round = {schema}.fresh_round(i.queue, i.priority, i.key), updated_at = coalesce($2::timestamptz, now())
WHERE i.id = ANY (ARRAY(SELECT id FROM d))`

	// sqlClaimCandidates locks the window: the first due ready rows of the
	// queue in claim order, with their key's limit (NULL: K = 1) and rate
	// limit (NULL: none). Keyless rows ($5 of them: each needs only queue
	// capacity) and keyed rows ($4) are read from their own indexes and
	// merged, so that keyed rows waiting for their keys never push keyless
	// rows out of the window.
	sqlClaimCandidates = `
WITH free AS (
    SELECT id, key, key_name, priority, round, run_at, seq FROM {schema}.instances
    WHERE status = 'ready' AND key IS NULL AND queue = $1 AND run_at <= coalesce($2::timestamptz, now())
      AND (cardinality($3::text[]) = 0 OR workflow = ANY ($3::text[]))
    ORDER BY priority, round, run_at, seq
    LIMIT $5 FOR UPDATE SKIP LOCKED),
keyed AS (
    SELECT id, key, key_name, priority, round, run_at, seq FROM {schema}.instances
    WHERE status = 'ready' AND key IS NOT NULL AND queue = $1 AND run_at <= coalesce($2::timestamptz, now())
      AND (cardinality($3::text[]) = 0 OR workflow = ANY ($3::text[]))
    ORDER BY priority, round, run_at, seq
    LIMIT $4 FOR UPDATE SKIP LOCKED)
SELECT c.id::text, coalesce(c.key, ''), l."limit", l.shards, r."limit", r.period_us, r.burst, r.per_key
FROM (SELECT * FROM free UNION ALL SELECT * FROM keyed) c
LEFT JOIN {schema}.limits l ON l.name = c.key_name
LEFT JOIN {schema}.rate_limits r ON r.name = c.key_name
ORDER BY c.priority, c.round, c.run_at, c.seq`

	// sqlClaimContext returns the claim's now and the queue's policy (NULLs: none).
	sqlClaimContext = `
SELECT coalesce($2::timestamptz, now()), p.max_active, p.max_active_per_key
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

	// sqlKeyBusy returns the keys that have an executing row. It must run as
	// its own statement after sqlKeyTryLock so that its snapshot is taken
	// while the locks are held.
	sqlKeyBusy = `
SELECT k FROM unnest($1::text[]) AS k
WHERE EXISTS (SELECT 1 FROM {schema}.instances WHERE key = k AND status = 'executing' AND key_shard IS NULL)
   OR EXISTS (SELECT 1 FROM {schema}.instances WHERE key = k AND status = 'executing' AND key_shard IS NOT NULL)`

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
	// counter created before the locks were taken.
	sqlSlotsTryLock = `
SELECT key, shard, capacity, available FROM {schema}.key_slots
WHERE key = ANY ($1::text[]) ORDER BY key, shard FOR UPDATE SKIP LOCKED`
	sqlSlotsCount = `
SELECT key, count(*) FROM {schema}.key_slots WHERE key = ANY ($1::text[]) GROUP BY key`

	// sqlBlock takes rows of saturated keys off the pick path.
	sqlBlock = `
UPDATE {schema}.instances SET status = 'blocked', updated_at = coalesce($2::timestamptz, now())
WHERE id = ANY ($1::uuid[]) AND status = 'ready'`

	// sqlBlockBacklog moves up to $2 more due ready rows of each saturated
	// key ($1) off the pick path, so that a key's backlog beyond the window
	// does not keep filling the window.
	sqlBlockBacklog = `
WITH d AS MATERIALIZED (
    SELECT b.id FROM unnest($1::text[]) AS k
    CROSS JOIN LATERAL (SELECT id FROM {schema}.instances
                        WHERE key = k AND status = 'ready' AND run_at <= coalesce($3::timestamptz, now())
                        ORDER BY priority, run_at, seq LIMIT $2 FOR UPDATE SKIP LOCKED) b)
UPDATE {schema}.instances i SET status = 'blocked', updated_at = coalesce($3::timestamptz, now())
WHERE i.id = ANY (ARRAY(SELECT id FROM d))`

	// sqlDebit takes slots from counters this transaction has locked.
	sqlDebit = `
UPDATE {schema}.key_slots s SET available = s.available - d.n
FROM unnest($1::text[], $2::int[], $3::int[]) AS d(key, shard, n)
WHERE s.key = d.key AND s.shard = d.shard`

	// sqlClaim moves the admitted rows to executing with a new fence and
	// returns them in admission order, each with the oldest unconsumed signal
	// its await was woken by.
	sqlClaim = `
WITH t AS (SELECT coalesce($5::timestamptz, now()) AS now),
c AS (
    UPDATE {schema}.instances i
    SET status = 'executing', worker = $2, fence = nextval('{schema}.fence_seq'),
        lease_expires_at = t.now + $3::bigint * interval '1 microsecond',
        started_at = t.now, key_shard = nullif(a.shard, -1), updated_at = t.now
    FROM unnest($1::uuid[], $4::int[]) WITH ORDINALITY AS a(id, shard, ord), t
    WHERE i.id = a.id AND i.status = 'ready'
    RETURNING i.*, a.ord
)
SELECT ` + instanceColumns + `, sg.sig_id, sg.sig_name, sg.sig_payload, sg.sig_dedup, sg.sig_created
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

// Freeing slots: what every path out of executing runs after it (see slots.go).
const (
	// sqlKeyLock takes the advisory lock of each K = 1 key ($1, sorted),
	// waiting for claims that hold it.
	sqlKeyLock = `SELECT pg_advisory_xact_lock(hashtextextended(k, $2::bigint)) FROM unnest($1::text[]) AS k`

	// sqlSlotsLockExisting locks counters in (key, shard) order before a credit.
	sqlSlotsLockExisting = `
SELECT 1 FROM {schema}.key_slots
WHERE (key, shard) IN (SELECT * FROM unnest($1::text[], $2::int[]))
ORDER BY key, shard FOR UPDATE`

	// sqlCredit returns $3[i] slots to shard $2[i] of key $1[i], never
	// above capacity, and shrinks a shard that a lowered limit or shard
	// count left larger than its name's limit gives it (see resizeShards):
	// the freed slots of such a shard go back to the limit, not to its
	// capacity, until it is down to its share (0 for a shard the limit no
	// longer has). Slots in use become max(0, used − n); capacity becomes
	// max(min(capacity, share), in use), which is what Reconcile computes
	// from the executing rows, so no drift appears on this path. A credit
	// never grows a capacity nor frees more than it returns, so it cannot
	// admit more than before. Counters of a name with no limit keep their
	// capacity (SyncKeyLimits deletes them).
	sqlCredit = `
WITH x AS (
    SELECT s.key, s.shard, greatest(0, s.capacity - s.available - d.n) AS used,
           CASE WHEN l.name IS NULL THEN s.capacity
                WHEN s.shard >= l.shards THEN 0
                ELSE least(s.capacity, l."limit" / l.shards + CASE WHEN s.shard < l."limit" % l.shards THEN 1 ELSE 0 END)
           END AS share
    FROM unnest($1::text[], $2::int[], $3::int[]) AS d(key, shard, n)
    JOIN {schema}.key_slots s ON s.key = d.key AND s.shard = d.shard
    LEFT JOIN {schema}.limits l ON l.name = split_part(s.key, ':', 1)
)
UPDATE {schema}.key_slots s
SET capacity = greatest(x.share, x.used), available = greatest(x.share, x.used) - x.used
FROM x WHERE s.key = x.key AND s.shard = x.shard`

	// sqlSlotsDropEmpty deletes, among the counters a credit touched, those
	// left with no capacity: shards the limit no longer has, once the last
	// row they admitted is gone. Claims never create or draw from them.
	sqlSlotsDropEmpty = `
DELETE FROM {schema}.key_slots
WHERE (key, shard) IN (SELECT * FROM unnest($1::text[], $2::int[])) AND capacity = 0`

	// sqlPromote makes the first $2[i] blocked rows of each key $1[i]
	// (priority, then FIFO) ready and notifies their queues. It must not wait
	// for row locks, so it skips locked rows: under READ COMMITTED a row lock
	// is also left on rows that failed a locking statement's recheck (a
	// claim's window keeps the lock of a row it saw ready but found blocked;
	// this very statement keeps the lock of a row it saw blocked but found
	// claimed), and waiting for such locks deadlocked with outcome batches.
	// It locks FOR NO KEY UPDATE, which a signal's FOR KEY SHARE does not
	// block. It returns a row (queue, n, '') per notified queue, and a row
	// ('', 0, key) per key it left stranded: a key ($5[i]: K = 1) of which
	// it promoted nothing although it has room and blocked rows (see
	// strandedWhere), because all of them were locked; the freeing call
	// retries those after its commit (see heal).
	sqlPromote = `
WITH f AS (SELECT * FROM unnest($1::text[], $2::int[], $5::bool[]) AS f(key, n, one)),
d AS MATERIALIZED (
    SELECT f.key, b.id FROM f
    CROSS JOIN LATERAL (SELECT id FROM {schema}.instances
                        WHERE key = f.key AND status = 'blocked'
                        ORDER BY priority, run_at, seq LIMIT f.n FOR NO KEY UPDATE SKIP LOCKED) b),
p AS (
    UPDATE {schema}.instances i SET status = 'ready', updated_at = coalesce($3::timestamptz, now())
    WHERE i.id = ANY (ARRAY(SELECT id FROM d))
    RETURNING i.queue
)
SELECT q.queue, q.n, '' FROM (SELECT queue, count(*) AS n FROM p GROUP BY queue) q
CROSS JOIN LATERAL (SELECT pg_notify($4, q.queue)) x
UNION ALL
SELECT '', 0, f.key FROM f
WHERE NOT EXISTS (SELECT 1 FROM d WHERE d.key = f.key) AND ` + strandedWhere
)

// Outcomes.
const (
	// sqlCompleteApply applies a batch of outcomes, each guarded by the
	// claim: worker, fence and status executing. A stale outcome matches no
	// row and changes nothing. Rows are locked in id order, FOR UPDATE so
	// that a signal being stored for the row (FOR KEY SHARE) and a park
	// serialize. It returns the key and shard each row held, for crediting.
	// Outcome kinds travel by name (store.OutcomeKind.String); an unknown
	// name leaves the status NULL, which the NOT NULL constraint refuses.
	sqlCompleteApply = `
WITH t AS (SELECT coalesce($2::timestamptz, now()) AS now)
UPDATE {schema}.instances i SET
    status = CASE o.kind
        WHEN 'ready' THEN CASE WHEN o.run_at > t.now THEN 'scheduled' ELSE 'ready' END
        WHEN 'await' THEN 'awaiting'
        WHEN 'spawn' THEN 'awaiting_children'
        WHEN 'done' THEN 'done'
        WHEN 'failed' THEN 'failed'
        WHEN 'canceled' THEN 'canceled' END,
    step = CASE WHEN o.step <> '' THEN o.step ELSE i.step END,
    state = CASE WHEN o.state IS NOT NULL THEN o.state::jsonb ELSE i.state END,
    attempt = o.attempt,
    run_at = CASE WHEN o.kind = 'ready' THEN o.run_at ELSE i.run_at END,
    key = CASE WHEN o.set_key THEN nullif(o.key, '') ELSE i.key END,
    key_intent = CASE WHEN o.set_key THEN o.key_intent ELSE i.key_intent END,
    key_shard = NULL,
    await_signal = CASE WHEN o.kind = 'await' THEN nullif(o.await_signal, '') END,
    timeout_at = CASE WHEN o.kind = 'await' THEN o.timeout_at END,
    timed_out = false,
    worker = NULL,
    lease_expires_at = NULL,
    result = CASE WHEN o.kind = 'done' THEN o.result::jsonb ELSE i.result END,
    last_error = CASE WHEN o.error <> '' THEN o.error ELSE i.last_error END,
    pending_children = CASE WHEN o.kind = 'spawn' THEN o.children ELSE 0 END,
    round = CASE WHEN o.kind = 'ready' AND o.run_at <= t.now
                 THEN {schema}.fresh_round(i.queue, i.priority, CASE WHEN o.set_key THEN nullif(o.key, '') ELSE i.key END)
            END,
    spawn_gen = CASE WHEN o.kind = 'spawn' THEN i.spawn_gen + 1 ELSE i.spawn_gen END,
    -- A hand-back keeps when the row first became ready (its run_at when
    -- claimed, before this outcome moves it); any other outcome ends it.
    ready_since = CASE WHEN o.kind = 'ready' AND o.hand_back THEN coalesce(i.ready_since, i.run_at) END,
    updated_at = t.now
FROM (SELECT x.id, x.fence, x.step, x.state, x.attempt, x.set_key, x.key, x.key_intent,
             x.await_signal, x.result, x.error, x.children, x.hand_back, x.ord,
             -- Run and timeout times relative to the store's clock when the
             -- outcome gives a delay rather than a time (one clock for all).
             coalesce(x.run_at, t.now + x.delay_us * interval '1 microsecond') AS run_at,
             coalesce(x.timeout_at, CASE WHEN x.timeout_us > 0 THEN t.now + x.timeout_us * interval '1 microsecond' END) AS timeout_at,
             -- A row canceled while its step ran ends canceled unless the
             -- step finished it (done, failed).
             CASE WHEN c.cancel_requested AND x.kind IN ('ready', 'await', 'spawn') THEN 'canceled' ELSE x.kind END AS kind,
             c.key AS old_key, c.key_shard AS old_shard
      FROM (SELECT * FROM unnest($3::uuid[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::int[],
                  $9::timestamptz[], $10::bool[], $11::text[], $12::text[], $13::text[],
                  $14::timestamptz[], $15::text[], $16::text[], $17::int[], $18::bigint[], $19::bigint[],
                  $20::bool[])
                WITH ORDINALITY AS x(id, fence, kind, step, state, attempt, run_at, set_key, key,
                                     key_intent, await_signal, timeout_at, result, error, children,
                                     delay_us, timeout_us, hand_back, ord)
            ORDER BY x.id) x
      CROSS JOIN t
      CROSS JOIN LATERAL (
          SELECT c.key, c.key_shard, c.cancel_requested FROM {schema}.instances c
          WHERE c.id = x.id AND c.worker = $1 AND c.fence = x.fence AND c.status = 'executing'
          FOR UPDATE) c) o, t
WHERE i.id = o.id
RETURNING o.ord, coalesce(o.old_key, ''), coalesce(o.old_shard, -1), i.status,
          coalesce(i.parent_id::text, ''), i.join_gen, i.spawn_gen, i.queue`

	// sqlConsumeSignals marks the signals committed outcomes consumed.
	sqlConsumeSignals = `
UPDATE {schema}.signals s SET consumed_at = coalesce($3::timestamptz, now())
FROM unnest($1::bigint[], $2::uuid[]) AS c(id, instance_id)
WHERE s.id = c.id AND s.instance_id = c.instance_id AND s.consumed_at IS NULL`

	// sqlLockParents locks parents in id order before their join counters change.
	sqlLockParents = `
SELECT id FROM {schema}.instances WHERE id = ANY ($1::uuid[]) AND status = 'awaiting_children'
ORDER BY id FOR UPDATE`

	// sqlJoinParents counts terminal children ($2[i] of parent $1[i], of
	// its spawn $5[i]) against their parents' joins and wakes a parent whose
	// last child finished. A child of an earlier spawn does not count.
	sqlJoinParents = `
WITH t AS (SELECT coalesce($3::timestamptz, now()) AS now),
w AS (
    UPDATE {schema}.instances p
    SET pending_children = greatest(0, p.pending_children - d.n),
        status = CASE WHEN p.pending_children - d.n <= 0 THEN 'ready' ELSE p.status END,
        run_at = CASE WHEN p.pending_children - d.n <= 0 THEN t.now ELSE p.run_at END,
        round = CASE WHEN p.pending_children - d.n <= 0 THEN {schema}.fresh_round(p.queue, p.priority, p.key) END,
        updated_at = t.now
    FROM unnest($1::uuid[], $2::int[], $5::int[]) AS d(id, n, gen), t
    WHERE p.id = d.id AND p.status = 'awaiting_children' AND p.spawn_gen = d.gen
    RETURNING p.queue, p.status
)
SELECT q.queue, q.n FROM (SELECT queue, count(*) AS n FROM w WHERE status = 'ready' GROUP BY queue) q
CROSS JOIN LATERAL (SELECT pg_notify($4, q.queue)) x`

	// sqlSetPending corrects a spawn's join counter when some children were
	// duplicates (not inserted), waking the parent when none was.
	sqlSetPending = `
WITH t AS (SELECT coalesce($3::timestamptz, now()) AS now),
w AS (
    UPDATE {schema}.instances p
    SET pending_children = d.n,
        status = CASE WHEN d.n <= 0 THEN 'ready' ELSE p.status END,
        run_at = CASE WHEN d.n <= 0 THEN t.now ELSE p.run_at END,
        round = CASE WHEN d.n <= 0 THEN {schema}.fresh_round(p.queue, p.priority, p.key) END
    FROM unnest($1::uuid[], $2::int[]) AS d(id, n), t
    WHERE p.id = d.id AND p.status = 'awaiting_children'
    RETURNING p.queue, p.status
)
SELECT q.queue, q.n FROM (SELECT queue, count(*) AS n FROM w WHERE status = 'ready' GROUP BY queue) q
CROSS JOIN LATERAL (SELECT pg_notify($4, q.queue)) x`

	// sqlRecheckInbox wakes rows that just parked on a signal already in
	// their inbox (the signal committed between the claim and the park).
	sqlRecheckInbox = `
WITH w AS (
    UPDATE {schema}.instances i
    SET status = 'ready', run_at = coalesce($2::timestamptz, now()), timeout_at = NULL,
        round = {schema}.fresh_round(i.queue, i.priority, i.key), updated_at = coalesce($2::timestamptz, now())
    WHERE i.id = ANY ($1::uuid[]) AND i.status = 'awaiting'
      AND EXISTS (SELECT 1 FROM {schema}.signals s
                  WHERE s.instance_id = i.id AND s.name = i.await_signal AND s.consumed_at IS NULL)
    RETURNING i.queue
)
SELECT q.queue, q.n FROM (SELECT queue, count(*) AS n FROM w GROUP BY queue) q
CROSS JOIN LATERAL (SELECT pg_notify($3, q.queue)) x`

	// sqlHistoryInsert records step runs; a run's start defaults to its
	// claim's and its end to now.
	sqlHistoryInsert = `
INSERT INTO {schema}.history (instance_id, step, attempt, key, worker, started_at, finished_at, outcome, error)
SELECT x.id, x.step, x.attempt, x.key, x.worker, coalesce(x.started_at, i.started_at),
       coalesce(x.finished_at, $10::timestamptz, now()), x.outcome, x.error
FROM unnest($1::uuid[], $2::text[], $3::int[], $4::text[], $5::text[], $6::timestamptz[],
            $7::timestamptz[], $8::text[], $9::text[])
     WITH ORDINALITY AS x(id, step, attempt, key, worker, started_at, finished_at, outcome, error, ord)
JOIN {schema}.instances i ON i.id = x.id
ORDER BY x.ord`

	// sqlHeartbeat extends the leases of claims the worker still holds,
	// locking the rows in id order like every other multi-row transition (a
	// plain join locked them in plan order and deadlocked with Complete).
	sqlHeartbeat = `
UPDATE {schema}.instances i
SET lease_expires_at = coalesce($4::timestamptz, now()) + $5::bigint * interval '1 microsecond'
FROM (SELECT c.id
      FROM unnest($2::uuid[], $3::bigint[]) AS x(id, fence)
      JOIN {schema}.instances c
        ON c.id = x.id AND c.worker = $1 AND c.fence = x.fence AND c.status = 'executing'
      ORDER BY c.id FOR UPDATE OF c) o
WHERE i.id = o.id
RETURNING i.id::text, i.cancel_requested`

	// sqlRelease returns unstarted claims to ready, keeping their place
	// (run_at) and attempt; a claim whose cancel was requested ends
	// canceled. It returns the key and shard each row held, and what a
	// canceled child needs for its parent's join.
	sqlRelease = `
UPDATE {schema}.instances i
SET status = CASE WHEN i.cancel_requested THEN 'canceled' ELSE 'ready' END, worker = NULL, lease_expires_at = NULL, key_shard = NULL, started_at = NULL,
    updated_at = coalesce($4::timestamptz, now())
FROM (SELECT c.id, c.key AS old_key, c.key_shard AS old_shard
      FROM unnest($2::uuid[], $3::bigint[]) AS x(id, fence)
      JOIN {schema}.instances c
        ON c.id = x.id AND c.worker = $1 AND c.fence = x.fence AND c.status = 'executing'
      WHERE c.id = ANY ($2::uuid[])
      ORDER BY c.id FOR UPDATE OF c) o
WHERE i.id = o.id
RETURNING coalesce(o.old_key, ''), coalesce(o.old_shard, -1), i.queue,
          i.status, coalesce(i.parent_id::text, ''), i.join_gen`

	// sqlCancel cancels a non-terminal instance and returns what it held.
	// An executing row keeps its claim and slot: it is only marked, and
	// its worker told on the cancel channel; its claim's end makes it
	// canceled (see store.Store).
	sqlCancel = `
UPDATE {schema}.instances i
SET status = CASE WHEN o.old_status = 'executing' THEN 'executing' ELSE 'canceled' END,
    cancel_requested = (o.old_status = 'executing'),
    updated_at = coalesce($2::timestamptz, now())
FROM (SELECT id, status AS old_status, key AS old_key, key_shard AS old_shard, cancel_requested AS was_requested
      FROM {schema}.instances WHERE id = $1 FOR UPDATE) o
WHERE i.id = o.id AND i.id = $1 AND o.old_status NOT IN ('done', 'failed', 'canceled')
  AND NOT o.was_requested
RETURNING o.old_status, coalesce(o.old_key, ''), coalesce(o.old_shard, -1), coalesce(i.parent_id::text, ''), i.join_gen`

	// sqlNotifyCancel tells the workers that the cancel of executing
	// instance $2 was requested, on the schema's cancel channel $1.
	sqlNotifyCancel = `SELECT pg_notify($1, $2::text)`

	// sqlStatusOf reads an instance's status (to explain why a change did nothing).
	sqlStatusOf = `SELECT status FROM {schema}.instances WHERE id = $1`

	// sqlRetry makes a failed or canceled instance ready at its current step.
	// A child whose parent still joins its spawn counts in the join again.
	sqlRetry = `
WITH w AS (
    UPDATE {schema}.instances
    SET status = 'ready', attempt = 0, run_at = coalesce($2::timestamptz, now()), worker = NULL, cancel_requested = false,
        ready_since = NULL,
        lease_expires_at = NULL, key_shard = NULL, timed_out = false, timeout_at = NULL,
        await_signal = NULL, result = NULL, round = {schema}.fresh_round(queue, priority, key),
        updated_at = coalesce($2::timestamptz, now())
    WHERE id = $1 AND status IN ('failed', 'canceled')
    RETURNING queue, parent_id, join_gen
),
j AS (
    UPDATE {schema}.instances p SET pending_children = p.pending_children + 1
    FROM w
    WHERE p.id = w.parent_id AND p.status = 'awaiting_children' AND p.spawn_gen = w.join_gen
)
SELECT q.queue, q.n FROM (SELECT queue, count(*) AS n FROM w GROUP BY queue) q
CROSS JOIN LATERAL (SELECT pg_notify($3, q.queue)) x`
)

// Signals.
const (
	// sqlSignalStore locks the instance FOR KEY SHARE, which conflicts with
	// the FOR UPDATE lock of a park (sqlCompleteApply): a concurrent park
	// either commits first or waits for this signal. The weak mode leaves
	// blocked rows promotable (sqlPromote). It stores the signal unless the
	// instance is terminal or the dedup key was seen, and returns the status
	// and whether the signal was stored; no row means no instance.
	sqlSignalStore = `
WITH inst AS (SELECT id, status FROM {schema}.instances WHERE id = $1 FOR KEY SHARE),
ins AS (
    INSERT INTO {schema}.signals (instance_id, name, payload, dedup_key, created_at)
    SELECT inst.id, $2, $3::jsonb, nullif($4, ''), coalesce($5::timestamptz, now())
    FROM inst WHERE inst.status NOT IN ('done', 'failed', 'canceled')
    ON CONFLICT (instance_id, dedup_key) DO NOTHING
    RETURNING id
)
SELECT inst.status, EXISTS (SELECT 1 FROM ins) FROM inst`

	// sqlSignalWake wakes the instance if it awaits a signal now in its inbox.
	// It runs as its own statement after sqlSignalStore, under its row lock.
	sqlSignalWake = `
WITH w AS (
    UPDATE {schema}.instances i
    SET status = 'ready', run_at = coalesce($2::timestamptz, now()), timeout_at = NULL, timed_out = false,
        round = {schema}.fresh_round(i.queue, i.priority, i.key), updated_at = coalesce($2::timestamptz, now())
    WHERE i.id = $1 AND i.status = 'awaiting'
      AND EXISTS (SELECT 1 FROM {schema}.signals s
                  WHERE s.instance_id = i.id AND s.name = i.await_signal AND s.consumed_at IS NULL)
    RETURNING i.queue
)
SELECT queue, count(*) AS n FROM w GROUP BY queue`
)

// Timers, reaper, reconciler.
const (
	// sqlFireTimers makes up to $2 awaits whose timeout passed ready.
	sqlFireTimers = `
WITH d AS MATERIALIZED (
    SELECT id FROM {schema}.instances
    WHERE status = 'awaiting' AND timeout_at IS NOT NULL AND timeout_at <= coalesce($1::timestamptz, now())
    ORDER BY timeout_at LIMIT $2 FOR UPDATE SKIP LOCKED),
w AS (
    UPDATE {schema}.instances i
    SET status = 'ready', timed_out = true, run_at = i.timeout_at, timeout_at = NULL,
        round = {schema}.fresh_round(i.queue, i.priority, i.key), updated_at = coalesce($1::timestamptz, now())
    WHERE i.id = ANY (ARRAY(SELECT id FROM d))
    RETURNING i.queue
)
SELECT q.queue, q.n FROM (SELECT queue, count(*) AS n FROM w GROUP BY queue) q
CROSS JOIN LATERAL (SELECT pg_notify($3, q.queue)) x`

	// sqlReap takes back up to $2 claims whose lease expired; attempt + 1.
	// A claim whose cancel was requested ends canceled.
	sqlReap = `
WITH o AS MATERIALIZED (
    SELECT id, key AS old_key, key_shard AS old_shard FROM {schema}.instances
    WHERE status = 'executing' AND lease_expires_at < coalesce($1::timestamptz, now())
    ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)
UPDATE {schema}.instances i
SET status = CASE WHEN i.cancel_requested THEN 'canceled' ELSE 'ready' END,
    attempt = CASE WHEN i.cancel_requested THEN i.attempt ELSE i.attempt + 1 END, worker = NULL, lease_expires_at = NULL,
    key_shard = NULL, started_at = NULL, updated_at = coalesce($1::timestamptz, now())
FROM o
WHERE i.id = o.id
RETURNING coalesce(o.old_key, ''), coalesce(o.old_shard, -1), i.queue,
          i.status, coalesce(i.parent_id::text, ''), i.join_gen`

	// sqlReclaimWorker takes back every claim of a worker, like sqlReap.
	sqlReclaimWorker = `
WITH o AS MATERIALIZED (
    SELECT id, key AS old_key, key_shard AS old_shard FROM {schema}.instances
    WHERE status = 'executing' AND worker = $1
    ORDER BY id FOR UPDATE)
UPDATE {schema}.instances i
SET status = CASE WHEN i.cancel_requested THEN 'canceled' ELSE 'ready' END,
    attempt = CASE WHEN i.cancel_requested THEN i.attempt ELSE i.attempt + 1 END, worker = NULL, lease_expires_at = NULL,
    key_shard = NULL, started_at = NULL, updated_at = coalesce($2::timestamptz, now())
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
	// of limited names admitted at K = 1 (shard -1).
	sqlGateHolders = `
SELECT key, key_shard, count(*) FROM {schema}.instances
WHERE status = 'executing' AND key_shard IS NOT NULL AND key > $1 AND ($2::text IS NULL OR key <= $2::text)
GROUP BY key, key_shard
UNION ALL
SELECT i.key, -1, count(*) FROM {schema}.instances i JOIN {schema}.limits l ON l.name = i.key_name
WHERE i.status = 'executing' AND i.key IS NOT NULL AND i.key_shard IS NULL
  AND i.key > $1 AND ($2::text IS NULL OR i.key <= $2::text)
GROUP BY i.key`

	// sqlSlotsInsert creates counters or overwrites them; the caller holds
	// the locks of the counters it overwrites (it read them under those
	// locks, with the holders read after them).
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
	sqlSlotsInsert = `
INSERT INTO {schema}.key_slots (key, shard, capacity, available)
SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::int[])
ON CONFLICT (key, shard) DO UPDATE SET capacity = excluded.capacity, available = excluded.available`

	// sqlSlotsDeleteIdle deletes counters of keys with nothing executing,
	// every slot free and no row waiting.
	sqlSlotsDeleteIdle = `
DELETE FROM {schema}.key_slots s
WHERE s.key = ANY ($1::text[])
  AND NOT EXISTS (SELECT 1 FROM {schema}.instances i
                  WHERE i.key = s.key AND i.status IN ('ready', 'blocked'))`

	// sqlSlotsDelete deletes counters of keys whose name lost its limit.
	sqlSlotsDelete = `DELETE FROM {schema}.key_slots WHERE key = ANY ($1::text[])`

	// sqlBlockedKeys lists the distinct keys with blocked rows, skipping
	// through the waiting index one key at a time.
	sqlBlockedKeys = `
WITH RECURSIVE k AS (
    (SELECT key FROM {schema}.instances
     WHERE key IS NOT NULL AND status IN ('ready', 'blocked') AND status = 'blocked'
     ORDER BY key LIMIT 1)
    UNION ALL
    SELECT (SELECT i.key FROM {schema}.instances i
            WHERE i.key > k.key AND i.key IS NOT NULL AND i.status IN ('ready', 'blocked')
              AND i.status = 'blocked'
            ORDER BY i.key LIMIT 1)
    FROM k WHERE k.key IS NOT NULL
)
SELECT k.key, l."limit", l.shards
FROM k LEFT JOIN {schema}.limits l ON l.name = split_part(k.key, ':', 1)
WHERE k.key IS NOT NULL`

	// sqlStranded returns the keys of $1 still stranded after a heal
	// attempt's promotion (see strandedWhere; $2[i]: K = 1).
	sqlStranded = `
SELECT f.key FROM unnest($1::text[], $2::bool[]) AS f(key, one) WHERE ` + strandedWhere

	// strandedWhere is the condition on f(key, one) of sqlStranded and
	// sqlPromote: the key has a blocked row, no ready row, and room (for a
	// K = 1 key no executing row, for a gate key a free slot on its counters
	// or no counters). Its blocked rows were skipped (locked by someone),
	// and nothing else would promote them before the reconciler's sweep. A
	// gate whose slots are all taken is saturated, not stranded.
	strandedWhere = `
    EXISTS (SELECT 1 FROM {schema}.instances b WHERE b.key = f.key AND b.status = 'blocked')
    AND NOT EXISTS (SELECT 1 FROM {schema}.instances r WHERE r.key = f.key AND r.status = 'ready')
    AND CASE WHEN f.one
             THEN NOT EXISTS (SELECT 1 FROM {schema}.instances e WHERE e.key = f.key AND e.status = 'executing')
             ELSE coalesce((SELECT sum(s.available) FROM {schema}.key_slots s WHERE s.key = f.key), 1) > 0 END`

	// sqlPromoteIfRoom promotes up to $2 blocked rows of each key of $1 that
	// has room now: a K = 1 key with no executing row (the caller holds its
	// advisory lock), or a gate key with free slots (or no counters yet);
	// with $5, only a key that has no ready row. Like sqlPromote it skips
	// rows locked FOR NO KEY UPDATE or stronger.
	sqlPromoteIfRoom = `
WITH d AS MATERIALIZED (
    SELECT b.id FROM unnest($1::text[]) AS k
    LEFT JOIN {schema}.limits l ON l.name = split_part(k, ':', 1)
    CROSS JOIN LATERAL (
        SELECT CASE WHEN $5::bool AND EXISTS (SELECT 1 FROM {schema}.instances x
                                              WHERE x.key = k AND x.status = 'ready') THEN 0
                    WHEN l.name IS NULL THEN
                    CASE WHEN EXISTS (SELECT 1 FROM {schema}.instances e
                                      WHERE e.key = k AND e.status = 'executing') THEN 0 ELSE 1 END
               ELSE coalesce((SELECT sum(available) FROM {schema}.key_slots s WHERE s.key = k), l."limit")
               END AS room) r
    CROSS JOIN LATERAL (SELECT id FROM {schema}.instances
                        WHERE key = k AND status = 'blocked'
                        ORDER BY priority, run_at, seq LIMIT least(r.room, $2) FOR NO KEY UPDATE SKIP LOCKED) b),
p AS (
    UPDATE {schema}.instances i SET status = 'ready', updated_at = coalesce($3::timestamptz, now())
    WHERE i.id = ANY (ARRAY(SELECT id FROM d))
    RETURNING i.queue
)
SELECT q.queue, q.n FROM (SELECT queue, count(*) AS n FROM p GROUP BY queue) q
CROSS JOIN LATERAL (SELECT pg_notify($4, q.queue)) x`

	// sqlDeleteTerminal deletes up to $2 terminal rows last changed before $1.
	sqlDeleteTerminal = `
DELETE FROM {schema}.instances WHERE id IN (
    SELECT id FROM {schema}.instances
    WHERE status IN ('done', 'failed', 'canceled') AND updated_at < $1::timestamptz
    LIMIT $2)`
)

// Limits, rate limits and queue policies: desired state per namespace.
const (
	sqlLimitsLock = `SELECT pg_advisory_xact_lock($1::bigint)`

	sqlLimitsAll = `SELECT name, "limit", shards FROM {schema}.limits ORDER BY name`

	sqlLimitsOwned = `SELECT name, "limit", shards, namespace FROM {schema}.limits ORDER BY name`

	// sqlLimitsReplace makes the stored limits exactly the given list.
	sqlLimitsReplace = `
WITH d AS (DELETE FROM {schema}.limits WHERE name <> ALL ($1::text[]))
INSERT INTO {schema}.limits (name, "limit", shards, namespace)
SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::text[])
ON CONFLICT (name) DO UPDATE SET "limit" = excluded."limit", shards = excluded.shards, namespace = excluded.namespace`

	sqlRatesAll = `SELECT name, "limit", period_us, burst, per_key, namespace FROM {schema}.rate_limits ORDER BY name`

	// sqlRatesReplace makes the stored rate limits exactly the given list.
	sqlRatesReplace = `
WITH d AS (DELETE FROM {schema}.rate_limits WHERE name <> ALL ($1::text[]))
INSERT INTO {schema}.rate_limits (name, "limit", period_us, burst, per_key, namespace)
SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::int[], $5::bool[], $6::text[])
ON CONFLICT (name) DO UPDATE SET "limit" = excluded."limit", period_us = excluded.period_us,
    burst = excluded.burst, per_key = excluded.per_key, namespace = excluded.namespace`

	// sqlBucketsDrop deletes the buckets of names ($1) whose rate limit went
	// away or changed scope.
	sqlBucketsDrop = `DELETE FROM {schema}.rate_buckets WHERE split_part(bucket, ':', 1) = ANY ($1::text[])`

	// sqlBucketsRescale keeps the tokens of the buckets of a name whose rate
	// limit changed: credit × new token credit / old token credit, rounded
	// down, at most the new capacity (see gate.RateLimit.Rescale).
	sqlBucketsRescale = `
UPDATE {schema}.rate_buckets b
SET credit = least(d.cap, floor(b.credit::numeric * d.new_tc / d.old_tc))::bigint
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS d(name, old_tc, new_tc, cap)
WHERE split_part(b.bucket, ':', 1) = d.name`

	// sqlSlotsOfNames locks the counters of keys with the given names, in order.
	sqlSlotsOfNames = `
SELECT key, shard, capacity, available FROM {schema}.key_slots
WHERE split_part(key, ':', 1) = ANY ($1::text[]) ORDER BY key, shard FOR UPDATE`

	sqlLiveByName = `
SELECT key_name, count(*) FROM {schema}.instances
WHERE key_name = ANY ($1::text[]) AND status NOT IN ('done', 'failed', 'canceled')
GROUP BY key_name`

	sqlPoliciesAll = `
SELECT queue, namespace, max_active, coalesce(max_active_per_key, 0) FROM {schema}.queue_policies ORDER BY queue`

	// sqlPoliciesSync deletes the namespace's ($1) policies not in the list
	// (unless $5, keep omitted) and upserts the list.
	sqlPoliciesSync = `
WITH d AS (DELETE FROM {schema}.queue_policies
           WHERE namespace = $1 AND NOT $5::bool AND queue <> ALL ($2::text[]))
INSERT INTO {schema}.queue_policies (queue, namespace, max_active, max_active_per_key, updated_at)
SELECT q, $1, m, nullif(k, 0), now() FROM unnest($2::text[], $3::int[], $4::int[]) AS x(q, m, k)
ON CONFLICT (queue) DO UPDATE SET max_active = excluded.max_active,
    max_active_per_key = excluded.max_active_per_key, updated_at = now()
WHERE queue_policies.namespace = $1 AND (queue_policies.max_active, queue_policies.max_active_per_key)
      IS DISTINCT FROM (excluded.max_active, excluded.max_active_per_key)`

	// sqlBlockedKeysIn lists the distinct keys with blocked rows in the given queues.
	sqlBlockedKeysIn = `
SELECT DISTINCT i.key, l."limit" IS NOT NULL FROM {schema}.instances i
LEFT JOIN {schema}.limits l ON l.name = i.key_name
WHERE i.status = 'blocked' AND i.queue = ANY ($1::text[]) ORDER BY i.key`

	// sqlBucketsCollect deletes up to $2 buckets that are full at $1 (a
	// missing bucket starts full: deleting grants nothing unearned) or whose
	// name has no rate limit of the bucket's scope.
	sqlBucketsCollect = `
DELETE FROM {schema}.rate_buckets WHERE bucket IN (
    SELECT b.bucket FROM {schema}.rate_buckets b
    LEFT JOIN {schema}.rate_limits r
           ON r.name = split_part(b.bucket, ':', 1) AND r.per_key = (strpos(b.bucket, ':') > 0)
    WHERE r.name IS NULL
       OR b.credit::numeric + greatest(0, floor(extract(epoch FROM coalesce($1::timestamptz, now()) - b.updated_at) * 1000000))
              * r."limit" >= r.burst::numeric * r.period_us
    LIMIT $2)`
)

// Reads.
const (
	sqlGet = `SELECT ` + instanceColumns + ` FROM {schema}.instances WHERE id = $1`

	sqlList = `
SELECT ` + instanceColumns + ` FROM {schema}.instances
WHERE ($1 = '' OR workflow = $1)
  AND (cardinality($2::text[]) = 0 OR status = ANY ($2::text[]))
  AND ($3 = '' OR key = $3)
  AND ($4 = '' OR queue = $4)
  AND ($5::uuid IS NULL OR id > $5::uuid)
ORDER BY id LIMIT $6`

	// sqlListNewest is sqlList newest first: by seq descending, paged by the
	// seq of the previous page's last id (none when that row is gone). No
	// index orders instances by seq yet, so unless a status filter narrows
	// it to a partial index this reads every matching row to return the
	// page (about 0.4 s unfiltered at a million rows); an index on (seq)
	// is the pending fix (a migration).
	sqlListNewest = `
SELECT ` + instanceColumns + ` FROM {schema}.instances
WHERE ($1 = '' OR workflow = $1)
  AND (cardinality($2::text[]) = 0 OR status = ANY ($2::text[]))
  AND ($3 = '' OR key = $3)
  AND ($4 = '' OR queue = $4)
  AND ($5::uuid IS NULL OR seq < (SELECT p.seq FROM {schema}.instances p WHERE p.id = $5::uuid))
ORDER BY seq DESC LIMIT $6`

	// sqlInbox reads an instance's unconsumed signals through signals_inbox.
	sqlInbox = `
SELECT id, instance_id::text, name, payload, coalesce(dedup_key, ''), created_at
FROM {schema}.signals WHERE instance_id = $1 AND consumed_at IS NULL
ORDER BY id LIMIT $2`

	sqlChildren = `SELECT ` + instanceColumns + ` FROM {schema}.instances WHERE parent_id = $1 ORDER BY seq`

	sqlHistory = `
SELECT instance_id::text, step, attempt, coalesce(key, ''), coalesce(worker, ''), started_at,
       finished_at, outcome, coalesce(error, '')
FROM {schema}.history WHERE instance_id = $1 ORDER BY id`

	sqlKeyHolders = `
SELECT ` + instanceColumns + ` FROM {schema}.instances
WHERE key = $1 AND status = 'executing' ORDER BY started_at, id LIMIT $2`

	// KeyInfo's waiting rows: the ready and blocked rows of the key through
	// instances_key_waiting, and its scheduled rows apart (the key index does
	// not hold them; they are found among the scheduled rows alone), so that
	// explaining a key never scans the table.
	sqlKeyWaiting = `
SELECT (SELECT count(*) FROM {schema}.instances WHERE key = $1 AND status IN ('ready', 'blocked'))
     + (SELECT count(*) FROM {schema}.instances WHERE key = $1 AND status = 'scheduled'),
       (SELECT count(*) FROM {schema}.instances WHERE key = $1 AND status IN ('ready', 'blocked') AND status = 'blocked')`

	sqlKeyNext = `
SELECT ` + instanceColumns + ` FROM (
    (SELECT * FROM {schema}.instances WHERE key = $1 AND status IN ('ready', 'blocked') ORDER BY priority, run_at, seq LIMIT 1)
    UNION ALL
    (SELECT * FROM {schema}.instances WHERE key = $1 AND status = 'scheduled' ORDER BY priority, run_at, seq LIMIT 1)
) w ORDER BY priority, run_at, seq LIMIT 1`

	sqlKeyOldest = `
SELECT ` + instanceColumns + ` FROM (
    (SELECT * FROM {schema}.instances WHERE key = $1 AND status IN ('ready', 'blocked') ORDER BY run_at, seq LIMIT 1)
    UNION ALL
    (SELECT * FROM {schema}.instances WHERE key = $1 AND status = 'scheduled' ORDER BY run_at, seq LIMIT 1)
) w ORDER BY run_at, seq LIMIT 1`

	sqlKeySlots = `SELECT shard, capacity, available FROM {schema}.key_slots WHERE key = $1 ORDER BY shard`

	// sqlKeyRate is the rate limit of a key's name and the bucket the key draws from.
	sqlKeyRate = `
SELECT r."limit", r.period_us, r.burst, r.per_key, b.credit, b.updated_at
FROM {schema}.rate_limits r
LEFT JOIN {schema}.rate_buckets b ON b.bucket = CASE WHEN r.per_key THEN $1 ELSE r.name END
WHERE r.name = split_part($1, ':', 1)`

	sqlLimitOf = `SELECT "limit", shards FROM {schema}.limits WHERE name = $1`
)

// Health: every statement reads through a partial index, so terminal rows
// other than failed ones are never read. They run in one read-only
// snapshot (see health.go).
const (
	// sqlHealthReady counts, per queue, the ready and delayed rows, those
	// whose run time is after $1 (NULL: the transaction's now()), and their
	// earliest run time (a due row's when it is not after $1). Each part
	// reads one partial index (index only): the keyless and keyed pick
	// indexes and the delayed rows' index.
	sqlHealthReady = `
SELECT queue, count(*), count(*) FILTER (WHERE run_at > (SELECT coalesce($1::timestamptz, now()))), min(run_at)
FROM {schema}.instances WHERE status = 'ready' AND key IS NULL GROUP BY queue
UNION ALL
SELECT queue, count(*), count(*) FILTER (WHERE run_at > (SELECT coalesce($1::timestamptz, now()))), min(run_at)
FROM {schema}.instances WHERE status = 'ready' AND key IS NOT NULL GROUP BY queue
UNION ALL
SELECT queue, count(*), count(*) FILTER (WHERE run_at > (SELECT coalesce($1::timestamptz, now()))), min(run_at)
FROM {schema}.instances WHERE status = 'scheduled' GROUP BY queue`

	// sqlHealthHandedBackOldest is, per queue, the earliest ready_since of
	// its handed-back rows (index only: instances_handed_back).
	sqlHealthHandedBackOldest = `
SELECT queue, min(ready_since) FROM {schema}.instances
WHERE ready_since IS NOT NULL AND status IN ('ready', 'scheduled') GROUP BY queue`

	// sqlHealthHandedBack counts the handed-back rows per workflow and
	// version over the first $1 + 1 of them in that order (the index's):
	// the caller caps the total at $1.
	sqlHealthHandedBack = `
SELECT workflow, version, count(*) FROM (
    SELECT workflow, version FROM {schema}.instances
    WHERE ready_since IS NOT NULL AND status IN ('ready', 'scheduled')
    ORDER BY workflow, version LIMIT $1 + 1) x
GROUP BY workflow, version ORDER BY workflow, version`

	// sqlHealthNow is the time Health measures ages from: $1, or the
	// transaction's now().
	sqlHealthNow = `SELECT coalesce($1::timestamptz, now())`

	// sqlHealthPolicies lists the queue policies.
	sqlHealthPolicies = `SELECT queue, max_active, coalesce(max_active_per_key, 0) FROM {schema}.queue_policies`

	// sqlHealthSerial keeps Health off parallel workers: it is a monitoring
	// read that runs often and must not take cores from the claims.
	sqlHealthSerial = `SET LOCAL max_parallel_workers_per_gather = 0`

	// sqlHealthStatuses counts blocked, parked, failed and executing rows per queue.
	sqlHealthStatuses = `
SELECT queue, status, count(*) FROM {schema}.instances
WHERE status IN ('blocked', 'awaiting', 'awaiting_children', 'failed') GROUP BY queue, status
UNION ALL
SELECT queue, 'executing', count(*) FROM {schema}.instances WHERE status = 'executing' GROUP BY queue`

	// sqlHealthBlockedByName counts blocked rows per key name (through the
	// waiting index: the name is computed from the key).
	sqlHealthBlockedByName = `
SELECT split_part(key, ':', 1), count(*) FROM {schema}.instances
WHERE key IS NOT NULL AND status IN ('ready', 'blocked') AND status = 'blocked'
GROUP BY 1`

	// sqlHealthGates aggregates, per limited name, the executing rows of its
	// keys: how many, the most on one key, and how many keys have no room:
	// what a claim could admit (see admission.go: the free slots of the
	// limit's shards, no more than the limit less the slots in use), or the
	// limit less the executing rows when the key has no counter yet.
	sqlHealthGates = `
WITH e AS (
    SELECT key, key_name, count(*) AS active FROM {schema}.instances
    WHERE status = 'executing' AND key IS NOT NULL GROUP BY key, key_name
),
r AS (
    SELECT e.key_name, e.active,
           CASE WHEN s.n = 0 THEN l."limit" - e.active ELSE least(s.free, l."limit" - s.used) END AS room
    FROM e JOIN {schema}.limits l ON l.name = e.key_name
    CROSS JOIN LATERAL (SELECT count(*) AS n,
                               coalesce(sum(available) FILTER (WHERE shard < l.shards), 0) AS free,
                               coalesce(sum(capacity - available), 0) AS used
                        FROM {schema}.key_slots WHERE key = e.key) s
)
SELECT key_name, sum(active), max(active), count(*) FILTER (WHERE room <= 0) FROM r GROUP BY key_name`

	// sqlHealthPolicyKeys counts, per queue whose policy has a
	// MaxActivePerKey, the keys at that budget with work waiting: keys with
	// at least MaxActivePerKey executing rows in the queue (read through
	// the executing rows' index, so bounded by a fleet's executors) and a
	// row of the queue waiting for them: blocked, or ready (or delayed) and
	// due at $1 (NULL: the transaction's now()). It counts at most $2 + 1
	// keys per queue; the caller caps the count at $2.
	sqlHealthPolicyKeys = `
SELECT p.queue, x.n FROM {schema}.queue_policies p
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT e.key FROM (
            SELECT key FROM {schema}.instances
            WHERE status = 'executing' AND queue = p.queue AND key IS NOT NULL
            GROUP BY key HAVING count(*) >= p.max_active_per_key) e
        WHERE EXISTS (SELECT 1 FROM {schema}.instances w
                      WHERE w.key = e.key AND w.status IN ('ready', 'blocked') AND w.queue = p.queue
                        AND (w.status = 'blocked' OR w.run_at <= (SELECT coalesce($1::timestamptz, now()))))
           OR EXISTS (SELECT 1 FROM {schema}.instances w
                      WHERE w.status = 'scheduled' AND w.queue = p.queue AND w.key = e.key
                        AND w.run_at <= (SELECT coalesce($1::timestamptz, now())))
        LIMIT $2 + 1) k) x
WHERE p.max_active_per_key > 0`

	// sqlHealthRates reports, per rate limit, its stored buckets and those
	// with no whole token at $2, over at most $1 buckets of the name (the
	// primary key index, in bucket order).
	sqlHealthRates = `
SELECT r.name, r."limit", r.period_us, r.burst, r.per_key, x.n, x.empty
FROM {schema}.rate_limits r
CROSS JOIN LATERAL (
    SELECT count(*) AS n,
           count(*) FILTER (WHERE b.credit::numeric + greatest(0, floor(extract(epoch FROM coalesce($2::timestamptz, now()) - b.updated_at) * 1000000))
                                  * r."limit" < r.period_us) AS empty
    FROM (SELECT bucket, credit, updated_at FROM {schema}.rate_buckets
          WHERE CASE WHEN r.per_key THEN bucket >= r.name || ':' AND bucket < r.name || ';' ELSE bucket = r.name END
          ORDER BY bucket LIMIT $1 + 1) b) x
ORDER BY r.name`

	// sqlHealthIntents lists the distinct (key name, declared intent) pairs
	// of the executing rows and of the first $1 waiting rows in key order
	// (the order of the waiting index, so that the scan stops after $1 rows
	// however many terminal rows the table holds).
	sqlHealthIntents = `
SELECT DISTINCT key_name, key_intent FROM (
    SELECT key_name, key_intent FROM {schema}.instances WHERE status = 'executing' AND key IS NOT NULL
    UNION ALL
    (SELECT key_name, key_intent FROM {schema}.instances
     WHERE key IS NOT NULL AND status IN ('ready', 'blocked') ORDER BY key LIMIT $1)
) x WHERE key_intent <> ''`
)

// Schedules: definitions per namespace, and the ticks they recorded.
const (
	sqlSchedulesCols = `name, namespace, workflow, cron, time_zone, queue, priority, coalesce(key, ''), key_intent,
    unique_statuses, overlap, catch_up, grace_us, paused, anchor, last_tick, coalesce(last_instance::text, ''),
    last_fired_at, epoch`

	sqlSchedulesAll = `SELECT ` + sqlSchedulesCols + ` FROM {schema}.schedules ORDER BY name`

	sqlScheduleLock = `SELECT ` + sqlSchedulesCols + ` FROM {schema}.schedules WHERE name = $1 FOR UPDATE`

	// sqlSchedulesDeleteOmitted deletes the namespace's ($1) schedules not in $2.
	sqlSchedulesDeleteOmitted = `DELETE FROM {schema}.schedules WHERE namespace = $1 AND name <> ALL ($2::text[])`

	// sqlScheduleUpsert stores one definition: a new schedule is anchored
	// at @now; an existing one keeps its run-time state and moves its epoch.
	sqlScheduleUpsert = `
INSERT INTO {schema}.schedules (name, namespace, workflow, cron, time_zone, queue, priority, key, key_intent,
    unique_statuses, overlap, catch_up, grace_us, anchor)
VALUES (@name, @namespace, @workflow, @cron, @time_zone, @queue, @priority, nullif(@key, ''), @key_intent,
    @unique_statuses::text[], @overlap, @catch_up, @grace_us, coalesce(@now::timestamptz, now()))
ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow, cron = excluded.cron,
    time_zone = excluded.time_zone, queue = excluded.queue, priority = excluded.priority, key = excluded.key,
    key_intent = excluded.key_intent, unique_statuses = excluded.unique_statuses, overlap = excluded.overlap,
    catch_up = excluded.catch_up, grace_us = excluded.grace_us, epoch = schedules.epoch + 1, updated_at = now()`

	// sqlSchedulePause sets paused ($2); a change moves the epoch, and a
	// resume anchors the schedule at $3 (NULL: now).
	sqlSchedulePause = `
UPDATE {schema}.schedules SET paused = $2, epoch = epoch + (paused <> $2)::int,
    anchor = CASE WHEN paused AND NOT $2 THEN coalesce($3::timestamptz, now()) ELSE anchor END,
    updated_at = now()
WHERE name = $1
RETURNING ` + sqlSchedulesCols

	// sqlScheduleRecord records a tick ($2) and, unless $3 is NULL, the
	// instance it started at $4 (NULL: now).
	sqlScheduleRecord = `
UPDATE {schema}.schedules SET last_tick = $2, epoch = epoch + 1,
    last_instance = coalesce($3::uuid, last_instance),
    last_fired_at = CASE WHEN $3::uuid IS NULL THEN last_fired_at ELSE coalesce($4::timestamptz, now()) END,
    updated_at = now()
WHERE name = $1
RETURNING ` + sqlSchedulesCols

	// sqlInstanceRunning says whether an instance exists and is not terminal.
	sqlInstanceRunning = `
SELECT EXISTS (SELECT 1 FROM {schema}.instances WHERE id = $1::uuid AND status NOT IN ('done', 'failed', 'canceled'))`
)

// Limit changes that altered live keys (see store.Health).
const (
	// sqlLimitChangesRecord records, per key name, the last sync that
	// changed the semantics of live keys.
	sqlLimitChangesRecord = `
INSERT INTO {schema}.limit_changes (name, message, live, changed_at)
SELECT x.name, x.message, x.live, coalesce($4::timestamptz, now())
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS x(name, message, live)
ON CONFLICT (name) DO UPDATE SET message = excluded.message, live = excluded.live, changed_at = excluded.changed_at`

	// sqlHealthLimitChanges reads the changes recorded in the $2 µs before $1.
	sqlHealthLimitChanges = `
SELECT name, message, live FROM {schema}.limit_changes
WHERE changed_at > coalesce($1::timestamptz, now()) - $2::bigint * interval '1 microsecond' ORDER BY name`

	// sqlLimitChangesCollect deletes changes recorded more than $2 µs before $1.
	sqlLimitChangesCollect = `
DELETE FROM {schema}.limit_changes
WHERE changed_at <= coalesce($1::timestamptz, now()) - $2::bigint * interval '1 microsecond'`
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
