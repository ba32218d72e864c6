-- Only rows that hold a unique key are entered in the unique-slot index.
-- Unique indexes never compare NULLs, so the constraint is unchanged; but
-- a full index took one entry (and one uniqueness probe) for every row
-- version, that is on every insert, claim and outcome of every row.
CREATE UNIQUE INDEX instances_unique_slot_set ON {schema}.instances (unique_slot)
    WHERE unique_slot IS NOT NULL;
DROP INDEX {schema}.instances_unique_slot;
ALTER INDEX {schema}.instances_unique_slot_set RENAME TO instances_unique_slot;
