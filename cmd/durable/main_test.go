package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/godurable/godurable/internal/pgtest"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestMigrateCommand(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	url := pgtest.URL(t)
	schema := pgtest.SchemaOf(pool)
	var out, errb bytes.Buffer

	require.NoError(t, run(ctx, []string{"migrate", "-database-url", url, "-schema", schema}, &out, &errb))
	require.Contains(t, out.String(), "applied [1 2], now at version 2")
	out.Reset()
	require.NoError(t, run(ctx, []string{"migrate", "-database-url", url, "-schema", schema}, &out, &errb))
	require.Contains(t, out.String(), "nothing to do, at version 2")
	out.Reset()

	t.Setenv("DATABASE_URL", url)
	require.NoError(t, run(ctx, []string{"migrate", "-schema", schema, "-down", "0"}, &out, &errb))
	require.Contains(t, out.String(), "reverted [2 1], now at version 0")

	require.ErrorContains(t, run(ctx, []string{"migrate", "-schema", "Bad"}, &out, &errb), "invalid schema")
	require.Error(t, run(ctx, []string{"nope"}, &out, &errb))
	require.Error(t, run(ctx, nil, &out, &errb))
	t.Setenv("DATABASE_URL", "")
	require.ErrorContains(t, run(ctx, []string{"migrate"}, &out, &errb), "no database")
}
