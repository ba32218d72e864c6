DROP TABLE IF EXISTS {schema}.schedules;
