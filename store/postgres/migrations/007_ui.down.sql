DROP INDEX {schema}.instances_key_newest;
DROP INDEX {schema}.instances_newest;
