-- godurable:no-transaction
-- The first ready row of each workflow in a queue, in claim order, keyless
-- and keyed apart like instances_pick_free and instances_pick_keyed: a
-- claim restricted to the workflows its worker runs probes these once per
-- workflow and starts its window at the first of those rows, so that ready
-- rows of workflows it does not run that stand ahead of them in the queue
-- (a backlog of a workflow no running worker registers yet, in a rolling
-- deploy) cost the claim nothing (see sqlClaimCandidates). Their status
-- predicate is written COLLATE "C" (the same equality), as only those
-- probes write it: no other statement can prove it, so none reads these
-- indexes instead of the pick indexes (the window, which takes its rows in
-- claim order across workflows, would read every ready row of its
-- workflows here and sort them).
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_pick_free_workflow;
CREATE INDEX CONCURRENTLY instances_pick_free_workflow ON {schema}.instances (queue, workflow, priority, round, run_at, seq)
    WHERE status = 'ready' COLLATE "C" AND key IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_pick_keyed_workflow;
CREATE INDEX CONCURRENTLY instances_pick_keyed_workflow ON {schema}.instances (queue, workflow, priority, round, run_at, seq)
    WHERE status = 'ready' COLLATE "C" AND key IS NOT NULL;
