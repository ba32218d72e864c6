DROP INDEX {schema}.instances_unique_slot;
ALTER TABLE {schema}.instances DROP COLUMN unique_slot;
ALTER TABLE {schema}.instances ADD COLUMN unique_slot text GENERATED ALWAYS AS (
    CASE WHEN unique_statuses @> ARRAY['ready','scheduled','blocked','executing','awaiting','awaiting_children']
          AND status = ANY (unique_statuses)
         THEN unique_key END) STORED;
CREATE UNIQUE INDEX instances_unique_slot ON {schema}.instances (unique_slot) WHERE unique_slot IS NOT NULL;
