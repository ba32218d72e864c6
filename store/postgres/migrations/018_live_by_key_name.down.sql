-- godurable:no-transaction
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_live_key_name;
