-- Queue policies, rate limits, namespaces and rounds (keys take turns).
--
-- round: a ready row's turn among the keys of its queue and priority (see
-- store.Store, Order). It is given when a row is inserted due or falls due
-- and when it becomes ready again after running; a blocked row keeps it, a
-- scheduled row has none until it falls due (unless a rate limit
-- rescheduled it, which keeps its place).
ALTER TABLE {schema}.instances ADD COLUMN round bigint;
UPDATE {schema}.instances SET round = 0 WHERE status IN ('ready', 'blocked');

DROP INDEX {schema}.instances_pick_free;
DROP INDEX {schema}.instances_pick_keyed;
-- The pick: due ready rows of a queue in claim order, keyless and keyed
-- apart, so that a key's backlog never stands in front of keyless work.
CREATE INDEX instances_pick_free ON {schema}.instances (queue, priority, round, run_at, seq)
    WHERE status = 'ready' AND key IS NULL;
CREATE INDEX instances_pick_keyed ON {schema}.instances (queue, priority, round, run_at, seq)
    WHERE status = 'ready' AND key IS NOT NULL;
-- A key's last round in a queue and priority.
CREATE INDEX instances_key_round ON {schema}.instances (key, queue, priority, round)
    WHERE key IS NOT NULL AND status IN ('ready', 'blocked');
-- Executing rows per queue and key: what a queue policy counts.
CREATE INDEX instances_active ON {schema}.instances (queue, key) WHERE status = 'executing';

-- fresh_round is the round of one row of key k (NULL: none) made ready in
-- queue q at priority p: the queue's current round (the lowest among its
-- ready rows of that priority, 0 when none), or one past the key's highest
-- round among its ready and blocked rows there, whichever is greater. It
-- reads the snapshot of the statement that calls it.
CREATE FUNCTION {schema}.fresh_round(q text, p int, k text) RETURNS bigint
LANGUAGE sql STABLE AS $$
SELECT greatest(
    coalesce(least(
        (SELECT r.round FROM {schema}.instances r
         WHERE r.status = 'ready' AND r.key IS NULL AND r.queue = q AND r.priority = p
         ORDER BY r.round LIMIT 1),
        (SELECT r.round FROM {schema}.instances r
         WHERE r.status = 'ready' AND r.key IS NOT NULL AND r.queue = q AND r.priority = p
         ORDER BY r.round LIMIT 1)), 0),
    (SELECT r.round + 1 FROM {schema}.instances r
     WHERE r.key = k AND r.queue = q AND r.priority = p AND r.status IN ('ready', 'blocked')
     ORDER BY r.round DESC LIMIT 1))
$$;

-- The namespace owning each key limit.
ALTER TABLE {schema}.limits ADD COLUMN namespace text NOT NULL DEFAULT 'default';

-- Rate limits by key name, owned by a namespace.
CREATE TABLE {schema}.rate_limits (
    name      text    PRIMARY KEY,
    namespace text    NOT NULL,
    "limit"   int     NOT NULL CHECK ("limit" >= 1),
    period_us bigint  NOT NULL CHECK (period_us >= 1000),
    burst     int     NOT NULL CHECK (burst >= 1),
    per_key   boolean NOT NULL
);

-- Token buckets: a bucket is the key name (one per name) or the full key
-- (per key). credit is in units of 1/period_us token (see gate.RateLimit),
-- as of updated_at; refilled lazily by the claims that read it. Bucket ids
-- sort bytewise (collation C) so that the buckets of one name are one range
-- of the primary key.
CREATE TABLE {schema}.rate_buckets (
    bucket     text        COLLATE "C" PRIMARY KEY,
    credit     bigint      NOT NULL CHECK (credit >= 0),
    updated_at timestamptz NOT NULL
);

-- Fleet-wide budgets per queue, owned by a namespace.
CREATE TABLE {schema}.queue_policies (
    queue              text        PRIMARY KEY,
    namespace          text        NOT NULL,
    max_active         int         NOT NULL CHECK (max_active >= 1),
    max_active_per_key int         CHECK (max_active_per_key IS NULL OR max_active_per_key >= 1),
    updated_at         timestamptz NOT NULL DEFAULT now()
);
