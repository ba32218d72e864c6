DROP TABLE IF EXISTS {schema}.queue_policies;
DROP TABLE IF EXISTS {schema}.rate_buckets;
DROP TABLE IF EXISTS {schema}.rate_limits;
ALTER TABLE {schema}.limits DROP COLUMN IF EXISTS namespace;
DROP FUNCTION IF EXISTS {schema}.fresh_round(text, int, text);
DROP INDEX IF EXISTS {schema}.instances_active;
DROP INDEX IF EXISTS {schema}.instances_key_round;
DROP INDEX IF EXISTS {schema}.instances_pick_free;
DROP INDEX IF EXISTS {schema}.instances_pick_keyed;
ALTER TABLE {schema}.instances DROP COLUMN IF EXISTS round;
CREATE INDEX instances_pick_free ON {schema}.instances (queue, priority, run_at, seq)
    WHERE status = 'ready' AND key IS NULL;
CREATE INDEX instances_pick_keyed ON {schema}.instances (queue, priority, run_at, seq)
    WHERE status = 'ready' AND key IS NOT NULL;
