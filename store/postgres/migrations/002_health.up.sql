-- Health counts blocked, parked and failed rows per queue from this index
-- alone, without reading the table or its terminal rows.
CREATE INDEX instances_queue_status ON {schema}.instances (queue, status)
    WHERE status IN ('blocked', 'awaiting', 'awaiting_children', 'failed');
