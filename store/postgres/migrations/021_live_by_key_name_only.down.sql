-- godurable:no-transaction
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_live_key_name;
CREATE INDEX CONCURRENTLY instances_live_key_name ON {schema}.instances (key_name)
    WHERE key IS NOT NULL AND status NOT IN ('done', 'failed', 'canceled');
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_live_key_name_c;
