-- fresh_round (migration 003) wrote the round rule before a gate key took
-- as many turns a round as its limit; no statement calls it (each writes
-- the rule inline, see sql.go), so it goes rather than disagree with them.
DROP FUNCTION IF EXISTS {schema}.fresh_round(text, int, text);
