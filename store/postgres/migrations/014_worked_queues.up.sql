-- worked_queues records, per queue, the last time an engine said it claims
-- from it (store.Store.MarkQueuesWorked). Engines write it every few
-- seconds per queue, not per claim, so the claim path never touches it;
-- Health reads it (one row per queue) to find queues nobody works.
CREATE TABLE {schema}.worked_queues (
    queue          text        PRIMARY KEY,
    last_worked_at timestamptz NOT NULL
);
