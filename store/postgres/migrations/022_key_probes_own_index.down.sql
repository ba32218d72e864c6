-- godurable:no-transaction
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_ready;
CREATE INDEX CONCURRENTLY instances_key_ready ON {schema}.instances (key, priority, run_at, seq)
    WHERE status = 'ready' AND key IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_blocked;
CREATE INDEX CONCURRENTLY instances_key_blocked ON {schema}.instances (key, priority, run_at, seq)
    WHERE status = 'blocked' AND worker IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_ready_posix;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_blocked_posix;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_one;
CREATE UNIQUE INDEX CONCURRENTLY instances_key_one ON {schema}.instances (key)
    WHERE status = 'executing' AND key IS NOT NULL AND key_shard IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_gate;
CREATE INDEX CONCURRENTLY instances_key_gate ON {schema}.instances (key, key_shard)
    WHERE status = 'executing' AND key_shard IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_one_posix;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_gate_posix;
