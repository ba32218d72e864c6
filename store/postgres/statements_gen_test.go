package postgres

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/godurable/godurable/internal/pgstatements"
	"github.com/godurable/godurable/internal/pgstatements/source"
	"github.com/stretchr/testify/require"
)

// TestStatementsGenIsCurrent: statements_gen.go registers every statement
// of the package, as go generate writes it.
func TestStatementsGenIsCurrent(t *testing.T) {
	want, err := source.Generate(".")
	require.NoError(t, err)
	got, err := os.ReadFile("statements_gen.go")
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "statements_gen.go is stale: run go generate ./store/postgres")
}

// TestStatementsAreNamedFromTheServersText: each statement, written as
// pg_stat_statements keeps it (the schema in place, string constants as
// parameters), is named as itself, so that no two statements are too alike
// for a profile to tell apart.
func TestStatementsAreNamedFromTheServersText(t *testing.T) {
	literal := regexp.MustCompile(`'(?:[^']|'')*'`)
	all := pgstatements.Statements()
	require.Greater(t, len(all), 100)
	for n, sql := range all {
		text := literal.ReplaceAllStringFunc(render(sql, "bench_s11b"), func(string) string { return "$" + strconv.Itoa(99) })
		got, ok := pgstatements.Name(text)
		require.True(t, ok, "%s: not named", n)
		require.Contains(t, strings.Split(got, "|"), n, "%s is named as another statement", n)
		if got != n {
			t.Logf("%s is one to the server with others: %s", n, got)
		}
	}
}
