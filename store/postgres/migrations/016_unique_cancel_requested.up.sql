-- godurable:no-transaction
-- An instance whose cancel is requested (its step still runs, holding its
-- concurrency key's slot until it returns) no longer holds its unique key,
-- so that an insert with OnConflict CancelOlder can insert the instance
-- that replaces it at once (see store.ConflictCancelOlder). The unique
-- index leaves such rows out, rather than unique_slot's expression, which
-- PostgreSQL 15 cannot change without rewriting the table; it is built
-- without blocking writes, then the index it replaces is dropped.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_unique_slot_live;
CREATE UNIQUE INDEX CONCURRENTLY instances_unique_slot_live ON {schema}.instances (unique_slot)
    WHERE unique_slot IS NOT NULL AND NOT cancel_requested;
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_unique_slot;
