-- godurable:no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_live_extra_key_names ON {schema}.instances USING gin ({schema}.key_names(extra_keys))
    WHERE extra_keys IS NOT NULL AND status COLLATE "C" NOT IN ('done', 'failed', 'canceled');
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_live_extra_keys;
DROP FUNCTION IF EXISTS {schema}.key_terms(text[]);
