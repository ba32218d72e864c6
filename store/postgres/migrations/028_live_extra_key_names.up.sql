-- godurable:no-transaction
-- The live rows that hold a key of a name among their other keys
-- (extra_keys, migration 025), by the names of those keys: a limit change
-- counts the live rows of each changed name and key in any position
-- (sqlLiveByName, sqlLiveByKey), as instances_live_key_name_c serves the
-- key column. Only live rows of several keys have an entry, so a row's
-- later updates write none once it has ended. key_names is immutable: a
-- key's name is what precedes its first ':' (gate.NameOf). It is PL/pgSQL,
-- which a row's update evaluates in about half the time of a SQL function
-- over unnest.
CREATE OR REPLACE FUNCTION {schema}.key_names(keys text[]) RETURNS text[] LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$ DECLARE k text; names text[] := '{}'; BEGIN FOREACH k IN ARRAY keys LOOP names := names || pg_catalog.split_part(k, ':', 1); END LOOP; RETURN names; END $$;
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_live_extra_key_names ON {schema}.instances USING gin ({schema}.key_names(extra_keys))
    WHERE extra_keys IS NOT NULL AND status COLLATE "C" NOT IN ('done', 'failed', 'canceled');
