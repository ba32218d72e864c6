package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
)

// TestKeyLimitMatchesGate pins the key-limit lookup (see sql.go), the SQL
// form of the rule every statement uses to find the limit a key runs
// under, written here as the statements write it, to gate.Limits.For:
// over keys with their own limit, keys whose id extends a key that has one,
// keys of a limited name and keys of an unlimited name, both give the same
// limit (or none).
func TestKeyLimitMatchesGate(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	stored := []gate.Limit{
		{Name: "stripe", Limit: 5, Shards: 1}, {Name: "stripe:big", Limit: 50, Shards: 5},
		{Name: "stripe:big:eu", Limit: 7, Shards: 2}, {Name: "openai", Limit: 3, Shards: 3},
	}
	ls, err := gate.NewLimits(stored)
	require.NoError(t, err)
	for _, l := range stored {
		_, err := s.pool.Exec(ctx, s.q(`INSERT INTO {schema}.limits (name, "limit", shards) VALUES ($1, $2, $3)`), l.Name, l.Limit, l.Shards)
		require.NoError(t, err)
	}
	keys := []string{"stripe:big", "stripe:big:eu", "stripe:big:eu:1", "stripe:bi", "stripe:bigger", "stripe:small",
		"openai:x", "openai:stripe:big", "account:1", "account:stripe"}
	rows, err := s.pool.Query(ctx, s.q(`SELECT k, coalesce(l.name, ''), coalesce(l."limit", 0), coalesce(l.shards, 0)
FROM unnest($1::text[]) WITH ORDINALITY AS x(k, ord)
LEFT JOIN LATERAL (SELECT lk.name, lk."limit", lk.shards FROM {schema}.limits lk
                   WHERE lk.name IN (k, split_part(k, ':', 1)) ORDER BY length(lk.name) DESC LIMIT 1) l ON true
ORDER BY x.ord`), keys)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (gate.Limit, error) {
		var k string
		var l gate.Limit
		return l, r.Scan(&k, &l.Name, &l.Limit, &l.Shards)
	})
	require.NoError(t, err)
	require.Len(t, got, len(keys))
	for i, k := range keys {
		want, _ := ls.For(k)
		require.Equal(t, want, got[i], "key %s", k)
	}
}
