// Command durable-scale holds a fleet of engine processes under steady load
// on a table of production size, and reports per minute what an operator
// watches: throughput, insert→start latency, table and index sizes, dead
// tuples, locks held by one transaction, lock waits, statement times and
// every error the engines logged.
//
//	go run ./cmd/durable-scale [-rows 10000000] [-duration 30m] [-engines 8]
//
// By default it starts a throwaway cluster (initdb, Debian's defaults,
// autovacuum on, pg_stat_statements loaded) and removes it at the end;
// -database-url runs on an existing server instead, in a new schema.
//
// The data, before the load starts:
//   - -rows instances, mostly terminal (done) rows spread over the retention
//     period (7 days), the oldest crossing it during the run at -retire rows
//     a second: about the rows the saturated fleet finishes a second on this
//     machine, so that retention deletes about as fast as rows are done and
//     the table keeps its size, as a table in production does;
//   - -backlogged K = 1 keys (acct:0 … acct:N-1) with a backlog past
//     admission.ReadyCap, 70 rows each;
//   - -gate-keys keys of the gate "api" (limit -gate-limit).
//
// During the run -rate instances a second are inserted over -keys K = 1
// keys, the gate keys and no key, of two workflows; every engine runs both
// (steps of -step), reconciles every 30 s (the default), and keeps 7 days.
// Half a report interval past a third of the run the gate's limit changes
// (between two report lines); at half, half of the engines restart without
// the second workflow for -deploy (a rolling deploy), then with it again.
//
// Several keys per row and per-key limits, off by default: with -several, that
// share of the gate's rows also holds a K = 1 key of the load's (one
// without a backlog), a row of several keys; with -key-limits N, a per-key
// limit of twice the gate's is stored for api:0 … api:N-1 before the load
// (the keys with rows come first), and half a report interval after the
// rolling deploy one of them is set again, as `durable limits set` does,
// timed.
//
// Besides the report lines, the log directory gets activity.tsv (what the
// server's backends wait for, every 250 ms) and, from a throwaway cluster,
// server.log (lock waits, statements over a second, checkpoints,
// autovacuums); the summary names the seconds in which the fleet started
// fewer than half its median steps, with what the backends waited for then.
//
// The backlog lasts the whole run (-sustain, on by default): every 2 s the
// rows of the backlogged keys done since the last look are counted and as
// many inserted over those keys, round-robin, less the offered load's rows
// over them (its K = 1 keys include them), so that each key keeps its
// depth past the ready cap and the fleet is saturated by the same work
// from the first minute to the last. These rows are counted apart from the
// offered load ("backlog ins/s" against "ins/s"); the depth is printed
// before and after the soak. With -sustain=false the backlog drains during
// the run (at about minute 23 at the defaults), and the fleet serves only
// the offered load from then on.
//
// A line per interval gives the rows done a second, and the p50 and p99 of
// the insert→start latency of the rows inserted during the load; "p99
// fresh" is that p99 without the rows of the backlogged keys. At the end a
// line compares the last 5 intervals against intervals 5–10: throughput
// (done/s), p99 and p99 fresh. The steady-state target (throughput ≥
// 0.95×, p99 ≤ 1.2×) is read on throughput and p99 fresh: a backlogged
// key's row waits for its own key's backlog by design, one fair round per
// row ahead of it, a time the backlog's depth sets, not the fleet's speed.
// Without -sustain the two windows hold different work (a backlog being
// drained, then the offered load alone), and the comparison measures no
// slowdown.
//
// Around the limit change (from 5 s before it to 10 s after it) the
// counters of the first five gate keys that have any are locked FOR SHARE
// in turn every 10 ms: a note gives the longest such wait before the change
// and from it on, the delay a gate step's claim or credit would meet (the
// change holds every counter of the name until it commits; see
// counterProbe). Another compares the longest pause between two gate step
// starts in the 15 s before and from the change.
//
// With -compare it runs drains instead of the soak: -drain-rows instances,
// inserted before -engines engine processes start, run to the last, the
// rate taken between 10 % and 90 % of them done. The cases are plain
// (keyless) rows and rows each of its own K = 1 key, on an empty table and
// on one holding -rows terminal rows (vacuumed and analyzed, as a table of
// that size is in production), and plain rows behind -absent-rows rows no
// engine runs, half of a workflow none registers and half of the next
// version of the one they run (a rolling deploy's backlog at the head of
// the queue). Each case runs -rounds times, the cases alternating within a
// round; it prints every drain's rate and the ratios of the medians.
//
//	go run ./cmd/durable-scale -compare [-rows 10000000] [-drain-rows 100000] [-rounds 2]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

type options struct {
	databaseURL string
	rows        int
	keys        int
	backlogged  int
	gateKeys    int
	gateLimit   int
	sustain     bool
	engines     int
	executors   int
	several     float64
	keyLimits   int
	rate        int
	retire      int
	step        time.Duration
	duration    time.Duration
	deploy      time.Duration
	every       time.Duration
	dir         string

	compare      bool
	drainRows    int
	absentRows   int
	rounds       int
	drainTimeout time.Duration
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		if err := runWorker(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "durable-scale worker:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.StringVar(&o.databaseURL, "database-url", "", "run on this server, in a new schema (default: a throwaway cluster)")
	flag.IntVar(&o.rows, "rows", 10_000_000, "instances in the table before the load starts, most of them terminal")
	flag.IntVar(&o.keys, "keys", 100_000, "distinct K = 1 keys the load inserts over")
	flag.IntVar(&o.backlogged, "backlogged", 20_000, "K = 1 keys with a backlog past the ready cap at the start")
	flag.BoolVar(&o.sustain, "sustain", true, "top the backlogged keys up as they drain, so that their backlog lasts the whole run")
	flag.IntVar(&o.gateKeys, "gate-keys", 1_000, "keys of the gate \"api\"")
	flag.IntVar(&o.gateLimit, "gate-limit", 10, "the gate's limit (it changes to limit - 2 at a third of the run)")
	flag.Float64Var(&o.several, "several", 0, "the share of the gate's rows that also hold a K = 1 key of the load's (rows of several keys)")
	flag.IntVar(&o.keyLimits, "key-limits", 0, "per-key limits stored for api:0 … api:N-1 (twice the gate's limit), the first -gate-keys of them keys with rows; one is set again after the rolling deploy")
	flag.IntVar(&o.engines, "engines", 8, "engine processes")
	flag.IntVar(&o.executors, "executors", 10, "executors per engine (the library's default)")
	flag.IntVar(&o.rate, "rate", 1_000, "instances inserted per second during the run")
	flag.IntVar(&o.retire, "retire", 2_000, "terminal rows a second that age past the retention during the run (about the rows the fleet finishes a second, so that the table keeps its size)")
	flag.DurationVar(&o.step, "step", 10*time.Millisecond, "how long each step takes")
	flag.DurationVar(&o.duration, "duration", 30*time.Minute, "how long the load holds")
	flag.DurationVar(&o.deploy, "deploy", 2*time.Minute, "how long half the engines lack the second workflow")
	flag.DurationVar(&o.every, "every", time.Minute, "report interval")
	flag.StringVar(&o.dir, "dir", "", "directory for the engines' logs (default: a temporary one, kept)")
	flag.BoolVar(&o.compare, "compare", false, "run the drains instead of the soak (see the package doc)")
	flag.IntVar(&o.drainRows, "drain-rows", 100_000, "-compare: instances a drain runs")
	flag.IntVar(&o.absentRows, "absent-rows", 200_000, "-compare: rows no engine runs (another workflow, a newer version), ahead of a drain's")
	flag.IntVar(&o.rounds, "rounds", 2, "-compare: how many times each drain runs")
	flag.DurationVar(&o.drainTimeout, "drain-timeout", 10*time.Minute, "-compare: how long a drain may take")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := run
	if o.compare {
		run = compare
	}
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "durable-scale:", err)
		os.Exit(1)
	}
}
