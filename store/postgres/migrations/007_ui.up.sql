-- The instance list newest first (store.ListFilter.Newest: `durable ui`'s
-- Instances page). Without an index in insertion order a page read every
-- matching row to return 50 (0.4 s unfiltered at a million rows). seq only
-- grows, so both indexes take their inserts at their right edge.
CREATE INDEX instances_newest ON {schema}.instances (seq);
-- The list of one key's instances, in every status (the key indexes of the
-- claim hold only its ready, blocked or executing rows).
CREATE INDEX instances_key_newest ON {schema}.instances (key, seq) WHERE key IS NOT NULL;
