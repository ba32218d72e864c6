-- An instance whose cancel is requested (its step still runs, holding its
-- concurrency key's slot until it returns) no longer holds its unique key,
-- so that an insert with OnConflict CancelOlder can insert the instance
-- that replaces it at once (see store.ConflictCancelOlder). PostgreSQL 15
-- cannot change a generated column's expression: the column and its index
-- are made again (a rewrite of the table).
DROP INDEX {schema}.instances_unique_slot;
ALTER TABLE {schema}.instances DROP COLUMN unique_slot;
ALTER TABLE {schema}.instances ADD COLUMN unique_slot text GENERATED ALWAYS AS (
    CASE WHEN unique_statuses @> ARRAY['ready','scheduled','blocked','executing','awaiting','awaiting_children']
          AND status = ANY (unique_statuses) AND NOT cancel_requested
         THEN unique_key END) STORED;
CREATE UNIQUE INDEX instances_unique_slot ON {schema}.instances (unique_slot) WHERE unique_slot IS NOT NULL;
