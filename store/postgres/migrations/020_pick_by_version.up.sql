-- godurable:no-transaction
-- The first ready row of each workflow version in a queue, in claim order,
-- keyless and keyed apart: a claim restricted to the workflow versions its
-- worker registers probes these once per version (see pickStartFree), so
-- that ready rows of versions it does not run (a rolling deploy's new
-- version, ahead of the rows the old workers run) cost it nothing, as rows
-- of workflows it does not run did with migration 017's indexes, which
-- these replace. The status predicate is written COLLATE "C" for the
-- reason 017 gives: no other statement can prove it.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_pick_free_version;
CREATE INDEX CONCURRENTLY instances_pick_free_version ON {schema}.instances (queue, workflow, version, priority, round, run_at, seq)
    WHERE status = 'ready' COLLATE "C" AND key IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_pick_keyed_version;
CREATE INDEX CONCURRENTLY instances_pick_keyed_version ON {schema}.instances (queue, workflow, version, priority, round, run_at, seq)
    WHERE status = 'ready' COLLATE "C" AND key IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_pick_free_workflow;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_pick_keyed_workflow;
