package chaos

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/store/postgres"
)

// WorkerConfig configures one worker process.
type WorkerConfig struct {
	DatabaseURL string
	Schema      string
	// WorkerID is the engine's worker id; Proc names this process's files.
	WorkerID, Proc string
	// Dir holds the recorder and log files.
	Dir       string
	Executors int
	Lease     time.Duration
	Heartbeat time.Duration
	Reaper    time.Duration
	Reconcile time.Duration
	Keys      KeySpace
}

// args returns the command-line arguments that ParseWorkerFlags turns back
// into c.
func (c WorkerConfig) args() []string {
	return []string{"-database-url", c.DatabaseURL, "-schema", c.Schema, "-worker-id", c.WorkerID, "-proc", c.Proc,
		"-dir", c.Dir, "-executors", fmt.Sprint(c.Executors), "-lease", c.Lease.String(),
		"-heartbeat", c.Heartbeat.String(), "-reaper", c.Reaper.String(), "-reconcile", c.Reconcile.String(),
		"-acct-keys", fmt.Sprint(c.Keys.Acct), "-api-keys", fmt.Sprint(c.Keys.API), "-bulk-keys", fmt.Sprint(c.Keys.Bulk)}
}

// ParseWorkerFlags parses the arguments of a worker process.
func ParseWorkerFlags(args []string) (WorkerConfig, error) {
	var c WorkerConfig
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.StringVar(&c.DatabaseURL, "database-url", "", "PostgreSQL connection string")
	fs.StringVar(&c.Schema, "schema", "", "schema of the run")
	fs.StringVar(&c.WorkerID, "worker-id", "", "engine worker id")
	fs.StringVar(&c.Proc, "proc", "", "process name (file names)")
	fs.StringVar(&c.Dir, "dir", "", "directory of recorder and log files")
	fs.IntVar(&c.Executors, "executors", 4, "executors")
	fs.DurationVar(&c.Lease, "lease", 8*time.Second, "lease")
	fs.DurationVar(&c.Heartbeat, "heartbeat", time.Second, "heartbeat interval")
	fs.DurationVar(&c.Reaper, "reaper", 500*time.Millisecond, "reaper interval")
	fs.DurationVar(&c.Reconcile, "reconcile", time.Second, "reconcile interval")
	fs.IntVar(&c.Keys.Acct, "acct-keys", DefaultKeySpace.Acct, "K = 1 keys")
	fs.IntVar(&c.Keys.API, "api-keys", DefaultKeySpace.API, "api gate keys")
	fs.IntVar(&c.Keys.Bulk, "bulk-keys", DefaultKeySpace.Bulk, "bulk gate keys")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.DatabaseURL == "" || c.Schema == "" || c.WorkerID == "" || c.Proc == "" || c.Dir == "" {
		return c, fmt.Errorf("worker: -database-url, -schema, -worker-id, -proc and -dir are required")
	}
	return c, nil
}

// logFile is the JSON log of process proc in dir.
func logFile(dir, proc string) string { return filepath.Join(dir, "log-"+proc+".json") }

// RunWorker runs one engine until ctx is done, then stops it gracefully.
// Starting is retried with backoff while the database is unreachable (a
// worker may be restarted while PostgreSQL is down).
func RunWorker(ctx context.Context, c WorkerConfig) error {
	rec, err := OpenRecorder(c.Dir, c.Proc)
	if err != nil {
		return err
	}
	defer rec.Close()
	lf, err := os.OpenFile(logFile(c.Dir, c.Proc), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer lf.Close()
	log := slog.New(slog.NewJSONHandler(lf, &slog.HandlerOptions{Level: slog.LevelInfo})).With("proc", c.Proc)

	pcfg, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return err
	}
	pcfg.MaxConns = int32(c.Executors + 6)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	var st *postgres.Store
	var e *durable.Engine
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 50*time.Millisecond, time.Second, 0
	err = backoff.Retry(func() error {
		if st == nil {
			s, err := postgres.New(ctx, pool, postgres.Options{Schema: c.Schema, History: true})
			if err != nil {
				return err
			}
			st = s
		}
		if e == nil {
			eng, err := durable.New(durable.Config{Store: st, Queues: map[string]int{"default": c.Executors},
				Limits: Limits, RateLimits: RateLimits, WorkerID: c.WorkerID, Lease: c.Lease, HeartbeatInterval: c.Heartbeat,
				PollInterval: 100 * time.Millisecond, ReaperInterval: c.Reaper, ReconcileInterval: c.Reconcile,
				Retention: -1, Logger: log})
			if err != nil {
				return backoff.Permanent(err)
			}
			parent, child := Workflows(rec, c.Keys)
			if err := eng.Register(parent, child); err != nil {
				return backoff.Permanent(err)
			}
			e = eng
		}
		return e.Start(ctx)
	}, backoff.WithContext(b, ctx))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("worker %s: start: %w", c.Proc, err)
	}
	log.Info("chaos worker started")
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Stop must return by its deadline; if it has not a while after, the
	// goroutines go to stderr (out-<proc>.log) before the controller kills
	// the process.
	hung := time.AfterFunc(35*time.Second, func() {
		fmt.Fprintln(os.Stderr, "stop still running 5s past its deadline; goroutines:")
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
	})
	defer hung.Stop()
	if err := e.Stop(stopCtx); err != nil {
		return fmt.Errorf("worker %s: stop: %w", c.Proc, err)
	}
	log.Info("chaos worker stopped", "stale_outcomes", e.StaleOutcomes())
	return nil
}
