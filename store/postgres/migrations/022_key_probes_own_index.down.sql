-- godurable:no-transaction
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_ready;
CREATE INDEX CONCURRENTLY instances_key_ready ON {schema}.instances (key, priority, run_at, seq)
    WHERE status = 'ready' AND key IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_blocked;
CREATE INDEX CONCURRENTLY instances_key_blocked ON {schema}.instances (key, priority, run_at, seq)
    WHERE status = 'blocked' AND worker IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_ready_posix;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_key_blocked_posix;
