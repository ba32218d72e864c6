ALTER TABLE {schema}.instances DROP COLUMN cancel_requested;
