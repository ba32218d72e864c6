DROP INDEX {schema}.instances_key_blocked;
