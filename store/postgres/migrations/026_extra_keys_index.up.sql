-- godurable:no-transaction
-- The rows that carry a key among their extra keys (migration 025), for
-- the reads that find a key's rows in any position: List by key, a key's
-- page (KeyInfo), the rows of a key waiting for another of their keys.
-- Only rows of several keys have an entry.
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_extra_keys ON {schema}.instances USING gin (extra_keys)
    WHERE extra_keys IS NOT NULL;
