-- godurable:no-transaction
-- The limits of key names, apart from per-key limits (a per-key limit is
-- named by a full key, which has a ':'): Health and the counters' repairs
-- read every name's limit, and a fleet may store a per-key limit for each
-- of many thousand tenants, which those reads would otherwise scan.
CREATE INDEX CONCURRENTLY IF NOT EXISTS limits_of_names ON {schema}.limits (name)
    WHERE strpos(name, ':') = 0;
