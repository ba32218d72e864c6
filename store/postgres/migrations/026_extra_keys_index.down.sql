-- godurable:no-transaction
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_extra_keys;
