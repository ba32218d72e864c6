-- godurable:no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_live_key_name_c ON {schema}.instances (key_name)
    WHERE key IS NOT NULL AND status COLLATE "C" NOT IN ('done', 'failed', 'canceled');
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_live_key_name_key_c;
