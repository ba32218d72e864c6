package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store/postgres"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestMigrateCommand(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	url := pgtest.URL(t)
	schema := pgtest.SchemaOf(pool)
	var out, errb bytes.Buffer
	ms, err := postgres.Migrations()
	require.NoError(t, err)
	var up, down []int
	for _, m := range ms {
		up, down = append(up, m.Version), append([]int{m.Version}, down...)
	}
	last := len(ms)

	require.NoError(t, run(ctx, []string{"migrate", "-database-url", url, "-schema", schema}, &out, &errb))
	require.Contains(t, out.String(), fmt.Sprintf("applied %v, now at version %d", up, last))
	out.Reset()
	require.NoError(t, run(ctx, []string{"migrate", "-database-url", url, "-schema", schema}, &out, &errb))
	require.Contains(t, out.String(), fmt.Sprintf("nothing to do, at version %d", last))
	out.Reset()

	t.Setenv("DATABASE_URL", url)
	require.NoError(t, run(ctx, []string{"migrate", "-schema", schema, "-down", "0"}, &out, &errb))
	require.Contains(t, out.String(), fmt.Sprintf("reverted %v, now at version 0", down))

	require.ErrorContains(t, run(ctx, []string{"migrate", "-schema", "Bad"}, &out, &errb), "invalid schema")
	require.Error(t, run(ctx, []string{"nope"}, &out, &errb))
	require.Error(t, run(ctx, nil, &out, &errb))
	t.Setenv("DATABASE_URL", "")
	require.ErrorContains(t, run(ctx, []string{"migrate"}, &out, &errb), "no database")
}
