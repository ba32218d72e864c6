DROP TABLE {schema}.key_holds;
ALTER TABLE {schema}.instances DROP COLUMN extra_intents, DROP COLUMN extra_keys;
