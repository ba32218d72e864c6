-- godurable:no-transaction
-- instances_live_key_name_c (migration 021) with the key after the name,
-- under the same predicate, so that a per-key limit's change counts the
-- live rows of its key (sqlLiveByKey) by an index condition on both,
-- instead of reading every live row of the key's name: with many live rows
-- of a name the planner took the table's sequential scan for that. The
-- name's counts (sqlLiveByName) read the leading column as before. A row's
-- update enters as many indexes as before.
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_live_key_name_key_c ON {schema}.instances (key_name, key)
    WHERE key IS NOT NULL AND status COLLATE "C" NOT IN ('done', 'failed', 'canceled');
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_live_key_name_c;
