package postgres

//go:generate go run ../../internal/pgstatements/gen

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
// (key, shard) (claims try them, except an optimistic claim, which holds
// no counter and no rate bucket when it waits for them in its last
// statement, for optimisticLockWait at most: see optimistic); (4) other
// instance rows: K = 1 holders being marked as having waiters (SKIP
// LOCKED, see sqlFlagHolders), blocked rows being promoted (SKIP LOCKED,
// see sqlPromote; PostgreSQL still waits for a row whose newer version a
// transaction in progress writes, which is why an optimistic claim's wait
// is bounded) and parents, by id. Rate buckets come after counters
// (claims, limit changes).
//
// The statements live in files by concern: sql_insert.go, sql_claim.go,
// sql_slots.go (freeing slots), sql_outcome.go (outcomes, heartbeats,
// cancels, signals), sql_maintenance.go (timers, reaper, reconciler,
// leases), sql_config.go (limits, policies, schedules), sql_read.go
// (reads and health) and sql_queues.go (which queues engines work).
//
// What the hot statements rely on from the planner, and why they are
// written as they are:
//   - The claim, outcome and freeing transactions run with
//     `SET LOCAL enable_seqscan = off` (batchtx.go). They join a batch
//     (unnest of arrays) to instances by id; on a table whose statuses
//     churn by the thousand per second the statistics can make a
//     sequential scan look cheaper than one index probe per batch row,
//     which is then thousands of times slower. Every statement of those
//     transactions has an index path; TestHotPathPlansUseIndexes checks it.
//   - Conditions on status (and on key IS [NOT] NULL) in the reads of the
//     claim and of freeing slots repeat the predicates of the partial
//     indexes those reads are meant to use (instances_pick_*,
//     instances_key_ready_posix, instances_key_blocked_posix,
//     instances_key_one_posix, instances_key_gate_posix, instances_lease):
//     PostgreSQL uses a partial index only when the query implies its
//     predicate, so they are not redundant even where the rest of the
//     condition already pins the rows.
//   - A status condition's collation names the family of indexes a read
//     may use, as their predicates are written the same way: COLLATE "C"
//     the version pick indexes (the claim's start rows and the hand-off's
//     turn probes; in a lookup by id, no partial index at all: see below),
//     COLLATE "POSIX" one key's ready, blocked and executing rows
//     (instances_key_ready_posix, instances_key_blocked_posix,
//     instances_key_one_posix, instances_key_gate_posix), and the plain
//     comparison the rest. The comparison is the same; the planner proves
//     a predicate only with the collation it is written in. On a table
//     whose statistics predate its keyed rows every partial index of ready,
//     blocked or executing rows is estimated at one row, and a probe of one
//     key that could prove a queue-wide index's predicate read that one,
//     filtering on the key (TestKeyProbesHoldOnStaleStatistics).
//   - The outcome batch (sqlCompleteApply) drives a LATERAL primary-key
//     lookup per batch row, locking in id order; with an extra
//     `id = ANY ($ids)` conjunct the planner re-ran the array for every row
//     of a nested loop (commit 0ce969f: 136 → 27 µs of PostgreSQL time per
//     row). The reservations (sqlReserve, sqlClaimReserve) take the same
//     form for the same reason. Other batch updates by id (the claim, the
//     hand-off) carry `id = ANY ($ids)` beside their join to the batch:
//     joined to it alone, on a table without statistics (every fresh
//     schema until its first ANALYZE) the claim hashed every ready row of
//     the primary key. TestHotPathPlansUseIndexes explains these
//     statements on an analyzed table and on a never-analyzed one, and
//     fails on a batch joined through a nested loop's filter.
//   - The reverse holds where a batch looks claims up by id (outcomes,
//     heartbeats, releases): there the status check is written
//     `status = 'executing' COLLATE "C"` (the same equality), so that no
//     plan can prove instances_active's predicate and read that partial
//     index of every executing row, filtering on id, once per batch row.
//     Plans took it whenever the statistics made it look small (a freshly
//     analyzed table with nothing executing; generic plans), and it grows
//     with the fleet's concurrency. TestHotPathPlansUseIndexes fails on any
//     index scan of instances without an index condition in these
//     statements.

// Migrator bookkeeping.
const (
	// sqlMigrationLock takes the schema's migration lock ($1: its salt), a
	// session lock held for the whole run (a no-transaction migration
	// commits part way; see migrateLocked), waiting for another migrator.
	sqlMigrationLock = `SELECT pg_advisory_lock($1::bigint)`
	// sqlMigrationUnlock releases the lock sqlMigrationLock took.
	sqlMigrationUnlock = `SELECT pg_advisory_unlock($1::bigint)`

	// sqlMigrationsTableExists says whether schema $1 has its migration
	// table, without creating anything.
	sqlMigrationsTableExists = `SELECT to_regclass(format('%I.schema_migrations', $1::text)) IS NOT NULL`

	// sqlMigrationsInit creates the schema and its migration table when
	// they are missing.
	sqlMigrationsInit = `
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version    int         PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

	// sqlMigrationsApplied lists the versions applied, in order.
	sqlMigrationsApplied = `SELECT version FROM {schema}.schema_migrations ORDER BY version`

	// sqlMigrationRecord records version $1 (named $2) as applied.
	sqlMigrationRecord = `INSERT INTO {schema}.schema_migrations (version, name) VALUES ($1, $2)`

	// sqlMigrationForget removes version $1 from the applied ones (its down
	// migration ran).
	sqlMigrationForget = `DELETE FROM {schema}.schema_migrations WHERE version = $1`
)

// Rules that several statements apply. Every statement is one literal,
// so a rule is written out in each statement that applies it; the
// statement's comment names the rule, and this list says what the rule is
// and which statements carry it, so that a change to one reaches them all.
//
//   - The key-limit lookup (gate.Limits.For's SQL form): the limit a key
//     runs under is its own (a per-key limit, named by the full key) if it
//     has one, else its name's, else none (K = 1). Written
//     LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk
//     WHERE lk.name IN (<key>, <its name>) ORDER BY length(lk.name) DESC
//     LIMIT 1) l, and read as l.name, l."limit" and l.shards: two
//     primary-key probes of limits, of which the key's own entry is the
//     longer name (a key is its name, ':' and a non-empty id). A key has a
//     limit of its own only while its name has one (gate.Limits.Validate),
//     so whether a key is a gate still depends on its name alone, and the
//     statements that ask only that join limits on the name. In
//     sqlClaimCandidates, sqlKeyLimits, sqlSlotsRead, sqlCredit,
//     sqlHandOffGates, sqlPromoteIfRoom, sqlLimitOf and sqlHealthGates;
//     TestKeyLimitMatchesGate pins it to gate.Limits.For.
//   - The K = 1 holder probe: the executing row admitted under K = 1 that
//     holds key k, read as e.key = k AND e.status = 'executing' COLLATE
//     "POSIX" AND e.key IS NOT NULL AND e.key_shard IS NULL,
//     instances_key_one_posix's predicate,
//     one index entry (a row a gate admitted, key_shard set, is not the
//     key's K = 1 holder: its end frees without the key's advisory lock).
//     It is the core of the next four rules and of the stranded check's
//     unmarked-holder test.
//   - The K = 1 busy check: ((SELECT true FROM <the holder probe> LIMIT 1)
//     IS NOT NULL OR (SELECT true FROM {schema}.key_holds kh WHERE kh.key
//     = k LIMIT 1) IS NOT NULL), scalar subqueries with LIMIT so that the
//     planner can neither turn them into hashed subplans that read every
//     executing row nor walk the key's waiting rows on another index. The
//     second reads the holds of rows of several keys that hold k as one of
//     their other keys (migration 025: one probe of key_holds_key, a table
//     that is empty while no such row executes); any hold of k there counts,
//     as a gate hold of a key whose limit was removed counts in the
//     executing check. In sqlInsert and
//     sqlInsertRounds (whether an insert blocks the key's rows), and in
//     sqlClaimCandidates (a hint, read before any lock, of which keys not
//     to lock).
//   - The executing check: the busy check, or any executing row of key k
//     a gate admitted (key_shard IS NOT NULL; its limit may have been
//     removed since, making the key K = 1), each a scalar subquery with
//     LIMIT (written as EXISTS, PostgreSQL turned them into hashed
//     subplans that read every executing row of the table). A claim or a
//     hand-off that would make a row of the key executing under K = 1
//     reads it after taking the key's lock (sqlKeyBusy, sqlHandOffBusy) or
//     in its update (sqlClaim, and sqlHandOff with the key read as i.key).
//   - The marked-holder mark: CROSS JOIN LATERAL (SELECT e.id FROM <the
//     holder probe> AND NOT e.waiters LIMIT 1 FOR NO KEY UPDATE SKIP
//     LOCKED) h, after a FROM naming keys k: the unmarked holder of each,
//     locked, skipping one another transaction holds (migration 013). In
//     sqlFlagHolders and sqlPromoteIfRoom.
//   - The waited-on check: (NOT (k = ANY (one)) OR (SELECT true FROM <the
//     holder probe> AND e.waiters LIMIT 1) IS NOT NULL OR (SELECT true FROM
//     {schema}.key_holds kh WHERE kh.key = k LIMIT 1) IS NOT NULL): a row of
//     key k may be blocked when k is not one of the K = 1 keys one, or its
//     holder is marked as having waiters (sqlFlagHolders), or it is held
//     by a row of several keys, whose end frees each of its keys the full
//     way, so that the holder's end promotes the row. In sqlBlock,
//     sqlBlockBacklog and sqlBlockMulti.
//   - The ready count: how many ready rows key k has, up to
//     admission.ReadyCap (a parameter), read as (SELECT count(*) FROM
//     (SELECT 1 FROM instances r WHERE r.key = k AND r.status = 'ready' COLLATE "POSIX"
//     ORDER BY r.priority, r.run_at, r.seq LIMIT $cap) r): at most that
//     many entries of instances_key_ready_posix. With the K = 1 key test (NOT
//     EXISTS (SELECT 1 FROM limits l WHERE l.name = split_part(k, ':',
//     1)): rows of a gate key go in ready, and the claim that finds the
//     gate full blocks them), in sqlInsert and sqlInsertRounds.
//   - The stranded check, on f(key, one) (sqlStranded, sqlPromote): the
//     key has a blocked row and room its ready rows will not take (a K = 1
//     key: no ready row, no executing row and no hold in key_holds; a gate key: more free slots
//     on its counters than ready rows, or no counters and no ready row).
//     Its blocked rows were skipped (locked by someone), and nothing else
//     would promote them before the reconciler's sweep: claims take ready
//     rows, and a hand-off passes one slot, never the spare ones. A gate
//     whose slots are all taken is saturated, not stranded. A K = 1
//     key whose holder is not marked as having waiters (the holder probe
//     with NOT e.waiters; see migration 013: a heal could not mark it, its
//     outcome holding it locked) counts as stranded too: that outcome
//     frees the key without promoting, and the heal's next attempt finds
//     the key free. The probes for a waiting row of the key read
//     instances_key_blocked_posix and instances_key_ready_posix, one row each: their
//     conditions are those indexes' predicates. Without fresh statistics,
//     PostgreSQL chose instances_key_round for the forms that put the key
//     first and the status in a filter, and walked every waiting row of a
//     hot key, about 19,000 rows per probe in make bench's scenario 4. The
//     first probe is false, not null, when the key has no blocked row (most
//     freed keys), so that the others are not evaluated.
//   - The blocked check: ((SELECT true FROM instances b WHERE b.key = k AND
//     b.status = 'blocked' COLLATE "POSIX" AND b.worker IS NULL LIMIT 1)
//     IS NOT NULL): key
//     k has a blocked row waiting for a promotion (not a reservation), read
//     as the busy check reads its holder. In sqlClaim and sqlHandOff (a row
//     that takes a K = 1 key with blocked rows is marked as having
//     waiters) and sqlPromoteIfRoom.
//   - The fresh round of the fr.n-th (from 0) of the rows of key fr.k
//     (NULL: none) made ready together in queue fr.q at priority fr.p:
//     admission.KeyFresh's, in SQL. CASE WHEN fk.last >= fh.head THEN
//     <turn round fk.last, (fk.taken + fr.n) / fk.turns> ELSE <turn round
//     fh.head, fr.n / fk.turns> END, where <turn round r, k> is
//     admission.TurnRound(r, k): greatest(r, r - (r & 1) + 2 * k). It is read over
//     fh, the queue's open round (admission.Open of the queue head, the
//     lowest round among the queue's ready rows of that priority, keyless
//     and keyed: one entry of each pick index, 0 when none: (<head> - 1) |
//     1), and fk, the key's last round: CROSS JOIN LATERAL
//     (SELECT x.last, x.turns, <taken> ...) fk, where last is the key's
//     highest round among its ready and blocked rows there (one entry of
//     instances_key_round), turns the key's limit from the key-limit
//     lookup's two probes (1 without one), and taken how many of its rows
//     have round last, counted up to turns and only for a gate (a K = 1
//     key's is 1: its rows go to the turn round after last). x is read
//     with OFFSET 0 so that PostgreSQL keeps it one subquery rather than
//     copy the probe of last into each reference. A keyless row's probes
//     find nothing without reading a page (a NULL key), so it takes the
//     open round. A statement reads it in its own snapshot as (SELECT CASE ...
//     FROM (SELECT q AS q, p AS p, k AS k, n AS n) fr CROSS JOIN LATERAL
//     (<the queue's open round>) fh <the key's last round>), so that the
//     probes run inline: in sqlFireQueueTimers, sqlFireTimers,
//     sqlCompleteApply (n: the row's place among its key's rows of the
//     batch), sqlJoinParents, sqlSetPending, sqlRecheckInbox, sqlRetry and
//     sqlSignalWake (n = 0). A statement that gives rounds to many keys of
//     few queues reads the queue's open round once per queue and priority,
//     and the key's last round per key, and gives a key's n-th row the turn
//     round base, (taken + n) / turns (the batch's fresh round):
//     sqlInsert and sqlPromoteScheduled;
//     sqlInsertRounds returns the parts for admission.KeyFresh. A SQL
//     function cannot stand in for the inline form: PostgreSQL cannot
//     inline a function whose body has subqueries, and a call cost 35-54
//     µs (2,000 calls for one queue in psql: 69-108 ms, against 1.7 ms for
//     the same probes inline with the queue's head read once), on every
//     outcome that makes a row ready for its next step and every key group
//     of an insert. TestFreshRoundInlineMatchesTheRule pins the inline
//     form to admission.KeyFresh.
//   - The move to executing (sqlClaim, sqlHandOff): the SET of the
//     caller's UPDATE of instances i, given t.now, a.shard and a.ord: a new
//     fence, a lease of $3 µs, the shard (-1: K = 1, stored NULL), and
//     waiters set when the row takes a K = 1 key that has blocked rows
//     (the blocked check; see migration 013): the claim or hand-off holds
//     the key's advisory lock, so no claim blocks more of them meanwhile,
//     and a row an insert blocks later is flagged by its heal. The
//     reservation's SET (sqlClaimReserve, sqlReserve) makes the row
//     blocked for worker $2 with a new fence and a lease of $3 µs.
//   - The claimed rows: the final SELECT of sqlClaim, sqlClaimReserve,
//     sqlHandOff and sqlReserve, each updated row's instance columns (the
//     list scanInstance scans, as in sqlGet) with the oldest unconsumed
//     signal its await was woken by, in batch order (c.ord).
//   - The reservable-row probe (sqlClaimReserve, sqlReserve): after a batch
//     a of ids ordered by id, CROSS JOIN LATERAL (SELECT r.id FROM
//     instances r WHERE r.id = a.id AND r.status IN ('ready', 'blocked')
//     AND r.worker IS NULL FOR NO KEY UPDATE) r, a primary-key probe per
//     row, as the outcome does (sqlCompleteApply); the UPDATE still checks
//     the row's status. The lock, which the transaction holds on those
//     rows already (sqlHandOffCandidates, sqlClaimCandidates), keeps the
//     probe from being flattened into a join the planner may order. Joined
//     to the batch instead, on the generic plan of a hand-off transaction
//     (the batch estimated at 10 rows), the batch was read again for every
//     row found by id = ANY: quadratic, 231.7 ms in 97 calls during one
//     1.02 s run of the peers' hot gate (5,000 steps), against 159.9 ms in
//     113 calls with the probe.
//   - The instance columns: the column list every Instance is scanned from
//     (scanInstance, instanceColumnCount columns), in sqlGet, sqlList,
//     sqlListNewest, sqlListScan, sqlListScanNewest, sqlChildren,
//     sqlKeyHolders, sqlKeyNext, sqlKeyOldest and the claimed rows;
//     the schedule columns, likewise, are the list scanSchedule scans, in
//     sqlSchedulesAll, sqlScheduleLock, sqlSchedulePause and
//     sqlScheduleRecord.
//   - The other keys' text: a row's other keys travel as one text per row
//     (keysText: key U+001E intent, joined by U+001F; "" for none) and are
//     written as extra_keys = (SELECT array_agg(split_part(e, E'\x1e', 1)
//     ORDER BY n) FROM unnest(string_to_array(nullif(t, ''), E'\x1f')) WITH
//     ORDINALITY AS u(e, n)) and extra_intents the same with part 2 (NULL
//     for none), so that each statement joins its batch to the rows by id
//     with nothing to group. In sqlInsert, sqlCompleteApply, sqlClaim,
//     sqlHandOff and sqlBlockMulti.
//   - The first key put back: the move to executing of a row of several
//     keys that waited in another key's line gives it its first key in
//     its key column, in the same update (a.first, a.intent, a.extras;
//     NULL: keys left as they are). In sqlClaim and sqlHandOff.
//
// TestRulesAreWrittenAlike checks that every statement that applies one of
// these rules writes it the same, whitespace aside.
