-- A key's waiting rows, ready and blocked apart, each in promotion order
-- (priority, run_at, seq): what promotions, stranded-key probes, an
-- insert's look at its keys and a claim's backlog read. Each probe's
-- condition is one index's predicate, so PostgreSQL picks that index with
-- or without statistics. With instances_key_waiting (both statuses, the
-- status a column), it picked instances_key_round for them just as
-- readily without statistics (the same estimate), filtered on the status
-- and read every waiting row of the key, sorting them, for each probe.
CREATE INDEX instances_key_blocked ON {schema}.instances (key, priority, run_at, seq)
    WHERE status = 'blocked' AND worker IS NULL;
CREATE INDEX instances_key_ready ON {schema}.instances (key, priority, run_at, seq)
    WHERE status = 'ready' AND key IS NOT NULL;
DROP INDEX {schema}.instances_key_waiting;
