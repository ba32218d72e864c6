-- godurable:no-transaction
DROP INDEX CONCURRENTLY IF EXISTS {schema}.limits_of_names;
