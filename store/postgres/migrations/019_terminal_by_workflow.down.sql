-- godurable:no-transaction
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_terminal_workflow;
