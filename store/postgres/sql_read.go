package postgres

// Statements of the read paths: instances, keys, health (see read.go and health.go).
// The rules every statement follows (static text, arrays for batches, the
// clock as a parameter, the lock order) are written at the top of sql.go.

// Reads.
const (
	// sqlGet reads instance $1 by primary key (the instance columns; see
	// sql.go).
	sqlGet = `
SELECT id::text, workflow, version, queue, priority, status, step, state, attempt,
       coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
       CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
       timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
       coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
       coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents
FROM {schema}.instances WHERE id = $1`

	// sqlList is a page of instances in id order after cursor $5 (NULL:
	// from the start), at most $6, of workflow $1, statuses $2, key $3 and
	// queue $4 (each empty: any), read along the primary key.
	sqlList = `
SELECT id::text, workflow, version, queue, priority, status, step, state, attempt,
       coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
       CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
       timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
       coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
       coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents
FROM {schema}.instances
WHERE ($1 = '' OR workflow = $1)
  AND (cardinality($2::text[]) = 0 OR status = ANY ($2::text[]))
  AND ($3 = '' OR key = $3 OR extra_keys @> ARRAY[$3::text])
  AND ($4 = '' OR queue = $4)
  AND ($5::uuid IS NULL OR id > $5::uuid)
ORDER BY instances.id LIMIT $6`

	// sqlListNewest is sqlList newest first: by id descending (ids are
	// time-ordered, see store.NewInstanceID), paged by id, so it reads the
	// primary key backwards and stops at the page. The order names the
	// table's column: plain "id" would be the output column id::text, a
	// sort of every matching row.
	sqlListNewest = `
SELECT id::text, workflow, version, queue, priority, status, step, state, attempt,
       coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
       CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
       timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
       coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
       coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents
FROM {schema}.instances
WHERE ($1 = '' OR workflow = $1)
  AND (cardinality($2::text[]) = 0 OR status = ANY ($2::text[]))
  AND ($3 = '' OR key = $3 OR extra_keys @> ARRAY[$3::text])
  AND ($4 = '' OR queue = $4)
  AND ($5::uuid IS NULL OR id < $5::uuid)
ORDER BY instances.id DESC LIMIT $6`

	// sqlListScan and sqlListScanNewest are ListPage bounded by ScanLimit
	// ($7): the subquery s reads at most $7 rows of the primary key after
	// the cursor, in the page's order, and numbers them (n) and marks the matching ones (hit; a NULL key
	// is no match); the outer query
	// keeps the matching ones and the $7-th row whatever it matches, which
	// tells ListPage where the scan stopped. Both come from one snapshot,
	// and the plan is a pipeline (Limit, WindowAgg, Limit, Index Scan): a
	// page that finds $6 matches early stops there. The extra row ($6 + 1)
	// is the $7-th row coming after $6 matches.
	sqlListScan = `
SELECT id::text, workflow, version, queue, priority, status, step, state, attempt,
       coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
       CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
       timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
       coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
       coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents, s.hit, s.n FROM (
  SELECT i.*, row_number() OVER (ORDER BY i.id) AS n,
    coalesce(($1 = '' OR i.workflow = $1)
      AND (cardinality($2::text[]) = 0 OR i.status = ANY ($2::text[]))
      AND ($3 = '' OR i.key = $3 OR i.extra_keys @> ARRAY[$3::text])
      AND ($4 = '' OR i.queue = $4), false) AS hit
  FROM (SELECT * FROM {schema}.instances WHERE ($5::uuid IS NULL OR id > $5::uuid)
        ORDER BY instances.id LIMIT $7) i
) s WHERE s.hit OR s.n = $7
ORDER BY s.id LIMIT $6 + 1`

	// sqlListScanNewest: see sqlListScan.
	sqlListScanNewest = `
SELECT id::text, workflow, version, queue, priority, status, step, state, attempt,
       coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
       CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
       timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
       coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
       coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents, s.hit, s.n FROM (
  SELECT i.*, row_number() OVER (ORDER BY i.id DESC) AS n,
    coalesce(($1 = '' OR i.workflow = $1)
      AND (cardinality($2::text[]) = 0 OR i.status = ANY ($2::text[]))
      AND ($3 = '' OR i.key = $3 OR i.extra_keys @> ARRAY[$3::text])
      AND ($4 = '' OR i.queue = $4), false) AS hit
  FROM (SELECT * FROM {schema}.instances WHERE ($5::uuid IS NULL OR id < $5::uuid)
        ORDER BY instances.id DESC LIMIT $7) i
) s WHERE s.hit OR s.n = $7
ORDER BY s.id DESC LIMIT $6 + 1`

	// sqlInbox reads an instance's unconsumed signals through signals_inbox.
	sqlInbox = `
SELECT id, instance_id::text, name, payload, coalesce(dedup_key, ''), created_at
FROM {schema}.signals WHERE instance_id = $1 AND consumed_at IS NULL
ORDER BY id LIMIT $2`

	// sqlChildren lists the children of instance $1 in creation order,
	// through instances_parent.
	sqlChildren = `
SELECT id::text, workflow, version, queue, priority, status, step, state, attempt,
       coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
       CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
       timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
       coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
       coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents
FROM {schema}.instances WHERE parent_id = $1 ORDER BY seq`

	// sqlHistory lists the step runs of instance $1 in the order recorded.
	sqlHistory = `
SELECT instance_id::text, step, attempt, coalesce(key, ''), coalesce(worker, ''), started_at,
       finished_at, outcome, coalesce(error, '')
FROM {schema}.history WHERE instance_id = $1 ORDER BY id`

	// sqlKeyHolders lists up to $2 executing rows of key $1, oldest start
	// first (KeyInfo's holders): rows of the key and rows of several keys
	// that hold it as another key (key_holds).
	sqlKeyHolders = `
SELECT id::text, workflow, version, queue, priority, status, step, state, attempt,
       coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
       CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
       timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
       coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
       coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents
FROM {schema}.instances
WHERE id IN (SELECT id FROM {schema}.instances WHERE key = $1 AND status = 'executing'
             UNION ALL
             SELECT h.instance_id FROM {schema}.key_holds h WHERE h.key = $1)
ORDER BY started_at, id LIMIT $2`

	// KeyInfo's waiting rows: the ready and blocked rows of the key (counted
	// through instances_key_round, whose predicate is theirs; the next one
	// read from instances_key_ready_posix and instances_key_blocked_posix,
	// each in admission order, with reserved rows apart, read among the
	// key's waiting rows of instances_key_round), and its scheduled rows
	// apart (the key indexes do not hold them; they are found among the
	// scheduled rows alone), so that explaining a key never scans the table;
	// then the rows of several keys that carry the key among their other
	// keys and wait in another key's line, found among the live rows that
	// carry it (instances_live_extra_keys, whose predicate the conditions
	// repeat), which are bounded by what waits and runs: instances_extra_keys
	// holds every row that ever carried the key, ended ones included, so a
	// read of it grows with the retained history.
	sqlKeyWaiting = `
SELECT (SELECT count(*) FROM {schema}.instances WHERE key = $1 AND status IN ('ready', 'blocked'))
     + (SELECT count(*) FROM {schema}.instances WHERE key = $1 AND status = 'scheduled'),
       (SELECT count(*) FROM {schema}.instances WHERE key = $1 AND status IN ('ready', 'blocked') AND status = 'blocked'),
       (SELECT count(*) FROM {schema}.instances
        WHERE {schema}.key_terms(extra_keys) @> ARRAY[$1::text] AND extra_keys IS NOT NULL
          AND status COLLATE "C" NOT IN ('done', 'failed', 'canceled')
          AND extra_keys @> ARRAY[$1::text] AND status IN ('ready', 'blocked'))`

	// sqlKeyNext is the row of key $1 next in admission order (priority,
	// run_at, seq) among its ready, blocked, reserved and scheduled rows:
	// one probe of each, as sqlKeyWaiting says.
	sqlKeyNext = `
SELECT id::text, workflow, version, queue, priority, status, step, state, attempt,
       coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
       CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
       timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
       coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
       coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents
FROM (
    (SELECT * FROM {schema}.instances WHERE key = $1 AND status = 'ready' COLLATE "POSIX" ORDER BY priority, run_at, seq LIMIT 1)
    UNION ALL
    (SELECT * FROM {schema}.instances WHERE key = $1 AND status = 'blocked' COLLATE "POSIX" AND worker IS NULL
     ORDER BY priority, run_at, seq LIMIT 1)
    UNION ALL
    (SELECT * FROM {schema}.instances WHERE key = $1 AND status IN ('ready', 'blocked') AND status = 'blocked' COLLATE "POSIX"
       AND worker IS NOT NULL
     ORDER BY priority, run_at, seq LIMIT 1)
    UNION ALL
    (SELECT * FROM {schema}.instances WHERE key = $1 AND status = 'scheduled' ORDER BY priority, run_at, seq LIMIT 1)
) w ORDER BY priority, run_at, seq LIMIT 1`

	// sqlKeyOldest is the waiting or scheduled row of key $1 that has
	// waited longest (run_at, seq).
	sqlKeyOldest = `
SELECT id::text, workflow, version, queue, priority, status, step, state, attempt,
       coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
       CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
       timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
       coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
       coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents
FROM (
    (SELECT * FROM {schema}.instances WHERE key = $1 AND status IN ('ready', 'blocked') ORDER BY run_at, seq LIMIT 1)
    UNION ALL
    (SELECT * FROM {schema}.instances WHERE key = $1 AND status = 'scheduled' ORDER BY run_at, seq LIMIT 1)
) w ORDER BY run_at, seq LIMIT 1`

	// sqlKeySlots reads the counters of key $1, in shard order.
	sqlKeySlots = `SELECT shard, capacity, available FROM {schema}.key_slots WHERE key = $1 ORDER BY shard`

	// sqlKeyRate is the rate limit of a key's name and the bucket the key draws from.
	sqlKeyRate = `
SELECT r."limit", r.period_us, r.burst, r.per_key, b.credit, b.updated_at
FROM {schema}.rate_limits r
LEFT JOIN {schema}.rate_buckets b ON b.bucket = CASE WHEN r.per_key THEN $1 ELSE r.name END
WHERE r.name = split_part($1, ':', 1)`

	// sqlLimitOf is the limit key $1 runs under (the key-limit lookup; see
	// sql.go) and its name (the key's own or its name's).
	sqlLimitOf = `
SELECT l."limit", l.shards, l.name FROM (SELECT 1) one
CROSS JOIN LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk
                    WHERE lk.name IN ($1, split_part($1, ':', 1)) ORDER BY length(lk.name) DESC LIMIT 1) l`
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

	// sqlHealthSnapshot returns the oldest snapshot kept alive in this
	// database (see store.Health, OldestSnapshot): the sessions of the
	// database holding one (an xmin), but this one and autovacuum's (which
	// holds no row version back), the WAL senders (a standby's
	// hot_standby_feedback, for every database) and the replication slots,
	// the largest xmin age first. A session's age is read on the server's
	// clock. pg_stat_activity shows another role's xact_start, application
	// name and state only to a privileged role: NULL, and then empty,
	// otherwise.
	sqlHealthSnapshot = `
SELECT holder, xids, coalesce(open_us, 0) FROM (
    SELECT 'pid ' || pid || coalesce(' (' || coalesce(nullif(application_name, ''), '-') || ', ' || state || ')', '') AS holder,
           age(backend_xmin)::bigint AS xids,
           (extract(epoch FROM clock_timestamp() - xact_start) * 1000000)::bigint AS open_us
    FROM pg_stat_activity
    WHERE (datname = current_database() OR backend_type = 'walsender') AND backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
      AND backend_type IS DISTINCT FROM 'autovacuum worker'
    UNION ALL
    SELECT 'replication slot ' || slot_name, age(xmin)::bigint, NULL FROM pg_replication_slots WHERE xmin IS NOT NULL) s
ORDER BY xids DESC, open_us DESC NULLS LAST LIMIT 1`

	// sqlHealthPolicies lists the queue policies.
	sqlHealthPolicies = `SELECT queue, max_active, coalesce(max_active_per_key, 0) FROM {schema}.queue_policies`

	// sqlHealthSerial keeps Health off parallel workers: it is a monitoring
	// read that runs often and must not take cores from the claims.
	sqlHealthSerial = `SET LOCAL max_parallel_workers_per_gather = 0`

	// sqlHealthStatuses counts blocked, parked and executing rows per queue.
	sqlHealthStatuses = `
SELECT queue, status, count(*) FROM {schema}.instances
WHERE status IN ('blocked', 'awaiting', 'awaiting_children') GROUP BY queue, status
UNION ALL
SELECT queue, 'executing', count(*) FROM {schema}.instances WHERE status = 'executing' GROUP BY queue`

	// sqlHealthFailed counts, per queue with failed rows, at most $1 + 1 of
	// them (the caller caps the count at $1): failed rows stay for the
	// retention window, so an uncapped count would grow with it. The
	// queues are found by a loose index scan (one probe per queue) of
	// instances_queue_status, whose entries of other statuses are live
	// rows. Each queue's count reads the first $1 + 1 failed entries from
	// the queue on, in index order: a range read in the index's order,
	// which only the index serves without sorting, where an equality on
	// the queue would let the planner scan the table for a queue with few
	// failed rows.
	sqlHealthFailed = `
WITH RECURSIVE q AS (
    (SELECT queue FROM {schema}.instances WHERE status = 'failed' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT i.queue FROM {schema}.instances i
            WHERE i.status = 'failed' AND i.queue > q.queue ORDER BY i.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT q.queue, (SELECT count(*) FILTER (WHERE f.queue = q.queue)
                 FROM (SELECT i.queue FROM {schema}.instances i
                       WHERE i.status = 'failed' AND i.queue >= q.queue ORDER BY i.queue LIMIT $1 + 1) f)
FROM q WHERE q.queue IS NOT NULL`

	// sqlHealthBlockedByName counts blocked rows per key name (through the
	// waiting index: the name is computed from the key).
	sqlHealthBlockedByName = `
SELECT split_part(key, ':', 1), count(*) FROM {schema}.instances
WHERE key IS NOT NULL AND status IN ('ready', 'blocked') AND status = 'blocked'
GROUP BY 1`

	// sqlHealthGates aggregates, per limited name, the executing rows of its
	// keys (in any position: a row's other keys are its key_holds): how
	// many, the most on one key, and how many keys have no room: what a
	// claim could admit (see admission.go: the free slots of the
	// limit's shards, no more than the limit less the slots in use), or the
	// limit less the executing rows when the key has no counter yet.
	sqlHealthGates = `
WITH e AS (
    SELECT key, split_part(key, ':', 1) AS key_name, count(*) AS active FROM (
        SELECT key FROM {schema}.instances WHERE status = 'executing' AND key IS NOT NULL
        UNION ALL
        SELECT key FROM {schema}.key_holds) x
    GROUP BY key
),
r AS (
    SELECT e.key_name, e.active,
           CASE WHEN s.n = 0 THEN l."limit" - e.active ELSE least(s.free, l."limit" - s.used) END AS room
    FROM e
    CROSS JOIN LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk
                        WHERE lk.name IN (e.key, e.key_name) ORDER BY length(lk.name) DESC LIMIT 1) l
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
