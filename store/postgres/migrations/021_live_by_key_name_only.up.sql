-- godurable:no-transaction
-- instances_live_key_name (migration 018) again, its status predicate
-- written COLLATE "C" (the same comparison), as only the limit change's
-- counts (sqlLiveByName, sqlLiveByKey) write it: no other statement can
-- prove it, so none reads this index instead of its own. Written plainly,
-- it matches every probe of a key's ready or blocked rows, and on a table
-- whose statistics predate its keyed rows the planner can take it for an
-- insert's next-round probe (meant for instances_key_round): a read of
-- every live row of the key's name per inserted key.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_live_key_name_c;
CREATE INDEX CONCURRENTLY instances_live_key_name_c ON {schema}.instances (key_name)
    WHERE key IS NOT NULL AND status COLLATE "C" NOT IN ('done', 'failed', 'canceled');
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_live_key_name;
