DROP INDEX IF EXISTS {schema}.instances_queue_status;
