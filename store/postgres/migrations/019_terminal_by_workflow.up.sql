-- godurable:no-transaction
-- The terminal rows of a workflow, oldest first: a workflow's own
-- retention (durable.WorkflowOptions.Retention) deletes them a chunk at a
-- time (sqlDeleteTerminalOf) without reading other workflows' rows.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_terminal_workflow;
CREATE INDEX CONCURRENTLY instances_terminal_workflow ON {schema}.instances (workflow, updated_at)
    WHERE status IN ('done', 'failed', 'canceled');
