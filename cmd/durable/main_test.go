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
