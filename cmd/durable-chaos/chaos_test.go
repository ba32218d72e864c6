package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/internal/chaos"
)

// workerEnv marks a re-executed test binary that must run one chaos worker
// instead of the tests.
const workerEnv = "DURABLE_CHAOS_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		os.Exit(worker(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// TestShortChaos is the short chaos run of make test: three worker
// processes (this test binary, re-executed), a few SIGKILLs, one
// PostgreSQL restart, and every check of make chaos. It fails on any
// violation and prints the report either way.
func TestShortChaos(t *testing.T) {
	cfg := chaos.Short
	self, err := os.Executable()
	require.NoError(t, err)
	cfg.WorkerCommand = func(args []string) *exec.Cmd {
		cmd := exec.Command(self, args...)
		cmd.Env = append(os.Environ(), workerEnv+"=1")
		return cmd
	}
	var progress strings.Builder
	cfg.Out = &progress
	if u := os.Getenv("CHAOS_DATABASE_URL"); u != "" {
		cfg.DatabaseURL = u
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := chaos.Run(ctx, cfg)
	require.NoError(t, err, "progress:\n%s", progress.String())
	var out strings.Builder
	rep.Print(&out)
	t.Logf("\n%s", out.String())
	require.True(t, rep.Passed(), "chaos found violations:\n%s\nprogress:\n%s", out.String(), progress.String())
	require.Positive(t, rep.Kills, "workers were killed")
	require.Positive(t, rep.Committed, "work was done")
	if rep.DBRestarts == 0 {
		t.Logf("PostgreSQL was not restarted: %s", rep.Database)
		require.NotEqual(t, "true", os.Getenv("CI"), "CI must run the chaos test with a database restart")
	}
}
