-- Code before this migration knows no reservations: give them back.
UPDATE {schema}.instances SET status = 'ready', worker = NULL, lease_expires_at = NULL
WHERE status = 'blocked' AND worker IS NOT NULL;
DROP INDEX {schema}.instances_reserved;
