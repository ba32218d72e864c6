DROP INDEX {schema}.instances_handed_back;
ALTER TABLE {schema}.instances DROP COLUMN ready_since;
