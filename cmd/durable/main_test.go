package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store/postgres"
	"github.com/stretchr/testify/require"
)

// binary is the durable CLI built for the tests that run it as a user would.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "durable-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "durable")
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	build := exec.Command(gobin, "build", "-o", binary, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the durable CLI: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := pgtest.Run(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

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

// TestMigratePlan: durable migrate says, before applying, how each pending
// migration runs and what it locks; -plan only says it.
func TestMigratePlan(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	url := pgtest.URL(t)
	schema := pgtest.SchemaOf(pool)
	var out, errb bytes.Buffer
	args := []string{"migrate", "-database-url", url, "-schema", schema}

	require.NoError(t, run(ctx, append(args, "-plan"), &out, &errb))
	require.Contains(t, out.String(), "migration 1 (init), in the run's transaction (a new schema")
	require.NotContains(t, out.String(), "SHARE", "a new schema's tables are new")
	v, err := postgres.AppliedVersions(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, v, "-plan applies nothing")

	_, err = postgres.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	_, err = postgres.MigrateDown(ctx, pool, schema, 16)
	require.NoError(t, err)
	out.Reset()
	require.NoError(t, run(ctx, args, &out, &errb))
	require.Contains(t, out.String(), "migration 17 (pick_by_workflow), without a transaction, each lock held for its statement only:\n"+
		"  the table of index instances_pick_free_workflow: SHARE UPDATE EXCLUSIVE while the index is dropped (reads and writes go on)\n"+
		"  instances: SHARE UPDATE EXCLUSIVE while index instances_pick_free_workflow builds (reads and writes go on)\n")
	require.Contains(t, out.String(), "applied [17")

	_, err = postgres.MigrateDown(ctx, pool, schema, 10)
	require.NoError(t, err)
	out.Reset()
	require.NoError(t, run(ctx, append(args, "-plan"), &out, &errb))
	require.Contains(t, out.String(), "migration 11 (key_waiting), in the run's transaction, holding its locks until it commits:\n"+
		"  instances: SHARE while index instances_key_blocked builds (writes wait)\n")
	require.NotContains(t, out.String(), "applied")
}
