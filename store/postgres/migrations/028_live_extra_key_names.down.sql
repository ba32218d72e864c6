-- godurable:no-transaction
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_live_extra_key_names;
DROP FUNCTION IF EXISTS {schema}.key_names(text[]);
