DROP TABLE {schema}.paused_queues;
