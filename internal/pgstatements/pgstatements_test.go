package pgstatements

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestName(t *testing.T) {
	Register("sqlRead", `SELECT a, b FROM {schema}.t WHERE s = 'ready' COLLATE "C" AND id = $1`)
	Register("sqlWrite", `UPDATE {schema}.t SET s = 'done' WHERE id = ANY ($1::uuid[])`)
	Register("sqlSetA", `SELECT set_config('a', 'on', true)`)
	Register("sqlSetB", `SELECT set_config('b', $1, true)`)
	for _, c := range []struct {
		query, want string
		ok          bool
	}{
		{`SELECT a, b FROM "bench_x".t WHERE s = $2 COLLATE "C" AND id = $1`, "sqlRead", true},
		{`UPDATE "bench_x".t SET s = $2 WHERE id = ANY ($1::uuid[])`, "sqlWrite", true},
		{`SELECT set_config($1, $2, $3)`, "sqlSetA|sqlSetB", true}, // one statement to the server
		{`SELECT count(*) FROM pg_class`, "", false},
	} {
		got, ok := Name(c.query)
		require.Equal(t, c.ok, ok, c.query)
		if c.ok {
			require.Equal(t, c.want, got, c.query)
		}
	}
	require.Len(t, Statements(), 4)
}
