-- godurable:no-transaction
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_pick_keyed_workflow;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_pick_free_workflow;
