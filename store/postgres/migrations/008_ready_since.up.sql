-- ready_since is set on a row handed back by a worker that cannot run it
-- (an unknown workflow version or step: store.Outcome.HandBack): when the
-- row first became ready, kept by every later hand-back while each moves
-- run_at later, and cleared by any other outcome and by a retry. It is
-- NULL on every other row (run_at tells when those became ready), so the
-- column costs the hot path nothing: it is written in the outcome UPDATE
-- that writes run_at, and a nullable column without a default is added
-- without rewriting the table.
ALTER TABLE {schema}.instances ADD COLUMN ready_since timestamptz;
-- Health reads the handed-back rows waiting to run (their count per
-- workflow version, their oldest per queue) from this index alone; it
-- holds no other row.
CREATE INDEX instances_handed_back ON {schema}.instances (workflow, version, queue, ready_since)
    WHERE ready_since IS NOT NULL AND status IN ('ready', 'scheduled');
