-- paused_queues holds the queues an operator paused
-- (store.Store.PauseQueue): claims take no row of them and outcomes hand
-- no slot to one. A claim reads it by primary key, so a queue that is not
-- paused costs one index probe of a table of a few rows.
CREATE TABLE {schema}.paused_queues (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL
);
