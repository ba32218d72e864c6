package postgres

// Statements of the fleet's desired state: limits, policies, schedules (see limits.go, policies.go, schedules.go).
// The rules every statement follows (static text, arrays for batches, the
// clock as a parameter, the lock order) are written at the top of sql.go.

// Limits, rate limits and queue policies: desired state per namespace.
const (
	// sqlLimitsLock serializes the syncs of one part of the desired state
	// ($1: the schema's salt for limits, policies or schedules), for the
	// rest of the transaction, so that each reads what the one before it
	// committed.
	sqlLimitsLock = `SELECT pg_advisory_xact_lock($1::bigint)`

	// sqlLimitsAll reads every key limit, by name.
	sqlLimitsAll = `SELECT name, "limit", shards FROM {schema}.limits ORDER BY name`

	// sqlLimitsOfNames reads the limits of key names, no per-key limit,
	// by name (limits_of_names).
	sqlLimitsOfNames = `SELECT name, "limit", shards FROM {schema}.limits WHERE strpos(name, ':') = 0 ORDER BY name`

	// sqlLimitsFor reads the limits a set of keys runs under (see
	// gate.Limits.For): every key name's limit (limits_of_names), the
	// per-key limits of the keys after $1 up to and including $2 (NULL: no
	// end; the order of key_slots' keys, which is the primary key's), and
	// the limits named in $3 (keys outside the range, by primary key). A
	// per-key limit applies to the key it names only, so these are all
	// the limits of the range's keys and of $3's. The range with an end
	// and the one without are apart so that the first reads the primary
	// key on a generic plan too.
	sqlLimitsFor = `
SELECT name, "limit", shards FROM {schema}.limits WHERE strpos(name, ':') = 0
UNION
SELECT name, "limit", shards FROM {schema}.limits WHERE name > $1 AND name <= $2::text
UNION
SELECT name, "limit", shards FROM {schema}.limits WHERE $2::text IS NULL AND name > $1
UNION
SELECT name, "limit", shards FROM {schema}.limits WHERE name = ANY ($3::text[])`

	// sqlLimitsApply deletes the limits named $1 and stores the limits
	// $2..$5 (name, limit, shards, namespace), new or changed: the rows a
	// sync changes, not every stored limit (see writes).
	sqlLimitsApply = `
WITH d AS (DELETE FROM {schema}.limits WHERE name = ANY ($1::text[]))
INSERT INTO {schema}.limits (name, "limit", shards, namespace)
SELECT * FROM unnest($2::text[], $3::int[], $4::int[], $5::text[])
ON CONFLICT (name) DO UPDATE SET "limit" = excluded."limit", shards = excluded.shards, namespace = excluded.namespace`

	// sqlLimitsOwned reads every key limit with the namespace that owns it.
	sqlLimitsOwned = `SELECT name, "limit", shards, namespace FROM {schema}.limits ORDER BY name`

	// sqlLimitsOwnedOf reads, with their owners, the key limits named in $1
	// and, unless $3, every key limit namespace $2 owns: what a sync of $2
	// that wants or removes $1 (and, unless it keeps what it omits, drops
	// the rest of $2's) can change (see unchanged). No index has the
	// namespace: the server filters the table for $2's entries.
	sqlLimitsOwnedOf = `
SELECT name, "limit", shards, namespace FROM {schema}.limits WHERE name = ANY ($1::text[])
UNION
SELECT name, "limit", shards, namespace FROM {schema}.limits WHERE NOT $3::bool AND namespace = $2
ORDER BY name`

	// sqlLimitsOwnedFor is what a locked sync reads: sqlLimitsOwnedOf's
	// limits, every key name's limit (limits_of_names), and for each key
	// name among them the first per-key limit of that name, if any
	// (filtered on the server): a name's limit
	// can be removed only while no per-key limit of it remains, which one
	// of them tells as well as all (see syncKeyLimits). Where the
	// database's collation sorts as Go does, it is the one
	// gate.Limits.Validate names.
	sqlLimitsOwnedFor = `
WITH r AS (
    SELECT name, "limit", shards, namespace FROM {schema}.limits WHERE name = ANY ($1::text[])
    UNION
    SELECT name, "limit", shards, namespace FROM {schema}.limits WHERE NOT $3::bool AND namespace = $2
    UNION
    SELECT name, "limit", shards, namespace FROM {schema}.limits WHERE strpos(name, ':') = 0)
SELECT name, "limit", shards, namespace FROM r
UNION
SELECT p.name, p."limit", p.shards, p.namespace FROM r
CROSS JOIN LATERAL (SELECT l.name, l."limit", l.shards, l.namespace FROM {schema}.limits l
                    WHERE left(l.name, length(r.name) + 1) = r.name || ':' ORDER BY l.name LIMIT 1) p
WHERE strpos(r.name, ':') = 0
ORDER BY name`

	// sqlRatesOwnedOf is sqlLimitsOwnedOf for rate limits.
	sqlRatesOwnedOf = `
SELECT name, "limit", period_us, burst, per_key, namespace FROM {schema}.rate_limits WHERE name = ANY ($1::text[])
UNION
SELECT name, "limit", period_us, burst, per_key, namespace FROM {schema}.rate_limits WHERE NOT $3::bool AND namespace = $2
ORDER BY name`

	// sqlRatesAll reads every rate limit with the namespace that owns it.
	sqlRatesAll = `SELECT name, "limit", period_us, burst, per_key, namespace FROM {schema}.rate_limits ORDER BY name`

	// sqlRatesApply deletes the rate limits named $1 and stores the rate
	// limits $2..$7, new or changed (see sqlLimitsApply).
	sqlRatesApply = `
WITH d AS (DELETE FROM {schema}.rate_limits WHERE name = ANY ($1::text[]))
INSERT INTO {schema}.rate_limits (name, "limit", period_us, burst, per_key, namespace)
SELECT * FROM unnest($2::text[], $3::int[], $4::bigint[], $5::int[], $6::bool[], $7::text[])
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

	// sqlSlotKeysOfNames lists the keys with counters of the given names
	// that have no limit of their own, and the given keys that have
	// counters (per-key limits: a name never contains ':', so the two never
	// meet), in order, without a lock. A key with a limit of its own runs
	// under it, whatever its name's: a change of the name alone leaves its
	// counters as they are, and passing over them would only wait for
	// them (a saturated tenant's counters are held by its claims and step
	// ends nearly all the time).
	sqlSlotKeysOfNames = `
SELECT DISTINCT key FROM {schema}.key_slots s
WHERE (split_part(s.key, ':', 1) = ANY ($1::text[]) AND NOT EXISTS (SELECT 1 FROM {schema}.limits l WHERE l.name = s.key))
   OR s.key = ANY ($1::text[])
ORDER BY key`

	// sqlSlotsOfKeys locks the counters of the given keys, in order,
	// waiting for those another transaction holds.
	sqlSlotsOfKeys = `
SELECT key, shard, capacity, available FROM {schema}.key_slots
WHERE key = ANY ($1::text[]) ORDER BY key, shard FOR UPDATE`

	// sqlSlotsOfKeysFree locks the counters of the given keys that no
	// other transaction holds, skipping the others, without waiting. It
	// gives every key with the number of counters it has and each of its
	// counters it locked (none: a row of nulls): a key of which some
	// counters were skipped is not complete (see reshapeChunk).
	sqlSlotsOfKeysFree = `
WITH locked AS (
  SELECT key, shard, capacity, available FROM {schema}.key_slots
  WHERE key = ANY ($1::text[]) ORDER BY key, shard FOR UPDATE SKIP LOCKED
)
SELECT k.key, (SELECT count(*) FROM {schema}.key_slots a WHERE a.key = k.key) AS shards,
       l.shard, l.capacity, l.available
FROM unnest($1::text[]) AS k (key) LEFT JOIN locked l ON l.key = k.key`

	// sqlLiveByName counts the live rows of each key name of $1 under each
	// of their keys of that name, in any position, as the memory store
	// does, up to $2 (gate.LiveCountCap) a name: the key column from
	// instances_live_key_name_key_c (migration 030), then, only when those
	// fall short of $2, the other keys by their names from
	// instances_live_extra_keys (migration 031), whose predicates the
	// conditions repeat. A name's live rows may be millions, and a count of
	// them all reads every one, for seconds that the sync (and an engine's
	// Start) would wait. The other keys' index keeps the entries of row
	// versions that vacuum has not removed, and a bitmap read through it
	// visits their pages in page order, the old versions' first: a name
	// whose rows hold it mostly as another key, and churn, can still take
	// as long to count as its versions take to read.
	sqlLiveByName = `
SELECT x.n, CASE WHEN a.n >= $2 THEN $2
               ELSE least(a.n + (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances i CROSS JOIN LATERAL unnest(i.extra_keys) AS e(k)
                                                      WHERE {schema}.key_terms(i.extra_keys) && ARRAY[x.n] AND i.extra_keys IS NOT NULL
                                                        AND i.status COLLATE "C" NOT IN ('done', 'failed', 'canceled')
                                                        AND split_part(e.k, ':', 1) = x.n
                                                      LIMIT $2) b), $2) END
FROM unnest($1::text[]) AS x(n)
CROSS JOIN LATERAL (SELECT count(*) AS n FROM (SELECT 1 FROM {schema}.instances
                                               WHERE key_name = x.n AND key IS NOT NULL
                                                 AND status COLLATE "C" NOT IN ('done', 'failed', 'canceled')
                                               LIMIT $2) c) a`

	// sqlLiveByKey counts the live rows of each key of $1 (per-key limits),
	// whose names are $2, in any position, up to $3 (gate.LiveCountCap) a
	// key, as sqlLiveByName counts a name's: the key column's by the name
	// and the key (instances_live_key_name_key_c), then the other keys' by
	// the keys (instances_live_extra_keys), not among every live row of
	// their names.
	sqlLiveByKey = `
SELECT x.k, CASE WHEN a.n >= $3 THEN $3
                 ELSE least(a.n + (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances i CROSS JOIN LATERAL unnest(i.extra_keys) AS e(k)
                                                        WHERE {schema}.key_terms(i.extra_keys) && ARRAY[x.k] AND i.extra_keys IS NOT NULL
                                                          AND i.status COLLATE "C" NOT IN ('done', 'failed', 'canceled') AND e.k = x.k
                                                        LIMIT $3) b), $3) END
FROM unnest($1::text[], $2::text[]) AS x(k, nm)
CROSS JOIN LATERAL (SELECT count(*) AS n FROM (SELECT 1 FROM {schema}.instances
                                               WHERE key_name = x.nm AND key = x.k AND key IS NOT NULL
                                                 AND status COLLATE "C" NOT IN ('done', 'failed', 'canceled')
                                               LIMIT $3) c) a`

	// sqlPoliciesAll reads every queue policy with the namespace that owns
	// it (a policy without a per-key budget reads 0).
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

	// sqlBlockedKeysIn reads the first $3 distinct keys after $2 that have
	// blocked rows (not reservations), in key order, as sqlBlockedKeys
	// does (one entry of instances_key_blocked_posix per key), each with whether
	// its name has a limit and whether it has a blocked row in the queues
	// $1 (read among the key's blocked rows).
	sqlBlockedKeysIn = `
WITH RECURSIVE k AS (
    (SELECT key, 1 AS n FROM {schema}.instances
     WHERE key > $2 AND status = 'blocked' COLLATE "POSIX" AND worker IS NULL
     ORDER BY key LIMIT 1)
    UNION ALL
    SELECT (SELECT i.key FROM {schema}.instances i
            WHERE i.key > k.key AND i.status = 'blocked' COLLATE "POSIX" AND i.worker IS NULL
            ORDER BY i.key LIMIT 1), k.n + 1
    FROM k WHERE k.key IS NOT NULL AND k.n < $3
)
SELECT k.key, l."limit" IS NOT NULL,
       EXISTS (SELECT 1 FROM {schema}.instances b
               WHERE b.key = k.key AND b.status = 'blocked' COLLATE "POSIX" AND b.worker IS NULL AND b.queue = ANY ($1::text[]))
FROM k LEFT JOIN {schema}.limits l ON l.name = split_part(k.key, ':', 1)
WHERE k.key IS NOT NULL
ORDER BY k.n`

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

// Schedules: definitions per namespace, and the ticks they recorded.
const (
	// sqlSchedulesAll reads every schedule, by name, as the schedule columns
	// (the list scanSchedule scans, as in sqlScheduleLock, sqlSchedulePause
	// and sqlScheduleRecord).
	sqlSchedulesAll = `
SELECT name, namespace, workflow, cron, time_zone, queue, priority, coalesce(key, ''), key_intent,
       unique_statuses, overlap, catch_up, grace_us, paused, anchor, last_tick, coalesce(last_instance::text, ''),
       last_fired_at, epoch, coalesce(also_keys, '')
FROM {schema}.schedules ORDER BY name`

	// sqlScheduleLock locks schedule $1 and reads it (the schedule columns,
	// as in sqlSchedulesAll).
	sqlScheduleLock = `
SELECT name, namespace, workflow, cron, time_zone, queue, priority, coalesce(key, ''), key_intent,
       unique_statuses, overlap, catch_up, grace_us, paused, anchor, last_tick, coalesce(last_instance::text, ''),
       last_fired_at, epoch, coalesce(also_keys, '')
FROM {schema}.schedules WHERE name = $1 FOR UPDATE`

	// sqlSchedulesDeleteOmitted deletes the namespace's ($1) schedules not in $2.
	sqlSchedulesDeleteOmitted = `DELETE FROM {schema}.schedules WHERE namespace = $1 AND name <> ALL ($2::text[])`

	// sqlScheduleUpsert stores one definition: a new schedule is anchored
	// at @now; an existing one keeps its run-time state and moves its epoch.
	sqlScheduleUpsert = `
INSERT INTO {schema}.schedules (name, namespace, workflow, cron, time_zone, queue, priority, key, key_intent,
    unique_statuses, overlap, catch_up, grace_us, anchor, also_keys)
VALUES (@name, @namespace, @workflow, @cron, @time_zone, @queue, @priority, nullif(@key, ''), @key_intent,
    @unique_statuses::text[], @overlap, @catch_up, @grace_us, coalesce(@now::timestamptz, now()), nullif(@also_keys, ''))
ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow, cron = excluded.cron,
    time_zone = excluded.time_zone, queue = excluded.queue, priority = excluded.priority, key = excluded.key,
    key_intent = excluded.key_intent, also_keys = excluded.also_keys, unique_statuses = excluded.unique_statuses, overlap = excluded.overlap,
    catch_up = excluded.catch_up, grace_us = excluded.grace_us, epoch = schedules.epoch + 1, updated_at = now()`

	// sqlSchedulePause sets paused ($2); a change moves the epoch, and a
	// resume anchors the schedule at $3 (NULL: now). It returns the
	// schedule (the schedule columns, as in sqlSchedulesAll).
	sqlSchedulePause = `
UPDATE {schema}.schedules SET paused = $2, epoch = epoch + (paused <> $2)::int,
    anchor = CASE WHEN paused AND NOT $2 THEN coalesce($3::timestamptz, now()) ELSE anchor END,
    updated_at = now()
WHERE name = $1
RETURNING name, namespace, workflow, cron, time_zone, queue, priority, coalesce(key, ''), key_intent,
          unique_statuses, overlap, catch_up, grace_us, paused, anchor, last_tick, coalesce(last_instance::text, ''),
          last_fired_at, epoch, coalesce(also_keys, '')`

	// sqlScheduleRecord records a tick ($2) and, unless $3 is NULL, the
	// instance it started at $4 (NULL: now), and returns the schedule (the
	// schedule columns, as in sqlSchedulesAll).
	sqlScheduleRecord = `
UPDATE {schema}.schedules SET last_tick = $2, epoch = epoch + 1,
    last_instance = coalesce($3::uuid, last_instance),
    last_fired_at = CASE WHEN $3::uuid IS NULL THEN last_fired_at ELSE coalesce($4::timestamptz, now()) END,
    updated_at = now()
WHERE name = $1
RETURNING name, namespace, workflow, cron, time_zone, queue, priority, coalesce(key, ''), key_intent,
          unique_statuses, overlap, catch_up, grace_us, paused, anchor, last_tick, coalesce(last_instance::text, ''),
          last_fired_at, epoch, coalesce(also_keys, '')`

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
