-- godurable:no-transaction
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_pick_free_workflow;
CREATE INDEX CONCURRENTLY instances_pick_free_workflow ON {schema}.instances (queue, workflow, priority, round, run_at, seq)
    WHERE status = 'ready' COLLATE "C" AND key IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_pick_keyed_workflow;
CREATE INDEX CONCURRENTLY instances_pick_keyed_workflow ON {schema}.instances (queue, workflow, priority, round, run_at, seq)
    WHERE status = 'ready' COLLATE "C" AND key IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_pick_keyed_version;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_pick_free_version;
