DROP INDEX {schema}.instances_pick_keyed_workflow;
DROP INDEX {schema}.instances_pick_free_workflow;
