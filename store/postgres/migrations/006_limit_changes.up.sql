-- The last sync that changed the K (or rate limit) of a key name held by
-- live instances, so that every engine's Health can warn about it, not only
-- the engine whose Start made the change.
CREATE TABLE {schema}.limit_changes (
    name       text        PRIMARY KEY,
    message    text        NOT NULL,
    live       bigint      NOT NULL,
    changed_at timestamptz NOT NULL
);
