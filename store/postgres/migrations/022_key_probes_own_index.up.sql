-- godurable:no-transaction
-- A key's waiting rows (migration 011) again, each status predicate written
-- COLLATE "POSIX" (the same comparison), as only the probes of one key's
-- ready or blocked rows write it: no other statement can prove these
-- predicates, and those probes can prove no other index's. Written plainly,
-- instances_pick_keyed matches a ready probe and instances_queue_status a
-- blocked one; on a table whose statistics predate its keyed rows (analyzed
-- while only keyless work ran, then a keyed workload before autoanalyze)
-- the planner estimates every such index at one row and took those, which
-- do not lead with the key: each probe read every ready (or blocked) row of
-- the queue. The pick indexes' own statements write COLLATE "C".
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_ready_posix;
CREATE INDEX CONCURRENTLY instances_key_ready_posix ON {schema}.instances (key, priority, run_at, seq)
    WHERE status = 'ready' COLLATE "POSIX" AND key IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_blocked_posix;
CREATE INDEX CONCURRENTLY instances_key_blocked_posix ON {schema}.instances (key, priority, run_at, seq)
    WHERE status = 'blocked' COLLATE "POSIX" AND worker IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_ready;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_blocked;
-- The same for a key's executing rows: its K = 1 holder (still unique) and
-- its gate holders. Written plainly, their predicates are implied by
-- instances_active's, and a probe of one key that took that index read
-- every entry of it, dead ones included: on a big table, which autovacuum
-- visits rarely, tens of thousands per probe.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_one_posix;
CREATE UNIQUE INDEX CONCURRENTLY instances_key_one_posix ON {schema}.instances (key)
    WHERE status = 'executing' COLLATE "POSIX" AND key IS NOT NULL AND key_shard IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_gate_posix;
CREATE INDEX CONCURRENTLY instances_key_gate_posix ON {schema}.instances (key, key_shard)
    WHERE status = 'executing' COLLATE "POSIX" AND key_shard IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_one;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_gate;
