-- Periodic workflows (see package periodic and store.Schedule): the
-- definition a namespace syncs, and the run-time state the store keeps
-- across syncs. epoch changes on every fire, pause, resume and definition
-- change; a fire compares it, so that one engine records each tick.
CREATE TABLE {schema}.schedules (
    name            text        PRIMARY KEY,
    namespace       text        NOT NULL,
    workflow        text        NOT NULL,
    cron            text        NOT NULL,
    time_zone       text        NOT NULL DEFAULT '',
    queue           text        NOT NULL DEFAULT '',
    priority        int         NOT NULL DEFAULT 0,
    key             text,
    key_intent      text        NOT NULL DEFAULT '',
    unique_statuses text[]      NOT NULL DEFAULT '{}',
    overlap         text        NOT NULL CHECK (overlap IN ('allow', 'skip', 'queue')),
    catch_up        text        NOT NULL CHECK (catch_up IN ('skip', 'once')),
    grace_us        bigint      NOT NULL DEFAULT 0 CHECK (grace_us >= 0),
    paused          boolean     NOT NULL DEFAULT false,
    anchor          timestamptz NOT NULL,
    last_tick       timestamptz,
    last_instance   uuid,
    last_fired_at   timestamptz,
    epoch           bigint      NOT NULL DEFAULT 1,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
