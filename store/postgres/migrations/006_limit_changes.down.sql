DROP TABLE {schema}.limit_changes;
