// Command durable-bench measures godurable on PostgreSQL: step throughput
// of plain, keyed and gated workflows, the cost of a saturated key's backlog
// and of a large ready backlog, three-step workflows with signals, batch
// inserts, the latency from insert to step start on an idle engine, how
// fully a fleet of engines sharing one gate keeps it busy, and rows that
// hold two keys at once against rows of one.
//
//	go run ./cmd/durable-bench [-scenarios 1,2,9] [-n 1] [-engines 1] [-executors 200]
//	                           [-mode burn|continuous] [-json] [-pick-rows 1000000] [-insert-batch 1000]
//
// It connects to DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable), creates a
// database of its own, runs every scenario in a fresh schema of it, and drops
// the database at the end.
//
// Burn-down mode inserts a scenario's rows first, then starts the engines
// and times until all counted rows are terminal, as recorded by the
// database (the updated_at of the last of them against the database clock
// at start). Continuous mode starts the engines first and inserts the
// counted rows at -rate per second. Step bodies record, in memory, when each
// instance's first step started (for the insert→start latency) and how many
// steps of each key ran at once (the check: never more than K; a step of
// several keys counts under each of them).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/transitions"
)

const defaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

type options struct {
	url        string
	scenarios  []int
	scale      float64
	engines    int
	executors  int
	mode       string
	rate       float64
	jsonOut    bool
	pickRows   int
	cpuProfile string
	stmts      bool
	// serverProfile prints each measured run's statements from
	// pg_stat_statements (see serverProfile).
	serverProfile bool
	waitEvery     time.Duration
	keep          bool
	rounds        int
	// insertBatch is scenario 8's rows per InsertMany call.
	insertBatch int
	// s11Step is how long each step of scenario 11's comparison sleeps.
	s11Step time.Duration
	// s11Limit is the limit of scenario 11's api gate keys.
	s11Limit int
	// timeline is the interval of each measured run's timeline (0: none):
	// how many step bodies ran at once, on average, in each interval from
	// the engines' start.
	timeline time.Duration
	// holdSnapshot keeps a transaction open, its snapshot taken, through
	// each measured run, as a forgotten session or a long report would.
	holdSnapshot bool
}

func main() {
	var o options
	var scen string
	flag.StringVar(&o.url, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL server (default $DATABASE_URL, else "+defaultURL+"); a database is created on it and dropped at exit")
	flag.StringVar(&scen, "scenarios", "1,2,3,4,5,6,7,8,9,10,11", "scenarios to run, comma-separated")
	flag.Float64Var(&o.scale, "n", 1, "scale every scenario's instance count by this factor")
	flag.IntVar(&o.engines, "engines", 1, "engines (workers sharing the database) run in this process")
	flag.IntVar(&o.executors, "executors", 200, "executors per engine (steps one engine runs at once)")
	flag.StringVar(&o.mode, "mode", "burn", "burn: insert all rows, then start the engines; continuous: insert at -rate while the engines run")
	flag.Float64Var(&o.rate, "rate", 5000, "continuous mode: instances inserted per second")
	flag.BoolVar(&o.jsonOut, "json", false, "print the results as JSON lines instead of a table")
	flag.IntVar(&o.pickRows, "pick-rows", 200_000, "scenario 6: size of the large ready backlog (the issue's figure is 1,000,000)")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the bench process while each scenario is measured to this path with -sN.prof appended")
	flag.BoolVar(&o.stmts, "stmts", false, "print round trips and statement times per scenario")
	flag.BoolVar(&o.serverProfile, "server-profile", false, "print, for every measured run, its CPU per step, how its rows reached their steps (claimed, handed off, reserved; blocked on the way) and the server's time and WAL per statement, named, from pg_stat_statements (the server must load it; its planning is counted with pg_stat_statements.track_planning on)")
	flag.DurationVar(&o.waitEvery, "sample", 20*time.Millisecond, "how often pg_stat_activity is sampled for wait events (0: never)")
	flag.BoolVar(&o.keep, "keep", false, "keep the bench database at exit")
	flag.IntVar(&o.rounds, "rounds", 3, "scenarios 4, 5, 6 and 11: alternating rounds of the two runs they compare (the ratio is of medians; scenario 11 adds a reference run to each round); scenario 10: rounds of every cell")
	flag.IntVar(&o.insertBatch, "insert-batch", 1000, "scenario 8: rows per InsertMany call (with -n 2 and 20000, five calls)")
	flag.DurationVar(&o.s11Step, "s11-step", s11IssueStep, "scenario 11: how long each step of its comparison and reference takes (the issue's figure is 1 ms; the hot-account pair keeps 1 ms)")
	flag.IntVar(&o.s11Limit, "s11-limit", s11IssueLimit, "scenario 11: the limit of each of its 20 api gate keys in its comparison and reference (the issue's figure is 10, which the 200 executors fill; 1000 never fills: rows whose gate has room)")
	flag.DurationVar(&o.timeline, "timeline", 0, "print, for every measured run (scenarios 8 and 9 have none), how many step bodies of the \"work\" workflow ran at once, on average, in each interval of this length from the engines' start (sampled every 5 ms; 0: none)")
	flag.BoolVar(&o.holdSnapshot, "hold-snapshot", false, "keep a REPEATABLE READ transaction open, its snapshot taken, from just before each measured run's engines start to its end (scenarios 8 and 9 have no such run), as a session left idle in a transaction or a long report would (README, Operating it)")
	flag.Parse()
	if o.s11Step <= 0 {
		fmt.Fprintln(os.Stderr, "durable-bench: -s11-step must be positive")
		os.Exit(2)
	}
	if o.s11Limit < 1 {
		fmt.Fprintln(os.Stderr, "durable-bench: -s11-limit must be 1 or more")
		os.Exit(2)
	}
	if o.insertBatch < 1 {
		fmt.Fprintln(os.Stderr, "durable-bench: -insert-batch must be 1 or more")
		os.Exit(2)
	}
	if o.url == "" {
		o.url = defaultURL
	}
	for _, f := range strings.Split(scen, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > len(allScenarios) {
			fmt.Fprintf(os.Stderr, "durable-bench: bad scenario %q (1..%d)\n", f, len(allScenarios))
			os.Exit(2)
		}
		o.scenarios = append(o.scenarios, n)
	}
	if o.mode != "burn" && o.mode != "continuous" {
		fmt.Fprintln(os.Stderr, "durable-bench: -mode is burn or continuous")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "durable-bench:", err)
		os.Exit(1)
	}
}

// bench is one run: the bench database and what every scenario shares.
type bench struct {
	o      options
	w      io.Writer
	dbURL  string
	dbName string
	tracer *stmtTracer
	log    *slog.Logger
	obs    *observer
	// profile is set with -server-profile.
	profile *serverProfile
}

func run(ctx context.Context, o options, w io.Writer) error {
	admin, err := pgx.Connect(ctx, o.url)
	if err != nil {
		return fmt.Errorf("connect %s: %w", redact(o.url), err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	var b [4]byte
	_, _ = rand.Read(b[:])
	dbName := "godurable_bench_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{dbName}.Sanitize()); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	if !o.keep {
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := admin.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{dbName}.Sanitize()+" WITH (FORCE)"); err != nil {
				fmt.Fprintln(os.Stderr, "durable-bench: drop database:", err)
			}
		}()
	}
	bn := &bench{o: o, w: w, dbName: dbName, tracer: newStmtTracer(),
		log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
	bn.dbURL = withDatabase(o.url, dbName)
	bn.obs = newObserver(bn.dbURL, dbName, o.waitEvery)
	bn.obs.profile = o.cpuProfile
	if o.serverProfile {
		bn.profile = &serverProfile{url: bn.dbURL, top: 12}
		if err := bn.profile.check(ctx); err != nil {
			return err
		}
	}
	if !o.jsonOut {
		bn.header(ctx, admin)
	}
	var results []*result
	for _, id := range o.scenarios {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sc := allScenarios[id-1]
		bn.obs.scen, bn.obs.part = id, 0
		r, err := sc.run(ctx, bn)
		if err != nil {
			return fmt.Errorf("scenario %d (%s): %w", id, sc.name, err)
		}
		r.ID = id
		if r.Name == "" { // a scenario whose shape follows its flags names itself
			r.Name = sc.name
		}
		results = append(results, r)
		bn.judge(r)
		bn.printLine(r)
		runtime.GC()
	}
	if !o.jsonOut {
		bn.summary(results)
	}
	return nil
}

// withDatabase returns url with its database replaced.
func withDatabase(url, db string) string {
	if i := strings.Index(url, "://"); i >= 0 {
		rest := url[i+3:]
		q := ""
		if j := strings.IndexByte(rest, '?'); j >= 0 {
			rest, q = rest[:j], rest[j:]
		}
		if j := strings.IndexByte(rest, '/'); j >= 0 {
			rest = rest[:j]
		}
		return url[:i+3] + rest + "/" + db + q
	}
	return url + " dbname=" + db
}

func redact(url string) string {
	if i := strings.Index(url, "://"); i >= 0 {
		if j := strings.IndexByte(url[i+3:], '@'); j >= 0 {
			if k := strings.IndexByte(url[i+3:i+3+j], ':'); k >= 0 {
				return url[:i+3+k] + ":***" + url[i+3+j:]
			}
		}
	}
	return url
}

func (b *bench) header(ctx context.Context, admin *pgx.Conn) {
	var version string
	_ = admin.QueryRow(ctx, "SHOW server_version").Scan(&version)
	settings := []string{}
	for _, s := range []string{"shared_buffers", "synchronous_commit", "fsync", "wal_level", "max_connections"} {
		var v string
		if err := admin.QueryRow(ctx, "SHOW "+s).Scan(&v); err == nil {
			settings = append(settings, s+"="+v)
		}
	}
	fmt.Fprintf(b.w, "durable-bench: PostgreSQL %s (%s), %d CPUs, Go %s, mode %s, engines %d × %d executors, scale %g\n",
		version, strings.Join(settings, " "), runtime.NumCPU(), runtime.Version(), b.o.mode, b.o.engines, b.o.executors, b.o.scale)
	fmt.Fprintln(b.w, "(figures are noisy on a shared machine: compare scenarios within one run)")
}

// result is one scenario's measurement.
type result struct {
	ID        int           `json:"id"`
	Name      string        `json:"name"`
	N         int           `json:"instances"`
	Steps     int64         `json:"steps"`
	Elapsed   time.Duration `json:"elapsed_ns"`
	Rate      float64       `json:"steps_per_s"`
	Unit      string        `json:"unit"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	K         int           `json:"k,omitempty"`
	MaxPerKey int           `json:"max_per_key,omitempty"`
	Failed    int           `json:"failed"`
	Ratio     float64       `json:"ratio,omitempty"`
	Util      float64       `json:"utilisation,omitempty"` // scenario 10: ideal time over wall time
	Note      string        `json:"note,omitempty"`
	Target    string        `json:"target,omitempty"`
	Met       *bool         `json:"met,omitempty"`
	Obs       observation   `json:"observed"`
	// KeyMax is, for rows of several keys, the check per key name (K and
	// MaxPerKey check the rows of one key only).
	KeyMax []keyMax `json:"max_per_key_name,omitempty"`
}

// keyMax is the most steps one key of a name ran at once, and its K.
type keyMax struct {
	Name string `json:"name"`
	Max  int    `json:"max"`
	K    int    `json:"k"`
}

func (r *result) check() string {
	switch {
	case len(r.KeyMax) > 0:
		verdict, parts := "ok", make([]string, len(r.KeyMax))
		for i, m := range r.KeyMax {
			parts[i] = fmt.Sprintf("%s %d ≤ K=%d", m.Name, m.Max, m.K)
			if m.Max > m.K {
				verdict, parts[i] = "FAIL", fmt.Sprintf("%s %d > K=%d", m.Name, m.Max, m.K)
			}
		}
		if r.K > 0 && r.MaxPerKey > r.K {
			verdict = "FAIL"
			parts = append(parts, fmt.Sprintf("one-key rows %d > K=%d", r.MaxPerKey, r.K))
		}
		return verdict + " max/key " + strings.Join(parts, ", ")
	case r.K > 0 && r.MaxPerKey > r.K:
		return fmt.Sprintf("FAIL max/key %d > K=%d", r.MaxPerKey, r.K)
	case r.K > 0:
		return fmt.Sprintf("ok max/key %d ≤ K=%d", r.MaxPerKey, r.K)
	case r.Failed > 0:
		return fmt.Sprintf("FAIL %d failed", r.Failed)
	default:
		return "ok"
	}
}

// The shape of scenario 11 that its target is set for: gates of 10 and
// steps of 1 ms. Other shapes (-s11-limit, -s11-step) have no target.
const (
	s11IssueLimit = 10
	s11IssueStep  = time.Millisecond
)

// judge fills the target and whether it was met.
func (b *bench) judge(r *result) {
	set := func(target string, ok bool) { r.Target, r.Met = target, &ok }
	switch r.ID {
	case 1:
		set("≥ 18,000 steps/s", r.Rate >= 18000)
	case 2:
		set("≥ 9,000 steps/s", r.Rate >= 9000)
	case 3:
		set("≥ 5,000 steps/s", r.Rate >= 5000)
	case 4:
		set("ratio ≥ 0.8 (to scenario 1's work)", r.Ratio >= 0.8)
	case 5, 6:
		set("ratio ≥ 0.8", r.Ratio >= 0.8)
	case 11:
		if b.o.s11Limit == s11IssueLimit && b.o.s11Step == s11IssueStep {
			set("ratio ≥ 0.8 (to scenario 2's work)", r.Ratio >= 0.8)
		}
	case 9:
		set("p50 ≤ 5 ms", r.P50 <= 5*time.Millisecond)
	case 10:
		set("utilisation ≥ 0.9 (lowest cell median)", r.Util >= 0.9)
	}
}

func (b *bench) printLine(r *result) {
	if b.o.jsonOut {
		_ = json.NewEncoder(b.w).Encode(r)
		return
	}
	met := ""
	if r.Met != nil {
		met = map[bool]string{true: "MET", false: "NOT MET"}[*r.Met]
	}
	ratio := ""
	if r.Ratio > 0 {
		ratio = fmt.Sprintf(" ratio %.2f", r.Ratio)
	}
	figure := fmt.Sprintf("%9.0f %-7s", r.Rate, r.Unit)
	if r.Util > 0 {
		figure = fmt.Sprintf("%9.2f %-7s", r.Util, "util")
	}
	fmt.Fprintf(b.w, "[%d] %-34s %s p50 %7s p99 %7s  %s%s  %s %s\n", r.ID, r.Name, figure,
		fmtDur(r.P50), fmtDur(r.P99), r.check(), ratio, r.Target, met)
	o := r.Obs
	fmt.Fprintf(b.w, "    n=%d steps=%d in %s; %s over %.2fs; heap max %.0f MB\n",
		r.N, r.Steps, r.Elapsed.Round(time.Millisecond), r.cpuPerStep(), o.Wall.Seconds(), o.HeapMaxMB)
	if len(o.Waits) > 0 {
		fmt.Fprintf(b.w, "    backends: %s\n", o.topWaits(6))
	}
	if r.Note != "" {
		fmt.Fprintf(b.w, "    %s\n", r.Note)
	}
	if b.o.stmts {
		b.tracer.report(b.w, r.Steps)
	}
}

// cpuPerStep is what a step of r cost the bench process and the server,
// and how busy the machine was.
func (r *result) cpuPerStep() string {
	perStep := func(d time.Duration) float64 { return float64(d) / 1e3 / float64(max(r.Steps, 1)) }
	return fmt.Sprintf("cpu/step: bench %.0fµs + pg %.0fµs; machine %.0f%% busy",
		perStep(r.Obs.BenchCPU), perStep(r.Obs.PGCPU), r.Obs.MachineBusy*100)
}

func (b *bench) summary(rs []*result) {
	fmt.Fprintln(b.w)
	fmt.Fprintln(b.w, "| # | scenario | throughput | p50 start | p99 start | check | target | met |")
	fmt.Fprintln(b.w, "|---|---|---:|---:|---:|---|---|---|")
	for _, r := range rs {
		met := ""
		if r.Met != nil {
			met = map[bool]string{true: "yes", false: "**no**"}[*r.Met]
		}
		tp := fmt.Sprintf("%.0f %s", r.Rate, r.Unit)
		if r.Ratio > 0 {
			tp += fmt.Sprintf(" (ratio %.2f)", r.Ratio)
		}
		if r.Util > 0 {
			tp = fmt.Sprintf("utilisation %.2f", r.Util)
		}
		fmt.Fprintf(b.w, "| %d | %s | %s | %s | %s | %s | %s | %s |\n", r.ID, r.Name, tp, fmtDur(r.P50), fmtDur(r.P99),
			r.check(), r.Target, met)
	}
}

func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	default:
		return d.Round(time.Second).String()
	}
}

// ---- one scenario's environment ----

// env is a fresh schema, the engines working it and a client engine (never
// started) that inserts and signals, as an application would.
type env struct {
	b       *bench
	schema  string
	pools   []*pgxpool.Pool
	client  *durable.Engine
	engines []*durable.Engine
	rec     *recorder
	signals chan sigReq
	sigWG   sync.WaitGroup
	t0      time.Time // engines started (local clock)
	t0DB    time.Time // engines started (database clock)
}

type sigReq struct {
	id, name string
}

// state is every benchmark workflow's state.
type state struct {
	I int           `json:"i"`           // counted instance index, -1: not counted
	K int           `json:"k"`           // key index for the concurrency recorder, -1: none
	D time.Duration `json:"d,omitempty"` // simulated work per step
	// M: the row holds several keys; the recorder counts its step under
	// each of them (steps.Context.Keys) instead of under K.
	M bool `json:"m,omitempty"`
}

func (b *bench) newEnv(ctx context.Context, name string, counted, keys int, limits []gate.Limit) (*env, error) {
	e := &env{b: b, schema: "bench_" + name, rec: newRecorder(counted, keys), signals: make(chan sigReq, 4096)}
	admin, err := pgx.Connect(ctx, b.dbURL)
	if err != nil {
		return nil, err
	}
	defer func() { _ = admin.Close(context.Background()) }()
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{e.schema}.Sanitize()+" CASCADE"); err != nil {
		return nil, err
	}
	newPool := func(conns int32) (*pgxpool.Pool, error) {
		cfg, err := pgxpool.ParseConfig(b.dbURL)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = conns
		cfg.ConnConfig.Tracer = b.tracer
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			e.pools = append(e.pools, p)
		}
		return p, err
	}
	clientPool, err := newPool(16)
	if err != nil {
		return nil, err
	}
	if _, err := postgres.Migrate(ctx, clientPool, e.schema); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	mk := func(pool *pgxpool.Pool, id string) (*durable.Engine, error) {
		st, err := postgres.New(ctx, pool, postgres.Options{Schema: e.schema})
		if err != nil {
			return nil, err
		}
		eng, err := durable.New(durable.Config{Store: st, Queues: map[string]int{durable.DefaultQueue: b.o.executors},
			Limits: limits, WorkerID: id, Logger: b.log})
		if err != nil {
			return nil, err
		}
		return eng, e.register(eng)
	}
	if e.client, err = mk(clientPool, "bench-client"); err != nil {
		return nil, err
	}
	// As a deployment would have them before inserting: the workers' limits.
	if _, err := e.client.Store().SyncLimits(ctx, limits); err != nil {
		return nil, fmt.Errorf("sync limits: %w", err)
	}
	for i := 0; i < b.o.engines; i++ {
		pool, err := newPool(10)
		if err != nil {
			return nil, err
		}
		eng, err := mk(pool, fmt.Sprintf("bench-%s-%d", name, i))
		if err != nil {
			return nil, err
		}
		e.engines = append(e.engines, eng)
	}
	for i := 0; i < 16; i++ {
		e.sigWG.Add(1)
		go e.signaller(ctx)
	}
	return e, nil
}

func (e *env) register(eng *durable.Engine) error {
	rec := e.rec
	noop := durable.NewWorkflow[state]("noop", "run", durable.WorkflowOptions{}).
		Step("run", func(_ steps.Context, s state) (transitions.Transition, error) {
			rec.started(s.I)
			rec.finished.Add(1)
			return transitions.Done(nil), nil
		})
	work := durable.NewWorkflow[state]("work", "run", durable.WorkflowOptions{}).
		Step("run", func(ctx steps.Context, s state) (transitions.Transition, error) {
			rec.started(s.I)
			var keys []string
			if s.M {
				keys = ctx.Keys()
				rec.enterKeys(keys)
			}
			rec.enter(s.K)
			rec.running.Add(1)
			if s.D > 0 {
				time.Sleep(s.D)
			}
			rec.running.Add(-1)
			rec.leave(s.K)
			rec.leaveKeys(keys)
			if s.I >= 0 {
				rec.finished.Add(1)
			}
			return transitions.Done(nil), nil
		})
	sig := func(next, signal string) steps.Func[state] {
		return func(ctx steps.Context, s state) (transitions.Transition, error) {
			rec.started(s.I)
			e.signals <- sigReq{id: ctx.InstanceID(), name: signal}
			return transitions.Await(signal, next, s), nil
		}
	}
	three := durable.NewWorkflow[state]("three", "a", durable.WorkflowOptions{}).
		Step("a", sig("b", "s1")).
		Step("b", sig("c", "s2")).
		Step("c", func(_ steps.Context, s state) (transitions.Transition, error) {
			rec.started(s.I)
			rec.finished.Add(1)
			return transitions.Done(nil), nil
		})
	return eng.Register(noop, work, three)
}

// signaller sends the signals the "three" workflow's steps ask for, as an
// outside system would (possibly before the await is committed: the inbox
// keeps it).
func (e *env) signaller(ctx context.Context) {
	defer e.sigWG.Done()
	for r := range e.signals {
		for {
			err := e.client.Signal(ctx, r.id, r.name, nil, durable.SignalOptions{})
			if err == nil || ctx.Err() != nil {
				break
			}
			e.b.log.Error("signal", "err", err)
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// insertGen inserts instances gen(from) .. gen(to-1) through the client in
// batches, recording the insert times of counted instances (state.I >= 0).
func (e *env) insertGen(ctx context.Context, from, to int, gen func(int) durable.InsertRequest, batch int) error {
	reqs := make([]durable.InsertRequest, 0, min(batch, max(to-from, 0)))
	for lo := from; lo < to; lo += batch {
		hi := min(lo+batch, to)
		reqs = reqs[:0]
		for i := lo; i < hi; i++ {
			reqs = append(reqs, gen(i))
		}
		at := time.Now()
		if _, err := e.client.InsertMany(ctx, reqs); err != nil {
			return err
		}
		for _, r := range reqs {
			if s, ok := r.State.(state); ok && s.I >= 0 {
				e.rec.inserted(s.I, s.I+1, at)
			}
		}
	}
	return nil
}

func (e *env) dbNow(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := e.pools[0].QueryRow(ctx, "SELECT clock_timestamp()").Scan(&t)
	return t, err
}

func (e *env) start(ctx context.Context) error {
	var err error
	if e.t0DB, err = e.dbNow(ctx); err != nil {
		return err
	}
	e.t0 = time.Now()
	for _, eng := range e.engines {
		if err := eng.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// waitTerminal waits until n instances of workflow are terminal in the
// database and returns when the n-th became terminal (database clock) and
// how many of them failed.
func (e *env) waitTerminal(ctx context.Context, workflow string, n int, timeout time.Duration) (time.Time, int, error) {
	deadline := time.Now().Add(timeout)
	tbl := pgx.Identifier{e.schema, "instances"}.Sanitize()
	for {
		// The step bodies tell when it is worth asking the database.
		if e.rec.finished.Load() >= int64(n) || workflow == "" {
			var count int
			if err := e.pools[0].QueryRow(ctx, `SELECT count(*) FROM `+tbl+`
WHERE status IN ('done', 'failed', 'canceled') AND workflow = $1`, workflow).Scan(&count); err != nil {
				return time.Time{}, 0, err
			}
			if count >= n {
				var at time.Time
				var failed int
				err := e.pools[0].QueryRow(ctx, `
SELECT (SELECT updated_at FROM `+tbl+` WHERE status IN ('done', 'failed', 'canceled') AND workflow = $1
        ORDER BY updated_at OFFSET $2 - 1 LIMIT 1),
       (SELECT count(*) FROM `+tbl+` WHERE status = 'failed' AND workflow = $1)`, workflow, n).Scan(&at, &failed)
				return at, failed, err
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, 0, fmt.Errorf("timeout: %d of %d %s instances finished their last step after %s",
				e.rec.finished.Load(), n, workflow, timeout)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, 0, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func (e *env) close(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, eng := range e.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := eng.Stop(sctx); err != nil && !errors.Is(err, context.Canceled) {
				e.b.log.Error("stop", "err", err)
			}
		}()
	}
	wg.Wait()
	close(e.signals)
	e.sigWG.Wait()
	for _, p := range e.pools {
		p.Close()
	}
	admin, err := pgx.Connect(context.Background(), e.b.dbURL)
	if err == nil {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{e.schema}.Sanitize()+" CASCADE")
		_ = admin.Close(context.Background())
	}
}
