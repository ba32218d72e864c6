-- fresh_round is the round of one row of key k (NULL: none) made ready in
-- queue q at priority p: the queue's current round (the lowest among its
-- ready rows of that priority, 0 when none), or one past the key's highest
-- round among its ready and blocked rows there, whichever is greater. It
-- reads the snapshot of the statement that calls it.
CREATE FUNCTION {schema}.fresh_round(q text, p int, k text) RETURNS bigint
LANGUAGE sql STABLE AS $$
SELECT greatest(
    coalesce(least(
        (SELECT r.round FROM {schema}.instances r
         WHERE r.status = 'ready' AND r.key IS NULL AND r.queue = q AND r.priority = p
         ORDER BY r.round LIMIT 1),
        (SELECT r.round FROM {schema}.instances r
         WHERE r.status = 'ready' AND r.key IS NOT NULL AND r.queue = q AND r.priority = p
         ORDER BY r.round LIMIT 1)), 0),
    (SELECT r.round + 1 FROM {schema}.instances r
     WHERE r.key = k AND r.queue = q AND r.priority = p AND r.status IN ('ready', 'blocked')
     ORDER BY r.round DESC LIMIT 1))
$$;
