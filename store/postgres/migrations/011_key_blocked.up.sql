-- A key's waiting blocked rows in promotion order (priority, run_at, seq):
-- what every promotion and every stranded-key probe reads. The probes'
-- condition is this index's predicate, so PostgreSQL picks it with or
-- without statistics; without them, it picked instances_key_round for
-- them just as readily (the same estimate), filtered on the status, and
-- read every waiting row of the key, sorting them for each probe.
CREATE INDEX instances_key_blocked ON {schema}.instances (key, priority, run_at, seq)
    WHERE status = 'blocked' AND worker IS NULL;
