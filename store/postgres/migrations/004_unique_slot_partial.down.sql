CREATE UNIQUE INDEX instances_unique_slot_all ON {schema}.instances (unique_slot);
DROP INDEX {schema}.instances_unique_slot;
ALTER INDEX {schema}.instances_unique_slot_all RENAME TO instances_unique_slot;
