ALTER TABLE {schema}.schedules DROP COLUMN also_keys;
