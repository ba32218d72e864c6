ALTER TABLE {schema}.instances RESET (autovacuum_vacuum_scale_factor);
