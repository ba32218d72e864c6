-- Named leases: one engine of the fleet at a time holds one (the
-- maintenance sweeps: reconciler and retention), renewed by its holder and
-- taken over by another engine once it has expired.
CREATE TABLE {schema}.leases (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);
