-- godurable:no-transaction
-- The live rows that hold a key among their other keys (extra_keys,
-- migration 025), by those keys and by their names, in one index: a
-- per-key limit's change and a key's page find the live rows of one key
-- (sqlLiveByKey, sqlKeyWaiting) by the key itself, and a name's change
-- counts those of a name (sqlLiveByName) by the name. It replaces
-- instances_live_extra_key_names (migration 028), through which a key's
-- rows were found among every live row of its name: with a tenant key of
-- each of many accounts under one gate, every `durable limits set` of a
-- tenant read all of them. A row has an entry for each other key and for
-- each of their names, in one index as before; only live rows of several
-- keys have entries. key_names (028) stays, so that the statements of
-- engines and tools still on the version before keep working, without an
-- index (a scan of the table for a limit change's count or a key's page)
-- until they are replaced.
CREATE OR REPLACE FUNCTION {schema}.key_terms(keys text[]) RETURNS text[] LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$ DECLARE k text; terms text[] := keys; BEGIN FOREACH k IN ARRAY keys LOOP terms := terms || pg_catalog.split_part(k, ':', 1); END LOOP; RETURN terms; END $$;
CREATE INDEX CONCURRENTLY IF NOT EXISTS instances_live_extra_keys ON {schema}.instances USING gin ({schema}.key_terms(extra_keys))
    WHERE extra_keys IS NOT NULL AND status COLLATE "C" NOT IN ('done', 'failed', 'canceled');
DROP INDEX CONCURRENTLY IF EXISTS {schema}.instances_live_extra_key_names;
