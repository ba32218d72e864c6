-- godurable:no-transaction
-- Fails while two rows hold one unique key, one of them canceled and
-- still running: run it again once that step has returned.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_unique_slot;
CREATE UNIQUE INDEX CONCURRENTLY instances_unique_slot ON {schema}.instances (unique_slot)
    WHERE unique_slot IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_unique_slot_live;
