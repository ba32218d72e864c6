CREATE INDEX instances_key_waiting ON {schema}.instances (key, status, priority, run_at, seq)
    WHERE key IS NOT NULL AND status IN ('ready', 'blocked');
DROP INDEX {schema}.instances_key_ready;
DROP INDEX {schema}.instances_key_blocked;
