-- godurable:no-transaction
-- The live rows of a key name: a limit change counts them (sqlLiveByName)
-- while it holds the name's counters, which every credit of the name then
-- waits for, so the count reads this index, not the table. Built without
-- blocking writes, as every index added to instances after its creation.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_live_key_name;
CREATE INDEX CONCURRENTLY instances_live_key_name ON {schema}.instances (key_name)
    WHERE key IS NOT NULL AND status NOT IN ('done', 'failed', 'canceled');
