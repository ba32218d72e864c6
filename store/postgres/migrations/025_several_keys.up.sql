-- Several concurrency keys per instance (store.NewInstance.Also). A row of
-- one key leaves both new columns NULL. Nullable columns without a default
-- are added without rewriting the table.
--
-- A row of several keys keeps one of them in key (with key_intent,
-- key_shard) and the others in extra_keys, with their intents in
-- extra_intents (same order). Which one is in key depends on where the
-- row is: while it executes, its first key (store.NormalizeKeys), so that
-- a K = 1 first key is held under instances_key_one_posix like any other;
-- while it is blocked, the key that blocked it, so that it waits in that
-- key's line and that key's freeing promotes it; once promoted, it stays
-- in that line until a claim takes it. Readers put the keys back in
-- NormalizeKeys' order (the row's BlockedOn is key while it is blocked).
ALTER TABLE {schema}.instances ADD COLUMN extra_keys text[], ADD COLUMN extra_intents text[];
-- What an executing row of several keys holds of the keys not in its key
-- column: one row per key, written by the claim that admitted it (fence)
-- and deleted by whatever ends that claim (outcome, release, reap). shard
-- is the gate counter it debited, NULL for a K = 1 hold. Every statement
-- that asks whether a K = 1 key is held reads this table beside
-- instances; the reconciler counts its gate holds with the rows' own.
CREATE TABLE {schema}.key_holds (
    instance_id uuid   NOT NULL,
    fence       bigint NOT NULL,
    key         text   NOT NULL,
    shard       int,
    PRIMARY KEY (instance_id, key)
);
-- Two K = 1 holds of one key in this table cannot commit.
CREATE UNIQUE INDEX key_holds_one ON {schema}.key_holds (key) WHERE shard IS NULL;
CREATE INDEX key_holds_key ON {schema}.key_holds (key, shard);
