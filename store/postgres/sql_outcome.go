package postgres

// Statements of outcomes, heartbeats, releases, cancels and signals (see outcomes.go and signals.go).
// The rules every statement follows (static text, arrays for batches, the
// clock as a parameter, the lock order) are written at the top of sql.go.

// Outcomes.
const (
	// sqlCompleteApply applies a batch of outcomes, each guarded by the
	// claim: worker, fence and status executing. A stale outcome matches no
	// row and changes nothing. Rows are locked in id order, FOR UPDATE so
	// that a signal being stored for the row (FOR KEY SHARE) and a park
	// serialize. It returns the key and shard each row held, for crediting,
	// and whether the row was marked as having waiters (see migration 013),
	// read under that lock, so after any transaction that marked it.
	// Outcome kinds travel by name (store.OutcomeKind.String); an unknown
	// name leaves the status NULL, which the NOT NULL constraint refuses.
	// An outcome that sets the row's keys sets its other keys too ($24, see
	// keysText), here rather than later in the transaction, so that a
	// hand-off read in the same transaction sees which rows have several
	// keys (a row of several keys is handed a slot only with a slot of
	// each of its keys). It returns the
	// holds of a row of several keys (key_holds, migration 025) with what
	// the row held, read in the same lookup; a row of one key reads none.
	// The claim's status is compared under "C" (see sql.go: the lookup by
	// id must not take instances_active). An outcome of a reserved row
	// whose predecessor's outcome is in the batch ($21: see outcomeChains)
	// is guarded by its reservation instead: blocked, with the worker and
	// fence, and only while the claim at the head of its chain in the batch
	// ($22, fence $23) is current (executing, with the worker and fence, as
	// this statement's snapshot shows it): a step that ran in a slot whose
	// claim was lost commits nothing. A row made ready and due takes the
	// fresh round (see sql.go) of its place among the batch's rows of its
	// key (key_rank). Lock order (1): the outcome rows, in id order.
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
    extra_keys = CASE WHEN o.set_key THEN (SELECT array_agg(split_part(e, E'\x1e', 1) ORDER BY n) FROM unnest(string_to_array(nullif(o.extras, ''), E'\x1f')) WITH ORDINALITY AS u(e, n))
                      ELSE i.extra_keys END,
    extra_intents = CASE WHEN o.set_key THEN (SELECT array_agg(split_part(e, E'\x1e', 2) ORDER BY n) FROM unnest(string_to_array(nullif(o.extras, ''), E'\x1f')) WITH ORDINALITY AS u(e, n))
                         ELSE i.extra_intents END,
    await_signal = CASE WHEN o.kind = 'await' THEN nullif(o.await_signal, '') END,
    timeout_at = CASE WHEN o.kind = 'await' THEN o.timeout_at END,
    timed_out = false,
    worker = NULL,
    lease_expires_at = NULL,
    result = CASE WHEN o.kind = 'done' THEN o.result::jsonb ELSE i.result END,
    last_error = CASE WHEN o.error <> '' THEN o.error ELSE i.last_error END,
    pending_children = CASE WHEN o.kind = 'spawn' THEN o.children ELSE 0 END,
    round = CASE WHEN o.kind = 'ready' AND o.run_at <= t.now
                 THEN (SELECT CASE WHEN fk.last >= fh.head THEN greatest(fk.last, fk.last - (fk.last & 1) + 2 * ((fk.taken + fr.n) / fk.turns))
                                   ELSE greatest(fh.head, fh.head - (fh.head & 1) + 2 * (fr.n / fk.turns)) END
                       FROM (SELECT i.queue AS q, i.priority AS p, CASE WHEN o.set_key THEN nullif(o.key, '') ELSE i.key END AS k, o.key_rank AS n) fr
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
                                                                  ORDER BY length(lk.name) DESC LIMIT 1), 1) AS turns OFFSET 0) x) fk)
            END,
    spawn_gen = CASE WHEN o.kind = 'spawn' THEN i.spawn_gen + 1 ELSE i.spawn_gen END,
    -- A hand-back keeps when the row first became ready (its run_at when
    -- claimed, before this outcome moves it); any other outcome ends it.
    ready_since = CASE WHEN o.kind = 'ready' AND o.hand_back THEN coalesce(i.ready_since, i.run_at) END,
    updated_at = t.now
FROM (SELECT x.id, x.fence, x.step, x.state, x.attempt, x.set_key, x.key, x.key_intent, x.extras,
             x.await_signal, x.result, x.error, x.children, x.hand_back, x.ord,
             -- Run and timeout times relative to the store's clock when the
             -- outcome gives a delay rather than a time (one clock for all).
             coalesce(x.run_at, t.now + x.delay_us * interval '1 microsecond') AS run_at,
             coalesce(x.timeout_at, CASE WHEN x.timeout_us > 0 THEN t.now + x.timeout_us * interval '1 microsecond' END) AS timeout_at,
             -- A row canceled while its step ran ends canceled unless the
             -- step finished it (done, failed).
             CASE WHEN c.cancel_requested AND x.kind IN ('ready', 'await', 'spawn') THEN 'canceled' ELSE x.kind END AS kind,
             c.key AS old_key, c.key_shard AS old_shard, c.waiters AS old_waiters,
             -- The holds of a row of several keys (key U+001F shard, joined
             -- by U+001E; -1: K = 1): read only for such a row.
             CASE WHEN c.extra_keys IS NOT NULL
                  THEN (SELECT string_agg(h.key || E'\x1f' || coalesce(h.shard, -1)::text, E'\x1e' ORDER BY h.key)
                        FROM {schema}.key_holds h WHERE h.instance_id = x.id AND h.fence = x.fence) END AS old_holds,
             -- A key's rows made ready and due together take their turns
             -- from its fresh round, in run_at then seq order
             -- (internal/admission.Rounds): this is each one's place.
             CASE WHEN x.kind = 'ready' AND NOT c.cancel_requested
                   AND coalesce(x.run_at, t.now + x.delay_us * interval '1 microsecond') <= t.now
                   AND CASE WHEN x.set_key THEN nullif(x.key, '') ELSE c.key END IS NOT NULL
                  THEN row_number() OVER (
                      PARTITION BY x.kind = 'ready' AND NOT c.cancel_requested
                                   AND coalesce(x.run_at, t.now + x.delay_us * interval '1 microsecond') <= t.now,
                                   CASE WHEN x.set_key THEN nullif(x.key, '') ELSE c.key END, c.queue, c.priority
                      ORDER BY coalesce(x.run_at, t.now + x.delay_us * interval '1 microsecond'), c.seq) - 1
                  ELSE 0 END AS key_rank
      FROM (SELECT * FROM unnest($3::uuid[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::int[],
                  $9::timestamptz[], $10::bool[], $11::text[], $12::text[], $13::text[],
                  $14::timestamptz[], $15::text[], $16::text[], $17::int[], $18::bigint[], $19::bigint[],
                  $20::bool[], $21::bool[], $22::uuid[], $23::bigint[], $24::text[])
                WITH ORDINALITY AS x(id, fence, kind, step, state, attempt, run_at, set_key, key,
                                     key_intent, await_signal, timeout_at, result, error, children,
                                     delay_us, timeout_us, hand_back, chained, head, head_fence, extras, ord)
            ORDER BY x.id) x
      CROSS JOIN t
      CROSS JOIN LATERAL (
          SELECT c.key, c.key_shard, c.cancel_requested, c.waiters, c.queue, c.priority, c.seq, c.extra_keys
          FROM {schema}.instances c
          WHERE c.id = x.id AND c.worker = $1 AND c.fence = x.fence
            AND c.status COLLATE "C" = CASE WHEN x.chained THEN 'blocked' ELSE 'executing' END
            AND (NOT x.chained OR EXISTS (SELECT 1 FROM {schema}.instances h
                                          WHERE h.id = x.head AND h.worker = $1 AND h.fence = x.head_fence
                                            AND h.status COLLATE "C" = 'executing'))
          FOR UPDATE) c) o, t
WHERE i.id = o.id
RETURNING o.ord, coalesce(o.old_key, ''), coalesce(o.old_shard, -1), i.status,
          coalesce(i.parent_id::text, ''), i.join_gen, i.spawn_gen, i.queue, o.old_waiters, coalesce(o.old_holds, '')`

	// sqlClaimsLock locks worker $2's rows among $1 (a batch's outcome rows
	// and the successors they name) in id order, in one statement, before
	// the outcomes apply: sqlCompleteApply and sqlSuccessorsLock lock them
	// again (held already), each in id order but the two sets one after
	// the other, which is not the global order a heartbeat (sqlHeartbeat)
	// takes them in when a successor's id is smaller than its
	// predecessor's. Rows of other workers are not locked: their outcomes
	// are stale and touch nothing.
	sqlClaimsLock = `
SELECT 1 FROM {schema}.instances WHERE id = ANY ($1::uuid[]) AND worker = $2 ORDER BY id FOR UPDATE`

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
	// last child finished, at its fresh round (see sql.go). A child of an
	// earlier spawn does not count. The parents are locked already
	// (sqlLockParents, lock order (4)). It returns the queues of the parents
	// it woke, and notifies them on channel $4 unless $4 is empty: an
	// outcome, a release and a reap leave it empty and notify the queues
	// once they have committed (wakeAfterCommit), since a NOTIFY holds
	// PostgreSQL's notification lock from its transaction's pre-commit to
	// the end of its commit (see wakeSender); a cancel, which may run in
	// its caller's transaction, notifies in the statement.
	sqlJoinParents = `
WITH t AS (SELECT coalesce($3::timestamptz, now()) AS now),
w AS (
    UPDATE {schema}.instances p
    SET pending_children = greatest(0, p.pending_children - d.n),
        status = CASE WHEN p.pending_children - d.n <= 0 THEN 'ready' ELSE p.status END,
        run_at = CASE WHEN p.pending_children - d.n <= 0 THEN t.now ELSE p.run_at END,
        round = CASE WHEN p.pending_children - d.n <= 0
                     THEN (SELECT CASE WHEN fk.last >= fh.head THEN greatest(fk.last, fk.last - (fk.last & 1) + 2 * ((fk.taken + fr.n) / fk.turns))
                                       ELSE greatest(fh.head, fh.head - (fh.head & 1) + 2 * (fr.n / fk.turns)) END
                           FROM (SELECT p.queue AS q, p.priority AS p, p.key AS k, 0 AS n) fr
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
                                                                      ORDER BY length(lk.name) DESC LIMIT 1), 1) AS turns OFFSET 0) x) fk) END,
        updated_at = t.now
    FROM unnest($1::uuid[], $2::int[], $5::int[]) AS d(id, n, gen), t
    WHERE p.id = d.id AND p.status = 'awaiting_children' AND p.spawn_gen = d.gen
    RETURNING p.queue, p.status
)
SELECT q.queue, q.n FROM (SELECT queue, count(*) AS n FROM w WHERE status = 'ready' GROUP BY queue) q
LEFT JOIN LATERAL (SELECT pg_notify($4, q.queue) WHERE $4 <> '') x ON true`

	// sqlSetPending corrects a spawn's join counter when some children were
	// duplicates (not inserted), waking the parent when none was, at its
	// fresh round (see sql.go). It returns and notifies the queues of the
	// parents it woke as sqlJoinParents does ($4).
	sqlSetPending = `
WITH t AS (SELECT coalesce($3::timestamptz, now()) AS now),
w AS (
    UPDATE {schema}.instances p
    SET pending_children = d.n,
        status = CASE WHEN d.n <= 0 THEN 'ready' ELSE p.status END,
        run_at = CASE WHEN d.n <= 0 THEN t.now ELSE p.run_at END,
        round = CASE WHEN d.n <= 0
                     THEN (SELECT CASE WHEN fk.last >= fh.head THEN greatest(fk.last, fk.last - (fk.last & 1) + 2 * ((fk.taken + fr.n) / fk.turns))
                                       ELSE greatest(fh.head, fh.head - (fh.head & 1) + 2 * (fr.n / fk.turns)) END
                           FROM (SELECT p.queue AS q, p.priority AS p, p.key AS k, 0 AS n) fr
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
                                                                      ORDER BY length(lk.name) DESC LIMIT 1), 1) AS turns OFFSET 0) x) fk) END
    FROM unnest($1::uuid[], $2::int[]) AS d(id, n), t
    WHERE p.id = d.id AND p.status = 'awaiting_children'
    RETURNING p.queue, p.status
)
SELECT q.queue, q.n FROM (SELECT queue, count(*) AS n FROM w WHERE status = 'ready' GROUP BY queue) q
LEFT JOIN LATERAL (SELECT pg_notify($4, q.queue) WHERE $4 <> '') x ON true`

	// sqlRecheckInbox wakes rows that just parked on a signal already in
	// their inbox (the signal committed between the claim and the park),
	// each at its fresh round (see sql.go), and returns their queues, which
	// the outcome notifies once it has committed.
	sqlRecheckInbox = `
WITH w AS (
    UPDATE {schema}.instances i
    SET status = 'ready', run_at = coalesce($2::timestamptz, now()), timeout_at = NULL,
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
    WHERE i.id = ANY ($1::uuid[]) AND i.status = 'awaiting'
      AND EXISTS (SELECT 1 FROM {schema}.signals s
                  WHERE s.instance_id = i.id AND s.name = i.await_signal AND s.consumed_at IS NULL)
    RETURNING i.queue
)
SELECT q.queue, q.n FROM (SELECT queue, count(*) AS n FROM w GROUP BY queue) q`

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

	// sqlHeartbeat extends the leases of claims (and reservations: a
	// blocked row with the worker and fence) the worker still holds,
	// locking the rows in id order like every other multi-row transition (a
	// plain join locked them in plan order and deadlocked with Complete):
	// the batch, sorted by id, probes and locks each row in turn, as
	// sqlCompleteApply does. A join of the batch with the sort and the
	// lock above it lets the planner read the rows by id = ANY and compare
	// each with every entry of the batch in a nested loop's filter:
	// quadratic in the claims a worker holds (about 190 ms for 1,000
	// claims, every claim's row locked throughout;
	// TestHotPathPlansUseIndexes).
	sqlHeartbeat = `
UPDATE {schema}.instances i
SET lease_expires_at = coalesce($4::timestamptz, now()) + $5::bigint * interval '1 microsecond'
FROM (SELECT c.id
      FROM (SELECT * FROM unnest($2::uuid[], $3::bigint[]) AS x(id, fence) ORDER BY x.id) x
      CROSS JOIN LATERAL (
          SELECT c.id FROM {schema}.instances c
          WHERE c.id = x.id AND c.worker = $1 AND c.fence = x.fence AND c.status COLLATE "C" IN ('executing', 'blocked')
          FOR UPDATE) c) o
WHERE i.id = o.id
RETURNING i.id::text, i.cancel_requested`

	// sqlCheckClaims returns, of the claims and reservations ($2, $3: ids
	// and fences) worker $1 still holds, the id and whether a cancel was
	// requested: sqlHeartbeat's answer without its update, and without a
	// row lock, so that it never waits for a flush holding the rows. The
	// LIMIT keeps the per-id probe from being flattened into a join, which
	// a small table's statistics plan as a sequential scan.
	sqlCheckClaims = `
SELECT c.id::text, c.cancel_requested
FROM unnest($2::uuid[], $3::bigint[]) AS x(id, fence)
CROSS JOIN LATERAL (
    SELECT c.id, c.cancel_requested FROM {schema}.instances c
    WHERE c.id = x.id AND c.worker = $1 AND c.fence = x.fence AND c.status COLLATE "C" IN ('executing', 'blocked')
    LIMIT 1) c`

	// sqlRelease returns unstarted claims and reservations to ready,
	// keeping their place (run_at, round) and attempt; one whose cancel was
	// requested ends canceled. It returns the key and shard each claim
	// held (none for a reservation), and what a canceled child needs for
	// its parent's join. It locks the rows as sqlHeartbeat does.
	sqlRelease = `
UPDATE {schema}.instances i
SET status = CASE WHEN i.cancel_requested THEN 'canceled' ELSE 'ready' END, worker = NULL, lease_expires_at = NULL, key_shard = NULL, started_at = NULL,
    updated_at = coalesce($4::timestamptz, now())
FROM (SELECT c.id, CASE WHEN c.status = 'executing' THEN c.key END AS old_key, c.key_shard AS old_shard
      FROM (SELECT * FROM unnest($2::uuid[], $3::bigint[]) AS x(id, fence) ORDER BY x.id) x
      CROSS JOIN LATERAL (
          SELECT c.id, c.status, c.key, c.key_shard FROM {schema}.instances c
          WHERE c.id = x.id AND c.worker = $1 AND c.fence = x.fence AND c.status COLLATE "C" IN ('executing', 'blocked')
          FOR UPDATE) c) o
WHERE i.id = o.id
RETURNING coalesce(o.old_key, ''), coalesce(o.old_shard, -1), i.queue,
          i.status, coalesce(i.parent_id::text, ''), i.join_gen`

	// sqlCancelLock locks instance $1 and returns what Cancel must know of
	// it as it is now: its status ('reserved' for a blocked row with a
	// worker), key, shard, parent and join generation, and whether its
	// cancel is already requested. Cancel then decides on these values,
	// which the lock keeps current until it commits.
	sqlCancelLock = `
SELECT CASE WHEN status = 'blocked' AND worker IS NOT NULL THEN 'reserved' ELSE status END,
       coalesce(key, ''), coalesce(key_shard, -1), coalesce(parent_id::text, ''), join_gen, cancel_requested
FROM {schema}.instances WHERE id = $1 FOR UPDATE`

	// sqlCancel cancels instance $1, locked by sqlCancelLock and found
	// neither terminal nor with its cancel requested. An executing row keeps
	// its claim and slot, and a reserved one its reservation (its step may
	// run in its predecessor's slot: see store.Claimed.After): it is only
	// marked, and its worker told on the cancel channel; its claim's end
	// makes it canceled (see store.Store). Every value it writes is computed
	// from the row itself, so that it can never write a status the row's
	// other columns do not allow.
	sqlCancel = `
UPDATE {schema}.instances
SET status = CASE WHEN status = 'executing' OR (status = 'blocked' AND worker IS NOT NULL) THEN status ELSE 'canceled' END,
    cancel_requested = status = 'executing' OR (status = 'blocked' AND worker IS NOT NULL),
    updated_at = coalesce($2::timestamptz, now())
WHERE id = $1 AND status NOT IN ('done', 'failed', 'canceled') AND NOT cancel_requested`

	// sqlNotifyCancel tells the workers that the cancel of executing
	// instance $2 was requested, on the schema's cancel channel $1.
	sqlNotifyCancel = `SELECT pg_notify($1, $2::text)`

	// sqlStatusOf reads an instance's status (to explain why a change did nothing).
	sqlStatusOf = `SELECT status FROM {schema}.instances WHERE id = $1`

	// sqlRetry makes a failed or canceled instance ready at its current step.
	// A child whose parent still joins its spawn counts in the join again.
	// The instance takes its fresh round (see sql.go).
	sqlRetry = `
WITH w AS (
    UPDATE {schema}.instances
    SET status = 'ready', attempt = 0, run_at = coalesce($2::timestamptz, now()), worker = NULL, cancel_requested = false,
        ready_since = NULL,
        lease_expires_at = NULL, key_shard = NULL, timed_out = false, timeout_at = NULL,
        await_signal = NULL, result = NULL,
        round = (SELECT CASE WHEN fk.last >= fh.head THEN greatest(fk.last, fk.last - (fk.last & 1) + 2 * ((fk.taken + fr.n) / fk.turns))
                             ELSE greatest(fh.head, fh.head - (fh.head & 1) + 2 * (fr.n / fk.turns)) END
                 FROM (SELECT queue AS q, priority AS p, key AS k, 0 AS n) fr
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
	// The instance takes its fresh round (see sql.go).
	sqlSignalWake = `
WITH w AS (
    UPDATE {schema}.instances i
    SET status = 'ready', run_at = coalesce($2::timestamptz, now()), timeout_at = NULL, timed_out = false,
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
    WHERE i.id = $1 AND i.status = 'awaiting'
      AND EXISTS (SELECT 1 FROM {schema}.signals s
                  WHERE s.instance_id = i.id AND s.name = i.await_signal AND s.consumed_at IS NULL)
    RETURNING i.queue
)
SELECT queue, count(*) AS n FROM w GROUP BY queue`
)
