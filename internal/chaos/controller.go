package chaos

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/pgcluster"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
)

// DefaultURL is the shared server used when no throwaway cluster can be
// started and Config.DatabaseURL is empty.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// Config sizes a chaos run. Zero fields take the defaults of Full.
type Config struct {
	// Duration is the chaos phase: kills, inserts and the database restart
	// happen in it; then every worker is brought up and the run drains.
	Duration time.Duration
	// Workers is the number of worker processes alive at once, each with
	// Executors executors.
	Workers, Executors int
	// KillEvery is the mean time between two SIGKILLs (each ±50%).
	KillEvery time.Duration
	// RestartDB restarts PostgreSQL once, in the middle of the chaos phase,
	// keeping it down for DBDown. It needs a throwaway cluster.
	RestartDB bool
	DBDown    time.Duration
	// DatabaseURL is a server to use instead of a throwaway cluster (then
	// the database is never restarted).
	DatabaseURL string
	// Instances are inserted before the workers start; InsertBatch more
	// every InsertEvery during the chaos phase.
	Instances   int
	InsertBatch int
	InsertEvery time.Duration
	// Lease and Heartbeat of the workers. The lease must outlast the
	// database restart plus two heartbeats (see the package comment).
	Lease, Heartbeat time.Duration
	// Reconcile is the workers' reconciler interval (default 1s).
	Reconcile time.Duration
	// NoSignals turns the signaller off (awaits then end by their timeouts).
	NoSignals bool
	// Keys is the key space of the workload.
	Keys KeySpace
	// DrainTimeout bounds the wait for every instance to finish after the chaos phase.
	DrainTimeout time.Duration
	// Dir receives the recorder, log and output files ("" : a temporary
	// directory, removed when the run passes).
	Dir string
	// Seed seeds the controller's choices (0: random).
	Seed uint64
	// WorkerCommand builds the command that runs one worker process with
	// the given arguments (see ParseWorkerFlags). Required.
	WorkerCommand func(args []string) *exec.Cmd
	// Out receives progress lines (nil: none).
	Out io.Writer
}

// Full is the configuration of `make chaos`: two minutes of chaos.
var Full = Config{Duration: 2 * time.Minute, Workers: 6, Executors: 8, KillEvery: time.Second,
	RestartDB: true, DBDown: 2 * time.Second, Instances: 200, InsertBatch: 8, InsertEvery: 250 * time.Millisecond,
	Lease: 4 * time.Second, Heartbeat: time.Second, Keys: KeySpace{Acct: 12, API: 4, Bulk: 2}, DrainTimeout: 4 * time.Minute}

// Short is the configuration run by `make test`: about half a minute.
var Short = Config{Duration: 14 * time.Second, Workers: 3, Executors: 3, KillEvery: 2500 * time.Millisecond,
	RestartDB: true, DBDown: 1500 * time.Millisecond, Instances: 40, InsertBatch: 2, InsertEvery: 400 * time.Millisecond,
	Lease: 8 * time.Second, Heartbeat: 500 * time.Millisecond, Keys: KeySpace{Acct: 8, API: 3, Bulk: 2}, DrainTimeout: 60 * time.Second}

func (c *Config) defaults() {
	d := Full
	if c.Duration <= 0 {
		c.Duration = d.Duration
	}
	if c.Workers <= 0 {
		c.Workers = d.Workers
	}
	if c.Executors <= 0 {
		c.Executors = d.Executors
	}
	if c.KillEvery <= 0 {
		c.KillEvery = d.KillEvery
	}
	if c.DBDown <= 0 {
		c.DBDown = d.DBDown
	}
	if c.Instances <= 0 {
		c.Instances = d.Instances
	}
	if c.InsertBatch < 0 {
		c.InsertBatch = 0
	}
	if c.InsertEvery <= 0 {
		c.InsertEvery = d.InsertEvery
	}
	if c.Lease <= 0 {
		c.Lease = d.Lease
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = d.Heartbeat
	}
	if c.Reconcile <= 0 {
		c.Reconcile = time.Second
	}
	if c.Keys == (KeySpace{}) {
		c.Keys = d.Keys
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = d.DrainTimeout
	}
	if c.Seed == 0 {
		c.Seed = mrand.Uint64()
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
}

// Report holds the figures of a run; Violations lists everything that broke
// a promise (empty when the run passed).
type Report struct {
	Config   Config
	Database string // how the database was provided
	// DBRestarts is 1 when PostgreSQL was restarted; DBOutage is how long
	// it did not accept connections.
	DBRestarts int
	DBOutage   time.Duration
	Elapsed    time.Duration
	Drain      time.Duration

	Kills, SameIDRestarts, NewIDRestarts int
	Inserted, InsertFailures             int
	// InsertsSettledLate counts the failed insert calls whose batch was
	// found whole at the end (it committed after the call gave up).
	InsertsSettledLate      int
	Signals, SignalsRefused int
	// SignalErrors are unexpected signal errors (not ErrTerminal).
	SignalErrors int

	Instances, Children, Done int
	Runs, Committed           int
	// SeveralKeyRuns are the recorded runs that held several keys.
	SeveralKeyRuns           int
	KilledMidStep            int
	LostWithProcess          int
	StaleRuns, StaleOutcomes int
	HistoryRows              int
	TornLines                int
	Panics                   int

	// Keys is the number of keys the recorder saw; KViolations the number
	// of keys that ran more than K at some moment (counted runs only), and
	// StaleOverlapKeys those that would have with the stale runs counted.
	Keys             int
	KViolations      int
	StaleOverlapKeys int
	MaxByName        map[string]int
	KByName          map[string]int

	// BulkStarts are the recorded starts of "bulk" steps; BulkPeak is the
	// window with the most of them against the rate limit's bound.
	BulkStarts int
	BulkPeak   string

	Samples, OverAdmitted, UnderCredited int
	Counters                             int
	CountersRepaired, Drift              int
	ReconcilerPromoted                   int
	Reclaimed, Reaped                    int

	OutageLines, RecoveryLines, Conflicts int
	// Survivors are the worker processes that lived through the database
	// restart: each logged it once, its end once, and resumed.
	Survivors       int
	KeyValuesInLogs int

	Violations []string
}

// Passed reports whether no violation was found.
func (r *Report) Passed() bool { return len(r.Violations) == 0 }

// Print writes the figures and violations.
func (r *Report) Print(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "chaos: %d worker processes × %d executors, %s of chaos (seed %d), database: %s\n",
		c.Workers, c.Executors, c.Duration, c.Seed, r.Database)
	if r.DBRestarts > 0 {
		fmt.Fprintf(w, "database: restarted %d time(s) mid-run, refusing connections for %s (lease %s, heartbeat %s)\n",
			r.DBRestarts, r.DBOutage.Round(time.Millisecond), c.Lease, c.Heartbeat)
	} else {
		fmt.Fprintf(w, "database: NOT restarted (-restart-db=false or no throwaway cluster); lease %s, heartbeat %s\n", c.Lease, c.Heartbeat)
	}
	fmt.Fprintf(w, "kills: %d SIGKILLs; restarted %d with the same worker id (startup reclaim: %d claims) and %d with a new id (reaped after the lease: %d claims)\n",
		r.Kills, r.SameIDRestarts, r.Reclaimed, r.NewIDRestarts, r.Reaped)
	fmt.Fprintf(w, "instances: %d (%d inserted, %d spawned children); %d done with the expected result; %d inserts failed while the database was down, %d of them committed after all\n",
		r.Instances, r.Inserted, r.Children, r.Done, r.InsertFailures, r.InsertsSettledLate)
	fmt.Fprintf(w, "signals: %d sent, %d refused as terminal (expected races), %d other errors\n", r.Signals, r.SignalsRefused, r.SignalErrors)
	fmt.Fprintf(w, "step runs: %d recorded (%d holding several keys): %d committed, %d killed mid-step, %d finished but lost with their process, %d stale (discarded); %d panics caught\n",
		r.Runs, r.SeveralKeyRuns, r.Committed, r.KilledMidStep, r.LostWithProcess, r.StaleRuns, r.Panics)
	names := make([]string, 0, len(r.MaxByName))
	for n := range r.MaxByName {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %d/%d", n, r.MaxByName[n], r.KByName[n])
	}
	fmt.Fprintf(w, "outside recorder: %d keys, %d ever over K; most at once per name (seen/K): %s; keys over K only if stale runs are counted: %d\n",
		r.Keys, r.KViolations, strings.Join(parts, ", "), r.StaleOverlapKeys)
	fmt.Fprintf(w, "rate limit (bulk: %d/s, burst %d): %d steps started; busiest window %s\n", BulkRate, BulkBurst, r.BulkStarts, r.BulkPeak)
	fmt.Fprintf(w, "gate counters: %d samples, %d over-admitted, %d under-credited (the safe direction); at the end %d counters, all equal to the executing-rows truth: %v; reconciler repaired %d counters (drift %d) and promoted %d blocked rows\n",
		r.Samples, r.OverAdmitted, r.UnderCredited, r.Counters, !r.hasCounterViolation(), r.CountersRepaired, r.Drift, r.ReconcilerPromoted)
	fmt.Fprintf(w, "stale outcomes: %d discarded by fences, 0 committed expected: %d history rows checked (no two committed runs of an instance overlap; every chain complete)\n",
		r.StaleOutcomes, r.HistoryRows)
	fmt.Fprintf(w, "logs: %d \"store unavailable\" and %d \"store available again\" lines; %d processes lived through the restart and each logged it exactly once and resumed; %d transaction conflicts retried; key values in logs: %d\n",
		r.OutageLines, r.RecoveryLines, r.Survivors, r.Conflicts, r.KeyValuesInLogs)
	if r.Passed() {
		fmt.Fprintf(w, "RESULT: PASS (%s, drain %s)\n", r.Elapsed.Round(time.Second), r.Drain.Round(100*time.Millisecond))
		return
	}
	fmt.Fprintf(w, "RESULT: FAIL, %d violations:\n", len(r.Violations))
	for i, v := range r.Violations {
		if i == 50 {
			fmt.Fprintf(w, "  ... and %d more\n", len(r.Violations)-50)
			break
		}
		fmt.Fprintf(w, "  - %s\n", v)
	}
}

func (r *Report) hasCounterViolation() bool {
	for _, v := range r.Violations {
		if strings.HasPrefix(v, "counter of ") {
			return true
		}
	}
	return false
}

// proc is one worker process.
type proc struct {
	name, workerID string
	slot           int
	startedAt      time.Time
	cmd            *exec.Cmd
	done           chan struct{}
	exitedAt       time.Time
	err            error
	killed         atomic.Bool
}

// runner is the state of one chaos run.
type runner struct {
	cfg     Config
	rep     *Report
	dir     string
	url     string
	schema  string
	cluster *pgcluster.Cluster
	pool    *pgxpool.Pool
	eng     *durable.Engine
	limits  gate.Limits
	rng     *mrand.Rand
	rngMu   sync.Mutex
	outMu   sync.Mutex

	mu       sync.Mutex
	procs    []*proc // every process ever started
	live     map[int]*proc
	nextProc int
	gens     map[int]int
	deaths   map[string]int64
	graceful map[string]bool
	parents  int
	// unsettled are the ids of insert batches whose call failed and whose
	// first row was not found right after: such a transaction may still
	// commit (its COMMIT reached the server before the connection broke),
	// so each batch is counted, all or nothing, once the run is over
	// (see settleInserts).
	unsettled [][]string
	failures  []string
	passed    bool
	// dbDown and dbUp bracket the database restart (zero: none).
	dbDown, dbUp time.Time
}

func (r *runner) logf(format string, args ...any) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	fmt.Fprintf(r.cfg.Out, "[%s] %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func (r *runner) violation(format string, args ...any) {
	r.mu.Lock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *runner) intn(n int) int {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return r.rng.IntN(n)
}

// Run runs one chaos test and returns its report. An error means the run
// could not be carried out (no database, a worker that cannot start); the
// promises kept or broken are in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	if cfg.WorkerCommand == nil {
		return nil, errors.New("chaos: Config.WorkerCommand is required")
	}
	began := time.Now()
	r := &runner{cfg: cfg, rep: &Report{Config: cfg}, rng: mrand.New(mrand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15)),
		live: map[int]*proc{}, gens: map[int]int{}, deaths: map[string]int64{}, graceful: map[string]bool{}}
	limits, err := gate.NewLimits(Limits)
	if err != nil {
		return nil, err
	}
	r.limits = limits
	r.dir = cfg.Dir
	if r.dir == "" {
		if r.dir, err = os.MkdirTemp("", "durable-chaos-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, err
	}
	defer r.cleanup()
	if err := r.setupDatabase(ctx); err != nil {
		return nil, err
	}
	r.logf("files in %s; database %s, schema %s", r.dir, r.rep.Database, r.schema)

	if err := r.insert(ctx, cfg.Instances); err != nil {
		return nil, fmt.Errorf("chaos: initial insert: %w", err)
	}
	for slot := 1; slot <= cfg.Workers; slot++ {
		if err := r.startWorker(slot, true); err != nil {
			return nil, err
		}
	}

	// The chaos phase.
	chaosCtx, stopChaos := context.WithTimeout(ctx, cfg.Duration)
	defer stopChaos()
	bgCtx, stopBg := context.WithCancel(ctx)
	defer stopBg()
	var chaosWG, bgWG sync.WaitGroup
	chaosWG.Add(2)
	go func() { defer chaosWG.Done(); r.killLoop(chaosCtx) }()
	go func() { defer chaosWG.Done(); r.insertLoop(chaosCtx) }()
	if cfg.RestartDB && r.cluster != nil {
		chaosWG.Add(1)
		go func() { defer chaosWG.Done(); r.restartDB(chaosCtx) }()
	}
	bgWG.Add(2)
	go func() {
		defer bgWG.Done()
		if !cfg.NoSignals {
			r.signalLoop(bgCtx)
		}
	}()
	go func() { defer bgWG.Done(); r.sampleLoop(bgCtx) }()
	<-chaosCtx.Done()
	chaosWG.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	r.logf("chaos phase over: %d kills; draining with every worker up", r.rep.Kills)
	for slot := 1; slot <= cfg.Workers; slot++ {
		r.mu.Lock()
		p := r.live[slot]
		r.mu.Unlock()
		if p == nil {
			if err := r.startWorker(slot, true); err != nil {
				return nil, err
			}
		}
	}

	drainStart := time.Now()
	if err := r.drain(ctx); err != nil {
		r.violation("%v", err)
	}
	r.rep.Drain = time.Since(drainStart)
	r.waitCounters(ctx)
	stopBg()
	bgWG.Wait()
	r.stopWorkers()

	if err := r.finalCheck(ctx); err != nil {
		return nil, err
	}
	r.rep.Elapsed = time.Since(began)
	r.passed = r.rep.Passed()
	if !r.passed {
		r.logf("files kept in %s", r.dir)
	}
	return r.rep, nil
}

func (r *runner) setupDatabase(ctx context.Context) error {
	r.url = r.cfg.DatabaseURL
	switch {
	case r.url != "":
		r.rep.Database = "given server (not restarted)"
	case pgcluster.Available() == nil:
		c, err := pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			return fmt.Errorf("chaos: throwaway cluster: %w", err)
		}
		r.cluster = c
		r.url = c.URL("")
		r.rep.Database = fmt.Sprintf("throwaway cluster on port %d", c.Port())
	default:
		r.url = DefaultURL
		r.rep.Database = "shared server " + DefaultURL + " (no throwaway cluster: " + pgcluster.Available().Error() + "; not restarted)"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	r.schema = "chaos_" + hex.EncodeToString(b[:])
	pcfg, err := pgxpool.ParseConfig(r.url)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 6
	if r.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return err
	}
	if _, err := postgres.Migrate(ctx, r.pool, r.schema); err != nil {
		return fmt.Errorf("chaos: migrate: %w", err)
	}
	st, err := postgres.New(ctx, r.pool, postgres.Options{Schema: r.schema})
	if err != nil {
		return err
	}
	// An engine that is never started: it inserts and signals.
	r.eng, err = durable.New(durable.Config{Store: st, Limits: Limits, RateLimits: RateLimits, WorkerID: "chaos-controller",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	parent, child := Workflows(nopRecorder{}, r.cfg.Keys)
	if err := r.eng.Register(parent, child); err != nil {
		return err
	}
	return nil
}

func (r *runner) cleanup() {
	if r.pool != nil {
		if r.cluster == nil && r.schema != "" {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, _ = r.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{r.schema}.Sanitize()+" CASCADE")
			cancel()
		}
		r.pool.Close()
	}
	r.mu.Lock()
	live := make([]*proc, 0, len(r.live))
	for _, p := range r.live {
		live = append(live, p)
	}
	r.mu.Unlock()
	for _, p := range live {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	if r.cluster != nil {
		_ = r.cluster.StopServer()
		if b, err := os.ReadFile(filepath.Join(r.cluster.Dir(), "server.log")); err == nil {
			_ = os.WriteFile(filepath.Join(r.dir, "postgres.log"), b, 0o644)
		}
		r.cluster.Remove()
	}
	if r.cfg.Dir == "" && r.passed {
		_ = os.RemoveAll(r.dir)
	}
}

// insert inserts n new parent instances with ids chosen here, so that an
// insert whose outcome is unknown (the database went away, the context
// ended around the commit) can be looked up rather than guessed.
func (r *runner) insert(ctx context.Context, n int) error {
	if n == 0 {
		return nil
	}
	reqs := make([]durable.InsertRequest, n)
	r.rngMu.Lock()
	for i := range reqs {
		reqs[i] = r.cfg.Keys.NewInstance(r.rng)
		reqs[i].Options.ID = uuid.NewString()
	}
	r.rngMu.Unlock()
	_, err := r.eng.InsertMany(ctx, reqs)
	if err != nil {
		// All or nothing: the first row tells which, once found. Not
		// found, the transaction may still commit (see unsettled).
		committed := false
		for range 40 {
			lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, gerr := r.eng.Get(lctx, reqs[0].Options.ID)
			cancel()
			if gerr == nil {
				committed = true
				break
			}
			if errors.Is(gerr, store.ErrNotFound) {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if !committed {
			ids := make([]string, n)
			for i, rq := range reqs {
				ids[i] = rq.Options.ID
			}
			r.mu.Lock()
			r.unsettled = append(r.unsettled, ids)
			r.mu.Unlock()
			return err
		}
	}
	r.mu.Lock()
	r.parents += n
	r.rep.Inserted += n
	r.mu.Unlock()
	return nil
}

func (r *runner) insertLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.InsertEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := r.insert(ictx, r.cfg.InsertBatch); err != nil && ctx.Err() == nil {
			r.mu.Lock()
			r.rep.InsertFailures++
			r.mu.Unlock()
		}
		cancel()
	}
}

// startWorker starts a worker process in slot, with the slot's current
// worker id (startup reclaim of the dead predecessor's claims) or a new one
// (the predecessor's claims wait for the reaper).
func (r *runner) startWorker(slot int, sameID bool) error {
	r.mu.Lock()
	r.nextProc++
	if !sameID || r.gens[slot] == 0 {
		r.gens[slot]++
	}
	p := &proc{name: fmt.Sprintf("p%02d", r.nextProc), workerID: fmt.Sprintf("w%d.%d", slot, r.gens[slot]), slot: slot, done: make(chan struct{})}
	r.mu.Unlock()
	wc := WorkerConfig{DatabaseURL: r.url, Schema: r.schema, WorkerID: p.workerID, Proc: p.name, Dir: r.dir,
		Executors: r.cfg.Executors, Lease: r.cfg.Lease, Heartbeat: r.cfg.Heartbeat, Reaper: 500 * time.Millisecond,
		Reconcile: r.cfg.Reconcile, Keys: r.cfg.Keys}
	p.cmd = r.cfg.WorkerCommand(wc.args())
	out, err := os.OpenFile(filepath.Join(r.dir, "out-"+p.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if p.cmd.SysProcAttr == nil {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	p.cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	p.startedAt = time.Now()
	if err := p.cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("chaos: start worker %s: %w", p.name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		p.exitedAt = time.Now()
		out.Close()
		close(p.done)
	}()
	r.mu.Lock()
	r.procs = append(r.procs, p)
	r.live[slot] = p
	r.mu.Unlock()
	return nil
}

func (r *runner) killLoop(ctx context.Context) {
	for {
		d := r.cfg.KillEvery/2 + time.Duration(r.intn(int(r.cfg.KillEvery)+1))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		slot := 1 + r.intn(r.cfg.Workers)
		r.mu.Lock()
		p := r.live[slot]
		delete(r.live, slot)
		r.mu.Unlock()
		if p == nil {
			continue
		}
		p.killed.Store(true)
		_ = p.cmd.Process.Kill()
		<-p.done
		r.mu.Lock()
		r.deaths[p.name] = p.exitedAt.UnixNano()
		r.rep.Kills++
		r.mu.Unlock()
		time.Sleep(time.Duration(r.intn(800)) * time.Millisecond)
		// Alternate: the same worker id (startup reclaim takes the dead
		// predecessor's claims back at once) and a new one (they wait for
		// the lease to expire and the reaper).
		r.mu.Lock()
		same := (r.rep.Kills+int(r.cfg.Seed%2))%2 == 0
		r.mu.Unlock()
		if err := r.startWorker(slot, same); err != nil {
			r.violation("restart worker: %v", err)
			continue
		}
		r.mu.Lock()
		if same {
			r.rep.SameIDRestarts++
		} else {
			r.rep.NewIDRestarts++
		}
		r.mu.Unlock()
		r.logf("killed %s (%s), restarted slot %d (same id: %v)", p.name, p.workerID, slot, same)
	}
}

func (r *runner) restartDB(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(r.cfg.Duration / 2):
	}
	r.logf("restarting PostgreSQL (down for %s)", r.cfg.DBDown)
	began := time.Now()
	if err := r.cluster.Restart(context.Background(), r.cfg.DBDown); err != nil {
		r.violation("restart PostgreSQL: %v", err)
		return
	}
	r.mu.Lock()
	r.rep.DBRestarts++
	r.rep.DBOutage = time.Since(began)
	r.dbDown, r.dbUp = began, time.Now()
	r.mu.Unlock()
	r.logf("PostgreSQL is back after %s", r.rep.DBOutage.Round(time.Millisecond))
	if max := r.cfg.Lease - 2*r.cfg.Heartbeat; r.rep.DBOutage > max {
		r.logf("warning: the outage (%s) exceeded lease − 2 × heartbeat (%s): live claims may have expired", r.rep.DBOutage, max)
	}
}

// signalLoop wakes awaiting instances (racing their parks and timeouts)
// and sends a few signals to instances that are not awaiting.
func (r *runner) signalLoop(ctx context.Context) {
	q := "SELECT id::text FROM " + pgx.Identifier{r.schema}.Sanitize() + ".instances WHERE status = $1 LIMIT 8"
	for ctx.Err() == nil {
		time.Sleep(15 * time.Millisecond)
		status := "awaiting"
		if r.intn(4) == 0 {
			status = "done" // a signal to a terminal instance must be refused
		}
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		rows, err := r.pool.Query(qctx, q, status)
		var ids []string
		if err == nil {
			ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		cancel()
		if err != nil {
			continue
		}
		for _, id := range ids {
			opts := durable.SignalOptions{}
			if r.intn(3) == 0 {
				opts.DedupKey = fmt.Sprintf("d%d", r.intn(4))
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			err := r.eng.Signal(sctx, id, SignalName, map[string]int{"n": r.intn(100)}, opts)
			cancel()
			r.mu.Lock()
			r.rep.Signals++
			switch {
			case err == nil:
			case errors.Is(err, store.ErrTerminal):
				r.rep.SignalsRefused++
			case ctx.Err() == nil && status == "awaiting" && !isOutage(err):
				r.rep.SignalErrors++
				r.failures = append(r.failures, fmt.Sprintf("signal to %s: %v", id, err))
			}
			r.mu.Unlock()
		}
	}
}

// isOutage reports errors that a database restart explains.
func isOutage(err error) bool {
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		c := se.SQLState()
		return strings.HasPrefix(c, "08") || strings.HasPrefix(c, "57")
	}
	return !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrInvalid) && !errors.Is(err, durable.ErrInvalidInput)
}

// sampleLoop checks, in one snapshot every 200 ms, that no gate counter has
// more rows executing than its free slots allow and that no key has more
// executing rows than its K.
func (r *runner) sampleLoop(ctx context.Context) {
	s := pgx.Identifier{r.schema}.Sanitize()
	// A row of several keys holds its first key in its own row and the
	// others in key_holds (see migration 025): both count.
	qCounters := `SELECT c.key, c.shard, c.capacity, c.available,
       (SELECT count(*) FROM ` + s + `.instances i WHERE i.status = 'executing' AND i.key = c.key AND i.key_shard = c.shard)
       + (SELECT count(*) FROM ` + s + `.key_holds h WHERE h.key = c.key AND h.shard = c.shard)
FROM ` + s + `.key_slots c`
	qKeys := `SELECT key, count(*) FROM (
    SELECT key FROM ` + s + `.instances WHERE status = 'executing' AND key IS NOT NULL
    UNION ALL SELECT key FROM ` + s + `.key_holds) k GROUP BY key`
	for ctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := pgx.BeginTxFunc(qctx, r.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			rows, err := tx.Query(qctx, qCounters)
			if err != nil {
				return err
			}
			counters, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (counterRow, error) {
				var c counterRow
				return c, row.Scan(&c.Key, &c.Shard, &c.Capacity, &c.Avail, &c.N)
			})
			if err != nil {
				return err
			}
			rows, err = tx.Query(qctx, qKeys)
			if err != nil {
				return err
			}
			type keyCount struct {
				key string
				n   int
			}
			keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (keyCount, error) {
				var k keyCount
				return k, row.Scan(&k.key, &k.n)
			})
			if err != nil {
				return err
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			r.rep.Samples++
			for _, c := range counters {
				switch {
				case c.Avail+c.N > c.Capacity:
					r.rep.OverAdmitted++
					r.failures = append(r.failures, fmt.Sprintf("sample: counter %s/%d has %d free and %d executing, capacity %d", c.Key, c.Shard, c.Avail, c.N, c.Capacity))
				case c.Avail+c.N < c.Capacity:
					r.rep.UnderCredited++
				}
			}
			for _, k := range keys {
				if k.n > r.limits.K(k.key) {
					r.rep.OverAdmitted++
					r.failures = append(r.failures, fmt.Sprintf("sample: key %s has %d executing rows, K = %d", k.key, k.n, r.limits.K(k.key)))
				}
			}
			return nil
		})
		cancel()
		_ = err // the database may be restarting
	}
}

// drain waits until every instance is terminal.
func (r *runner) drain(ctx context.Context) error {
	q := "SELECT count(*) FROM " + pgx.Identifier{r.schema}.Sanitize() + ".instances WHERE status NOT IN ('done', 'failed', 'canceled')"
	deadline := time.Now().Add(r.cfg.DrainTimeout)
	last := int64(-1)
	for {
		var n int64
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := r.pool.QueryRow(qctx, q).Scan(&n)
		cancel()
		if err == nil && n == 0 {
			return nil
		}
		if err == nil && n != last {
			last = n
			r.logf("draining: %d instances not terminal yet", n)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d instances were not terminal %s after the chaos phase (last error: %v)", n, r.cfg.DrainTimeout, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitCounters gives the workers' reconcilers a few sweeps to repair
// counters that crash paths under-credited.
func (r *runner) waitCounters(ctx context.Context) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		counters, err := r.counters(ctx)
		if err == nil {
			ok := true
			for _, c := range counters {
				ok = ok && c.Avail == c.Capacity-c.N
			}
			if ok {
				return
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (r *runner) counters(ctx context.Context) ([]counterRow, error) {
	s := pgx.Identifier{r.schema}.Sanitize()
	rows, err := r.pool.Query(ctx, `SELECT c.key, c.shard, c.capacity, c.available,
       (SELECT count(*) FROM `+s+`.instances i WHERE i.status = 'executing' AND i.key = c.key AND i.key_shard = c.shard)
       + (SELECT count(*) FROM `+s+`.key_holds h WHERE h.key = c.key AND h.shard = c.shard)
FROM `+s+`.key_slots c ORDER BY c.key, c.shard`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (counterRow, error) {
		var c counterRow
		return c, row.Scan(&c.Key, &c.Shard, &c.Capacity, &c.Avail, &c.N)
	})
}

// stopWorkers stops every live worker with SIGTERM (a graceful Stop).
func (r *runner) stopWorkers() {
	r.mu.Lock()
	live := make([]*proc, 0, len(r.live))
	for slot, p := range r.live {
		live = append(live, p)
		delete(r.live, slot)
	}
	r.mu.Unlock()
	for _, p := range live {
		// A worker restarted just before the end may not have installed its
		// signal handler yet: SIGTERM would kill it rather than stop it.
		r.awaitStarted(p, 30*time.Second)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range live {
		select {
		case <-p.done:
		case <-time.After(45 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			r.violation("worker %s did not stop within 45s of SIGTERM", p.name)
		}
		r.mu.Lock()
		r.graceful[p.name] = true
		r.mu.Unlock()
		if p.err != nil {
			r.violation("worker %s exited with %v (see out-%s.log)", p.name, p.err, p.name)
		}
	}
}

// awaitStarted waits, up to max, until worker p has logged that its engine
// started (so it handles SIGTERM as a graceful stop) or has exited.
func (r *runner) awaitStarted(p *proc, max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return
		default:
		}
		if logged(logFile(r.dir, p.name), "chaos worker started") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logged reports whether the log file name has a line containing msg,
// reading it only up to that line (it comes early in a worker's log).
func logged(name, msg string) bool {
	f, err := os.Open(name)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if bytes.Contains(sc.Bytes(), []byte(msg)) {
			return true
		}
	}
	return false
}

// settleInserts counts the insert batches whose outcome was unknown
// (unsettled) by the instances found at the end: a batch found whole was
// inserted, one found nowhere was not, and one found in part broke the
// insert's all-or-nothing promise. Called with r.mu held.
func (r *runner) settleInserts(insts []instanceRow) {
	found := make(map[string]bool, len(insts))
	for _, in := range insts {
		found[in.ID] = true
	}
	for _, ids := range r.unsettled {
		n := 0
		for _, id := range ids {
			if found[id] {
				n++
			}
		}
		switch n {
		case 0:
		case len(ids):
			r.parents += n
			r.rep.Inserted += n
			r.rep.InsertsSettledLate++
		default:
			r.failures = append(r.failures, fmt.Sprintf("an insert batch of %d committed in part: %d rows found", len(ids), n))
		}
	}
	r.unsettled = nil
}

func (r *runner) finalCheck(ctx context.Context) error {
	recs, err := ReadRecords(r.dir)
	if err != nil {
		return err
	}
	s := pgx.Identifier{r.schema}.Sanitize()
	rows, err := r.pool.Query(ctx, `SELECT id::text, workflow, status, coalesce(parent_id::text, ''), coalesce(last_error, ''), coalesce(result::text, '')
FROM `+s+`.instances`)
	if err != nil {
		return err
	}
	insts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (instanceRow, error) {
		var in instanceRow
		var res string
		err := row.Scan(&in.ID, &in.Workflow, &in.Status, &in.ParentID, &in.LastError, &res)
		in.Result = []byte(res)
		return in, err
	})
	if err != nil {
		return err
	}
	rows, err = r.pool.Query(ctx, `SELECT instance_id::text, step, attempt, coalesce(worker, ''), started_at, finished_at, outcome, coalesce(error, '')
FROM `+s+`.history ORDER BY id`)
	if err != nil {
		return err
	}
	hist, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (historyRow, error) {
		var h historyRow
		return h, row.Scan(&h.Instance, &h.Step, &h.Attempt, &h.Worker, &h.Started, &h.Finished, &h.Outcome, &h.Error)
	})
	if err != nil {
		return err
	}
	counters, err := r.counters(ctx)
	if err != nil {
		return err
	}
	events, leaks, err := readLogs(r.dir)
	if err != nil {
		return err
	}
	r.mu.Lock()
	deaths := make(map[string]int64, len(r.deaths))
	for k, v := range r.deaths {
		deaths[k] = v
	}
	r.settleInserts(insts)
	parents := r.parents
	survivors := map[string]bool{}
	if !r.dbUp.IsZero() {
		// Lived through it: its engine started before it went down, and ended (killed
		// or stopped) more than 3 s after it was back, long enough to have
		// logged its end (declared after 1 s without failures).
		engineUp := map[string]time.Time{}
		for _, ev := range events {
			if ev.Msg == "chaos worker started" {
				engineUp[ev.Proc] = ev.Time
			}
		}
		for _, p := range r.procs {
			up, ok := engineUp[p.name]
			if ok && up.Before(r.dbDown) && p.exitedAt.After(r.dbUp.Add(3*time.Second)) {
				survivors[p.name] = true
			}
		}
	}
	dbUp := r.dbUp.UnixNano()
	r.mu.Unlock()
	v := check(r.rep, recs, deaths, r.graceful, r.limits, insts, hist, counters, events, leaks, parents, survivors, dbUp)
	r.rep.Violations = append(r.failures, v...)
	return nil
}
