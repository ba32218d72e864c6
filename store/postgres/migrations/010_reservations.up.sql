-- Reservations (store.Claimed.After): a blocked row reserved for a worker
-- as the successor of one of its claims carries that worker and a lease.
-- The reaper finds the expired ones through this index, as it finds
-- expired claims through instances_lease.
CREATE INDEX instances_reserved ON {schema}.instances (lease_expires_at)
    WHERE status = 'blocked' AND worker IS NOT NULL;
