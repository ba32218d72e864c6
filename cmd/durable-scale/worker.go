package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/transitions"
)

// The two workflows of the load: one step of -step each. A rolling deploy
// restarts engines without the second one.
const (
	workflowA = "work"
	workflowB = "work2"
)

// workflows are the load's workflows; done, if not nil, counts the steps
// run.
func workflows(step time.Duration, withB bool, done *atomic.Int64) []durable.Definition {
	mk := func(name string) durable.Definition {
		wf := durable.NewWorkflow[struct{}](name, "run", durable.WorkflowOptions{})
		wf.Step("run", func(ctx steps.Context, s struct{}) (transitions.Transition, error) {
			time.Sleep(step)
			if done != nil {
				done.Add(1)
			}
			return transitions.Done(true), nil
		})
		return wf
	}
	defs := []durable.Definition{mk(workflowA)}
	if withB {
		defs = append(defs, mk(workflowB))
	}
	return defs
}

// workerArgs are the command-line arguments of one engine process.
func workerArgs(url, schema, id string, executors int, step time.Duration, withB bool) []string {
	return []string{"worker", "-database-url", url, "-schema", schema, "-worker-id", id,
		"-executors", fmt.Sprint(executors), "-step", step.String(), fmt.Sprintf("-with-b=%t", withB)}
}

// progressEvery is how often a worker run with -progress prints its count
// of steps run ("progress N" on stdout): how a drain (see compare.go)
// follows the fleet without reading the table.
const progressEvery = 50 * time.Millisecond

// runWorker runs one engine with the library's defaults until SIGTERM, its
// logs (WARN and above) on stderr.
func runWorker(args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	url := fs.String("database-url", "", "")
	schema := fs.String("schema", "", "")
	id := fs.String("worker-id", "", "")
	executors := fs.Int("executors", 10, "")
	step := fs.Duration("step", 10*time.Millisecond, "")
	withB := fs.Bool("with-b", true, "")
	progress := fs.Bool("progress", false, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	cfg, err := pgxpool.ParseConfig(*url)
	if err != nil {
		return err
	}
	// The engine's id names its connections in pg_stat_activity and the
	// server's log.
	cfg.ConnConfig.RuntimeParams["application_name"] = *id
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: *schema})
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	eng, err := durable.New(durable.Config{Store: st, WorkerID: *id, Logger: log,
		Queues: map[string]int{durable.DefaultQueue: *executors}})
	if err != nil {
		return err
	}
	var done *atomic.Int64
	if *progress {
		done = new(atomic.Int64)
		go func() {
			for range time.Tick(progressEvery) {
				fmt.Printf("progress %d\n", done.Load())
			}
		}()
	}
	if err := eng.Register(workflows(*step, *withB, done)...); err != nil {
		return err
	}
	if err := eng.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return eng.Stop(sctx)
}
