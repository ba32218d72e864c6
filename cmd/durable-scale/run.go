package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/pgcluster"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
)

// retention is the engines' default (durable.Config.Retention).
const retention = 7 * 24 * time.Hour

func run(ctx context.Context, o options) error {
	url, done, err := prepare(ctx, &o)
	if err != nil {
		return err
	}
	defer done()
	schema := fmt.Sprintf("scale_%d", time.Now().Unix())
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	statements := true
	if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		statements = false
		fmt.Printf("pg_stat_statements unavailable (%v): no statement times\n", err)
	}
	if _, err := postgres.Migrate(ctx, pool, schema); err != nil {
		return err
	}
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: schema})
	if err != nil {
		return err
	}
	if _, err := st.SyncKeyLimits(ctx, store.DefaultNamespace, store.KeyLimits{Limits: []gate.Limit{{Name: "api", Limit: o.gateLimit}}}, store.SyncOptions{}); err != nil {
		return err
	}
	if o.keyLimits > 0 {
		t0 := time.Now()
		if _, err := st.SyncKeyLimits(ctx, keyLimitsNamespace, store.KeyLimits{Limits: keyLimits(o)}, store.SyncOptions{}); err != nil {
			return err
		}
		fmt.Printf("%d per-key limits stored in %v\n", o.keyLimits, time.Since(t0).Round(time.Millisecond))
	}
	ctl, err := durable.New(durable.Config{Store: st, WorkerID: "scale-controller"})
	if err != nil {
		return err
	}
	if err := ctl.Register(workflows(o.step, true, nil)...); err != nil {
		return err
	}
	fmt.Printf("durable-scale: schema %s, logs in %s\n", schema, o.dir)
	if err := load(ctx, pool, ctl, schema, o); err != nil {
		return err
	}
	// The first sweep also deletes the terminal rows that aged past the
	// retention while the table loaded (minutes of -retire rows a second);
	// the second is a sweep as the run's every 30 s are, over the same
	// backlog, on the same statistics.
	t0 := time.Now()
	rep, err := st.Reconcile(ctx, retention, time.Time{})
	fmt.Printf("first reconcile sweep, with the rows aged past the retention while the table loaded: %v (%+v, err %v)\n", time.Since(t0).Round(time.Millisecond), rep, err)
	t0 = time.Now()
	rep, err = st.Reconcile(ctx, retention, time.Time{})
	fmt.Printf("reconcile sweep before the load (no ANALYZE run): %v (%+v, err %v)\n", time.Since(t0).Round(time.Millisecond), rep, err)

	depth, err := backlogDepth(ctx, pool, schema, o.backlogged)
	if err != nil {
		return err
	}
	f := &fleet{o: o, url: url, schema: schema}
	defer f.stopAll()
	since := time.Now()
	for i := range o.engines {
		if err := f.start(i, true); err != nil {
			return err
		}
	}
	r := newReporter(pool, schema, f, statements, o.backlogged, o.sustain)
	soak, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var wg sync.WaitGroup
	var inserted, onBacklogged atomic.Int64
	top := newTopUp(pool, ctl, f, schema, o.backlogged, &onBacklogged, since)
	act := &activity{}
	wg.Add(4)
	go func() { defer wg.Done(); act.run(soak, pool, o.dir) }()
	go func() { defer wg.Done(); insertLoad(soak, ctl, o, &inserted, &onBacklogged, f) }()
	go func() { defer wg.Done(); r.sample(soak) }()
	go func() { defer wg.Done(); events(soak, st, f, o, r) }()
	if o.sustain {
		wg.Add(1)
		go func() { defer wg.Done(); top.run(soak) }()
	}
	r.loop(soak, o.every, &inserted, &top.added)
	wg.Wait()
	loadEnd := time.Now()
	end, err := backlogDepth(context.Background(), pool, schema, o.backlogged)
	f.stopAll()
	if !o.sustain {
		fmt.Printf("backlog (ready and blocked rows of the %d backlogged keys): %d before the load, %d at its end (err %v)\n",
			o.backlogged, depth, end, err)
	} else {
		err2 := top.last(context.Background())
		last, err3 := backlogDepth(context.Background(), pool, schema, o.backlogged)
		fmt.Printf("backlog (ready and blocked rows of the %d backlogged keys): %d before the load, %d at its end, %d after a last top-up with the fleet stopped; %d rows added to it (errors: %v, %v, %v)\n",
			o.backlogged, depth, end, last, top.added.Load(), err, err2, err3)
	}
	t0 = time.Now()
	rep, err = st.Reconcile(context.Background(), retention, time.Time{})
	fmt.Printf("reconcile sweep after the load: %v (%+v, err %v)\n", time.Since(t0).Round(time.Millisecond), rep, err)
	r.summary(context.Background())
	r.stalls(context.Background(), act, since, loadEnd)
	return nil
}

// prepare returns the server to run on (see server) and makes o.dir, the
// engines' log directory (a temporary one when empty).
func prepare(ctx context.Context, o *options) (url string, done func(), err error) {
	if o.dir == "" {
		o.dir, err = os.MkdirTemp("", "durable-scale-")
	} else {
		err = os.MkdirAll(o.dir, 0o755)
	}
	if err != nil {
		return "", nil, err
	}
	return server(ctx, *o)
}

// server returns the URL of the server to run on: -database-url, or a
// throwaway cluster with Debian's defaults (autovacuum on) and
// pg_stat_statements loaded, removed by done. The throwaway cluster logs
// what explains a stall (lock waits past deadlock_timeout, statements over
// a second, checkpoints, autovacuum runs) to server.log, which done copies
// into the log directory.
func server(ctx context.Context, o options) (url string, done func(), err error) {
	if o.databaseURL != "" {
		return o.databaseURL, func() {}, nil
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{
		"shared_preload_libraries":    "pg_stat_statements",
		"max_connections":             "100",
		"log_lock_waits":              "on",
		"log_min_duration_statement":  "1000",
		"log_checkpoints":             "on",
		"log_autovacuum_min_duration": "0",
		"log_line_prefix":             "%m [%p] %a ",
	}})
	if err != nil {
		return "", nil, fmt.Errorf("throwaway cluster: %w", err)
	}
	fmt.Printf("throwaway cluster in %s\n", c.Dir())
	return c.URL("postgres"), func() {
		if b, err := os.ReadFile(filepath.Join(c.Dir(), "server.log")); err == nil {
			_ = os.WriteFile(filepath.Join(o.dir, "server.log"), b, 0o644)
		}
		c.Remove()
	}, nil
}

// load writes the table the run starts with: terminal rows written by one
// statement (their ids random, their times spread so that the oldest cross
// the retention during the run at -retire rows a second), then the
// backlogged keys' rows through the engine.
func load(ctx context.Context, pool *pgxpool.Pool, ctl *durable.Engine, schema string, o options) error {
	backlog := o.backlogged * (ready + 6)
	terminal := max(o.rows-backlog, 0)
	crossing := min(terminal, int(float64(o.retire)*o.duration.Seconds()))
	t0 := time.Now()
	if err := loadTerminal(ctx, pool, schema, terminal, crossing, o.duration); err != nil {
		return err
	}
	fmt.Printf("loaded %d terminal rows in %v\n", terminal, time.Since(t0).Round(time.Second))
	t0 = time.Now()
	const batch = 5_000
	reqs := make([]durable.InsertRequest, 0, batch)
	n := 0
	for k := range o.backlogged {
		for range ready + 6 {
			reqs = append(reqs, durable.InsertRequest{Workflow: workflowA, State: struct{}{},
				Options: durable.InsertOptions{Key: gate.Identity("acct", fmt.Sprint(k))}})
			if len(reqs) == batch {
				if _, err := ctl.InsertMany(ctx, reqs); err != nil {
					return fmt.Errorf("load backlog: %w", err)
				}
				n += len(reqs)
				reqs = reqs[:0]
			}
		}
	}
	if len(reqs) > 0 {
		if _, err := ctl.InsertMany(ctx, reqs); err != nil {
			return fmt.Errorf("load backlog: %w", err)
		}
		n += len(reqs)
	}
	el := time.Since(t0)
	fmt.Printf("loaded %d backlog rows over %d K = 1 keys in %v (%.0f rows/s)\n", n, o.backlogged, el.Round(time.Second), float64(n)/el.Seconds())
	return nil
}

// loadTerminal writes n done rows in one statement, their ids random, one
// in five of workflowB: the first crossing of them end over the span that
// starts one retention ago (so that retention deletes them during a run of
// that span), the rest over the retention period after them.
func loadTerminal(ctx context.Context, pool *pgxpool.Pool, schema string, n, crossing int, span time.Duration) error {
	_, err := pool.Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.instances (id, workflow, version, queue, status, step, state, attempt, run_at,
                             started_at, created_at, updated_at, result)
SELECT gen_random_uuid(), CASE WHEN i %% 5 = 0 THEN '%[2]s' ELSE '%[3]s' END, 1, 'default', 'done', 'run', '{}', 0, t, t, t, t, 'true'
FROM (SELECT i, CASE WHEN i <= $2
                     THEN $1::timestamptz - $3 * interval '1 microsecond' + (i::float8 / $2) * $4 * interval '1 microsecond'
                     ELSE $1::timestamptz - $3 * interval '1 microsecond' + $4 * interval '1 microsecond'
                          + ((i - $2)::float8 / greatest($5 - $2, 1)) * ($3 - $4) * interval '1 microsecond' END AS t
      FROM generate_series(1, $5) i) g`, schema, workflowB, workflowA),
		time.Now(), crossing, retention.Microseconds(), span.Microseconds(), n)
	if err != nil {
		return fmt.Errorf("load terminal rows: %w", err)
	}
	return nil
}

// ready is the backlog a key needs to pass the ready cap (admission.ReadyCap).
const ready = 64

// insertLoad inserts o.rate instances a second until ctx ends, in batches
// every 100 ms: two in five over the K = 1 keys, one in five over the gate
// keys, the rest without a key; one in five of the second workflow.
// onBacklogged counts the rows of the backlogged keys among them (see
// topUp).
func insertLoad(ctx context.Context, ctl *durable.Engine, o options, inserted, onBacklogged *atomic.Int64, f *fleet) {
	r := rand.New(rand.NewPCG(1, 2))
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	per := max(o.rate/10, 1)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		reqs := make([]durable.InsertRequest, per)
		bk := 0
		for i := range reqs {
			wf := workflowA
			if r.IntN(5) == 0 {
				wf = workflowB
			}
			var k gate.ConcurrencyKey
			switch x := r.IntN(5); {
			case x < 2:
				n := r.IntN(o.keys)
				if n < o.backlogged {
					bk++
				}
				k = gate.Identity("acct", fmt.Sprint(n))
			case x == 2:
				k = gate.Gate("api", fmt.Sprint(r.IntN(o.gateKeys)))
				if r.Float64() < o.several {
					// A row of several keys: an account that has no backlog, and the gate.
					acct := gate.Identity("acct", fmt.Sprint(o.backlogged+r.IntN(max(o.keys-o.backlogged, 1))))
					reqs[i] = durable.InsertRequest{Workflow: wf, State: struct{}{}, Options: durable.InsertOptions{Keys: []gate.ConcurrencyKey{acct, k}}}
					continue
				}
			}
			reqs[i] = durable.InsertRequest{Workflow: wf, State: struct{}{}, Options: durable.InsertOptions{Key: k}}
		}
		if _, err := ctl.InsertMany(ctx, reqs); err != nil {
			if ctx.Err() == nil {
				f.errorf("insert: %v", err)
			}
			continue
		}
		inserted.Add(int64(per))
		onBacklogged.Add(int64(bk))
	}
}

// events changes the gate's limit at about a third of the run, probing the gate
// keys' counters around it (see counterProbe), and rolls half the engines
// through a deploy that lacks the second workflow at half.
func events(ctx context.Context, st *postgres.Store, f *fleet, o options, r *reporter) {
	after := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	// Half a report interval past a third of the run: the change and the
	// windows it is measured in fall between two report lines, away from
	// the report's own query, which reads the interval's done rows and
	// slows every claim for a moment.
	third := o.duration/3 + min(o.every/2, o.duration/6)
	lead := min(probeBefore, third)
	if !after(third - lead) {
		return
	}
	probe := startCounterProbe(ctx, r.pool, r.schema)
	if !after(lead) {
		return
	}
	// The change runs on a store of its own, whose connections trace how
	// long each of its transactions holds gate counters (see holdTracer).
	holds := newHoldTracer()
	changer, closeChanger, err := tracedStore(ctx, r.pool, r.schema, holds)
	if err != nil {
		r.note(fmt.Sprintf("limit change: no traced store (%v); changing the limit untraced", err))
		changer, closeChanger = st, func() {}
	}
	defer closeChanger()
	t0 := time.Now()
	_, err = changer.SyncKeyLimits(ctx, store.DefaultNamespace, store.KeyLimits{Limits: []gate.Limit{{Name: "api", Limit: max(o.gateLimit-2, 1)}}}, store.SyncOptions{})
	r.note(fmt.Sprintf("limit change: api %d → %d took %v (err %v); %s", o.gateLimit, max(o.gateLimit-2, 1), time.Since(t0).Round(time.Millisecond), err, holds.result()))
	go func() {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(t0.Add(probeAfter))):
		}
		r.note("limit change: " + probe.result(t0))
	}()
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(gatePauseWindow + 5*time.Second):
		}
		before, err1 := r.gatePause(ctx, t0.Add(-gatePauseWindow), t0)
		during, err2 := r.gatePause(ctx, t0, t0.Add(gatePauseWindow))
		r.note(fmt.Sprintf("gate steps: longest pause between two starts %v in the %v before the limit change, %v in the %v from it (errors: %v, %v)",
			before.Round(time.Millisecond), gatePauseWindow, during.Round(time.Millisecond), gatePauseWindow, err1, err2))
	}()
	if !after(o.duration/2 - third) {
		return
	}
	half := o.engines / 2
	for i := range half {
		f.restart(i, false)
	}
	r.note(fmt.Sprintf("rolling deploy: %d engines without %s for %v", half, workflowB, o.deploy))
	select {
	case <-ctx.Done():
		return
	case <-time.After(o.deploy):
	}
	for i := range half {
		f.restart(i, true)
	}
	r.note("rolling deploy: done")
	if o.keyLimits == 0 || !after(o.every/2) {
		return
	}
	// One tenant's limit set among them all, as `durable limits set` does.
	one := gate.Limit{Name: "api:0", Limit: 3 * o.gateLimit}
	t0 = time.Now()
	_, err = st.SyncKeyLimits(ctx, keyLimitsNamespace, store.KeyLimits{Limits: []gate.Limit{one}}, store.SyncOptions{KeepOmitted: true})
	r.note(fmt.Sprintf("per-key limit set: api:0 → %d among %d took %v (err %v)", one.Limit, o.keyLimits, time.Since(t0).Round(time.Millisecond), err))
}

// keyLimitsNamespace owns the per-key limits of -key-limits.
const keyLimitsNamespace = "tenants"

// keyLimits are the per-key limits of -key-limits: api:0 … api:N-1, each
// twice the gate's limit.
func keyLimits(o options) []gate.Limit {
	out := make([]gate.Limit, o.keyLimits)
	for i := range out {
		out[i] = gate.Limit{Name: fmt.Sprintf("api:%d", i), Limit: 2 * o.gateLimit}
	}
	return out
}

// fleet is the engine processes.
type fleet struct {
	o      options
	url    string
	schema string

	mu     sync.Mutex
	procs  map[int]*exec.Cmd
	errs   []string // error and warning lines, oldest first, since the last take
	counts map[string]int
}

func (f *fleet) start(i int, withB bool) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, workerArgs(f.url, f.schema, fmt.Sprintf("scale-%d", i), f.o.executors, f.o.step, withB)...)
	logf, err := os.OpenFile(filepath.Join(f.o.dir, fmt.Sprintf("engine-%d.log", i)), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	go f.scan(i, io.TeeReader(stderr, logf), logf)
	f.mu.Lock()
	if f.procs == nil {
		f.procs = map[int]*exec.Cmd{}
	}
	f.procs[i] = cmd
	f.mu.Unlock()
	return nil
}

// scan collects an engine's WARN and ERROR lines.
func (f *fleet) scan(i int, r io.Reader, c io.Closer) {
	defer c.Close()
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		line := s.Text()
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") || strings.Contains(line, "durable-scale worker:") {
			f.errorf("engine %d: %s", i, line)
		}
	}
}

func (f *fleet) errorf(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, line)
	if f.counts == nil {
		f.counts = map[string]int{}
	}
	for _, bad := range []string{"out of shared memory", "too many connections", "deadlock detected"} {
		if strings.Contains(line, bad) {
			f.counts[bad]++
		}
	}
	f.counts["all"]++
}

func (f *fleet) takeErrors() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.errs
	f.errs = nil
	return out
}

func (f *fleet) stop(i int) {
	f.mu.Lock()
	cmd := f.procs[i]
	delete(f.procs, i)
	f.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			f.errorf("engine %d: %v", i, err)
		}
	case <-time.After(40 * time.Second):
		_ = cmd.Process.Kill()
		<-waited
		f.errorf("engine %d: killed: no exit 40 s after SIGTERM", i)
	}
}

func (f *fleet) restart(i int, withB bool) {
	f.stop(i)
	if err := f.start(i, withB); err != nil {
		f.errorf("engine %d: restart: %v", i, err)
	}
}

func (f *fleet) stopAll() {
	f.mu.Lock()
	var ids []int
	for i := range f.procs {
		ids = append(ids, i)
	}
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, i := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); f.stop(i) }()
	}
	wg.Wait()
}

// tracedStore opens a store on a pool of its own, like pool, whose
// connections report to tr.
func tracedStore(ctx context.Context, pool *pgxpool.Pool, schema string, tr *holdTracer) (*postgres.Store, func(), error) {
	cfg := pool.Config().Copy()
	cfg.ConnConfig.Tracer = tr
	cfg.ConnConfig.RuntimeParams["application_name"] = "limit-change"
	cfg.MaxConns = 4
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	st, err := postgres.New(ctx, p, postgres.Options{Schema: schema})
	if err != nil {
		p.Close()
		return nil, nil, err
	}
	return st, func() { _ = st.Close(); p.Close() }, nil
}
