ALTER TABLE {schema}.instances DROP COLUMN waiters;
