DROP TABLE {schema}.worked_queues;
