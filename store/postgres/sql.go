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
//     instances_key_gate, instances_lease):
//     PostgreSQL uses a partial index only when the query implies its
//     predicate, so they are not redundant even where the rest of the
//     condition already pins the rows.
//   - A status condition's collation names the family of indexes a read
//     may use, as their predicates are written the same way: COLLATE "C"
//     the version pick indexes (the claim's start rows and the hand-off's
//     turn probes), COLLATE "POSIX" one key's ready and blocked rows
//     (instances_key_ready_posix, instances_key_blocked_posix), and the
//     plain comparison the rest. The comparison is the same; the planner
//     proves a predicate only with the collation it is written in. On a
//     table whose statistics predate its keyed rows every partial index
//     of ready or blocked rows is estimated at one row, and a probe of one
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
	sqlMigrationLock   = `SELECT pg_advisory_lock($1::bigint)`
	sqlMigrationUnlock = `SELECT pg_advisory_unlock($1::bigint)`

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

// The limit a key runs under, gate.Limits.For's SQL form: the key's own
// limit (a per-key limit, named by the full key) if it has one, else its
// name's, else none (K = 1). A statement writes
//
//	LEFT JOIN ` + "`" + ` + keyLimit + ` + "`" + `k.key, split_part(k.key, ':', 1)` + "`" + ` + keyLimitEnd + ` + "`" + ` ON true
//
// (the key, then its name) and reads l.name, l."limit" and l.shards. Both
// are primary-key probes of limits; of the two, the key's own entry is the
// longer name (a key is its name, ':' and a non-empty id). A key has a
// limit of its own only while its name has one (gate.Limits.Validate), so
// whether a key is a gate (K = 1 or not) still depends on its name alone,
// and the statements that ask only that join limits on the name.
const (
	keyLimit    = `LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk WHERE lk.name IN (`
	keyLimitEnd = `) ORDER BY length(lk.name) DESC LIMIT 1) l`
)

// instanceColumns is the column list every Instance is scanned from (see scanInstance).
const instanceColumns = `id::text, workflow, version, queue, priority, status, step, state, attempt,
	coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
	CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
	timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
	coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
	coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since`
