// Command durable-chaos runs the chaos test of godurable: several engine
// processes share one PostgreSQL database under a mixed workload while
// random workers are killed with SIGKILL and restarted, and PostgreSQL itself
// is restarted once; then it checks that every promise held and prints the
// figures. It exits with status 1 when any promise was broken.
//
//	durable-chaos [flags]            run the test (make chaos)
//	durable-chaos worker [flags]     one worker process (started by the test)
//
// Without -database-url it starts a throwaway PostgreSQL cluster of its own
// (initdb and postgres from PATH or /usr/lib/postgresql/*/bin) on a free
// port, so that restarting it disturbs nothing else on the machine.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/godurable/godurable/internal/chaos"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		os.Exit(worker(os.Args[2:]))
	}
	os.Exit(controller(os.Args[1:]))
}

func worker(args []string) int {
	cfg, err := chaos.ParseWorkerFlags(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := chaos.RunWorker(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func controller(args []string) int {
	cfg := chaos.Full
	for _, a := range args {
		if a == "-short" || a == "--short" || a == "-short=true" || a == "--short=true" {
			cfg = chaos.Short
		}
	}
	fs := flag.NewFlagSet("durable-chaos", flag.ExitOnError)
	fs.Bool("short", false, "start from the short run of make test (about 30 s) instead of the full one; later flags still apply")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the chaos phase")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "worker processes alive at once")
	fs.IntVar(&cfg.Executors, "executors", cfg.Executors, "executors per worker")
	fs.DurationVar(&cfg.KillEvery, "kill-every", cfg.KillEvery, "mean time between SIGKILLs")
	fs.BoolVar(&cfg.RestartDB, "restart-db", cfg.RestartDB, "restart PostgreSQL once mid-run (throwaway cluster only)")
	fs.DurationVar(&cfg.DBDown, "db-down", cfg.DBDown, "how long PostgreSQL stays down at its restart")
	fs.StringVar(&cfg.DatabaseURL, "database-url", "", "use this server instead of a throwaway cluster (never restarted)")
	fs.IntVar(&cfg.Instances, "instances", cfg.Instances, "instances inserted before the workers start")
	fs.IntVar(&cfg.InsertBatch, "insert-batch", cfg.InsertBatch, "instances inserted every -insert-every during the chaos phase")
	fs.DurationVar(&cfg.InsertEvery, "insert-every", cfg.InsertEvery, "interval between insert batches")
	fs.DurationVar(&cfg.Lease, "lease", cfg.Lease, "worker lease (must outlast the database restart)")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", cfg.Heartbeat, "worker heartbeat interval")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "how long every instance may take to finish after the chaos phase")
	fs.StringVar(&cfg.Dir, "dir", "", "keep recorder, log and output files here (default: a temporary directory, removed on success)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of the controller's choices (0: random)")
	fs.DurationVar(&cfg.Reconcile, "reconcile", time.Second, "workers' reconciler interval")
	fs.BoolVar(&cfg.NoSignals, "no-signals", false, "send no signals (awaits end by their timeouts)")
	quiet := fs.Bool("quiet", false, "no progress lines")
	_ = fs.Parse(args)
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg.WorkerCommand = func(args []string) *exec.Cmd { return exec.Command(self, append([]string{"worker"}, args...)...) }
	if !*quiet {
		cfg.Out = os.Stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := chaos.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "durable-chaos:", err)
		return 2
	}
	rep.Print(os.Stdout)
	if !rep.Passed() {
		return 1
	}
	return 0
}
