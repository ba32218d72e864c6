-- Instances, slot counters, limits, signals and history.
--
-- Statuses: 'ready' rows are due and on the pick path; 'scheduled' rows are
-- ready rows with a future run_at (reported as ready), kept off the pick
-- index so that delayed rows never slow the pick; 'blocked' rows wait for a
-- slot of their key and are promoted to ready when one frees.

CREATE TABLE {schema}.instances (
    id               uuid        PRIMARY KEY,
    workflow         text        NOT NULL,
    version          int         NOT NULL DEFAULT 0,
    queue            text        NOT NULL,
    priority         int         NOT NULL DEFAULT 0,
    status           text        NOT NULL,
    step             text        NOT NULL,
    state            jsonb,
    attempt          int         NOT NULL DEFAULT 0,
    key              text,
    key_name         text        GENERATED ALWAYS AS (split_part(key, ':', 1)) STORED,
    key_intent       text        NOT NULL DEFAULT '',
    key_shard        int,
    run_at           timestamptz NOT NULL,
    await_signal     text,
    timeout_at       timestamptz,
    timed_out        boolean     NOT NULL DEFAULT false,
    worker           text,
    fence            bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    started_at       timestamptz,
    result           jsonb,
    last_error       text,
    parent_id        uuid,
    pending_children int         NOT NULL DEFAULT 0,
    -- spawn_gen counts a parent's spawns; join_gen is the spawn of its parent
    -- a child belongs to. A child ends its parent's join only for that spawn.
    spawn_gen        int         NOT NULL DEFAULT 0,
    join_gen         int         NOT NULL DEFAULT 0,
    unique_key       text,
    unique_statuses  text[],
    -- unique_slot holds unique_key while the row is in its occupied scope. It
    -- is only set for scopes that contain every non-terminal status, so that
    -- no ordinary transition can make a row re-enter its scope while another
    -- row holds the key; other scopes are checked at insert under a lock.
    unique_slot      text        GENERATED ALWAYS AS (
        CASE WHEN unique_statuses @> ARRAY['ready','scheduled','blocked','executing','awaiting','awaiting_children']
              AND status = ANY (unique_statuses)
             THEN unique_key END) STORED,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    seq              bigserial   NOT NULL,
    CONSTRAINT instances_status_check CHECK (status IN
        ('ready','scheduled','blocked','executing','awaiting','awaiting_children','done','failed','canceled')),
    CONSTRAINT instances_claim_check CHECK (status <> 'executing' OR (worker IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT instances_shard_check CHECK (key_shard IS NULL OR (key IS NOT NULL AND status = 'executing'))
);

-- The pick: due ready rows of a queue in admission order, keyless and keyed
-- apart, so that a key's backlog never stands in front of keyless work.
CREATE INDEX instances_pick_free ON {schema}.instances (queue, priority, run_at, seq)
    WHERE status = 'ready' AND key IS NULL;
CREATE INDEX instances_pick_keyed ON {schema}.instances (queue, priority, run_at, seq)
    WHERE status = 'ready' AND key IS NOT NULL;
-- Delayed rows, promoted to ready when due; also answers NextDue.
CREATE INDEX instances_scheduled ON {schema}.instances (queue, run_at) WHERE status = 'scheduled';
-- K = 1: a second executing row of a key is uncommittable.
CREATE UNIQUE INDEX instances_key_one ON {schema}.instances (key)
    WHERE status = 'executing' AND key IS NOT NULL AND key_shard IS NULL;
-- Gate holders per (key, shard): reconciler truth and KeyInfo.
CREATE INDEX instances_key_gate ON {schema}.instances (key, key_shard)
    WHERE status = 'executing' AND key_shard IS NOT NULL;
-- Waiting rows of a key in admission order: promotion of blocked rows and
-- moving a saturated key's ready backlog off the pick path.
CREATE INDEX instances_key_waiting ON {schema}.instances (key, status, priority, run_at, seq)
    WHERE key IS NOT NULL AND status IN ('ready', 'blocked');
CREATE INDEX instances_lease ON {schema}.instances (lease_expires_at) WHERE status = 'executing';
CREATE INDEX instances_timeouts ON {schema}.instances (queue, timeout_at)
    WHERE status = 'awaiting' AND timeout_at IS NOT NULL;
CREATE UNIQUE INDEX instances_unique_slot ON {schema}.instances (unique_slot);
CREATE INDEX instances_unique_key ON {schema}.instances (unique_key, status) WHERE unique_key IS NOT NULL;
CREATE INDEX instances_parent ON {schema}.instances (parent_id, seq) WHERE parent_id IS NOT NULL;
CREATE INDEX instances_terminal ON {schema}.instances (updated_at)
    WHERE status IN ('done', 'failed', 'canceled');

CREATE SEQUENCE {schema}.fence_seq;

CREATE TABLE {schema}.key_slots (
    key       text NOT NULL,
    shard     int  NOT NULL,
    capacity  int  NOT NULL,
    available int  NOT NULL,
    PRIMARY KEY (key, shard),
    CONSTRAINT key_slots_available_check CHECK (available >= 0 AND available <= capacity)
);

CREATE TABLE {schema}.limits (
    name    text PRIMARY KEY,
    "limit" int  NOT NULL CHECK ("limit" >= 1),
    shards  int  NOT NULL CHECK (shards >= 1),
    CONSTRAINT limits_shards_le_limit CHECK (shards <= "limit")
);

CREATE TABLE {schema}.signals (
    id          bigserial   PRIMARY KEY,
    instance_id uuid        NOT NULL REFERENCES {schema}.instances (id) ON DELETE CASCADE,
    name        text        NOT NULL,
    payload     jsonb,
    dedup_key   text,
    consumed_at timestamptz,
    created_at  timestamptz NOT NULL,
    CONSTRAINT signals_dedup UNIQUE (instance_id, dedup_key)
);
CREATE INDEX signals_inbox ON {schema}.signals (instance_id, name, id) WHERE consumed_at IS NULL;

CREATE TABLE {schema}.history (
    id          bigserial   PRIMARY KEY,
    instance_id uuid        NOT NULL REFERENCES {schema}.instances (id) ON DELETE CASCADE,
    step        text        NOT NULL,
    attempt     int         NOT NULL,
    key         text,
    worker      text,
    started_at  timestamptz,
    finished_at timestamptz,
    outcome     text        NOT NULL,
    error       text
);
CREATE INDEX history_instance ON {schema}.history (instance_id, id);
