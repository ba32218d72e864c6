package postgres_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/enginetest"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
)

// The fleet test runs several engines, each with its own pool, in this
// process and one more in a child process (this test binary re-executed with
// fleetChildEnv set), all on one schema. Step bodies log their start and end
// into a table of their own (fleet_log) on their own connections, with the
// database clock, so the log is outside the SDK and survives a killed
// process. Mid-run the child is killed with SIGKILL.

const (
	fleetChildEnv  = "GODURABLE_FLEET_CHILD"
	fleetURLEnv    = "GODURABLE_FLEET_URL"
	fleetSchemaEnv = "GODURABLE_FLEET_SCHEMA"
)

var fleetOpts = enginetest.StressOptions{AcctKeys: 200, APIKeys: 10, Executors: 8}

// dbRecorder logs step bodies into <schema>.fleet_log.
type dbRecorder struct {
	pool   *pgxpool.Pool
	schema string
	worker string
}

func (r *dbRecorder) Enter(key string) func() {
	if key == "" {
		return func() {}
	}
	ctx := context.Background()
	var id int64
	err := r.pool.QueryRow(ctx, fmt.Sprintf("INSERT INTO %s.fleet_log (key, worker, started) VALUES ($1, $2, clock_timestamp()) RETURNING id",
		pgx.Identifier{r.schema}.Sanitize()), key, r.worker).Scan(&id)
	if err != nil {
		panic(fmt.Sprintf("fleet recorder: %v", err))
	}
	return func() {
		_, err := r.pool.Exec(ctx, fmt.Sprintf("UPDATE %s.fleet_log SET ended = clock_timestamp() WHERE id = $1", pgx.Identifier{r.schema}.Sanitize()), id)
		if err != nil {
			panic(fmt.Sprintf("fleet recorder: %v", err))
		}
	}
}

func fleetEngine(t testing.TB, url, schema, worker string, lease time.Duration) *durable.Engine {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 10
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	if _, child := t.(childTB); !child {
		// Its connections go with the test: left open, the engines of a
		// -count=2 run took PostgreSQL past max_connections, and the
		// recorder's writes failed ("too many clients").
		t.Cleanup(pool.Close)
	}
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: schema})
	require.NoError(t, err)
	e, err := durable.New(durable.Config{Store: st, WorkerID: worker, Limits: enginetest.StressLimits,
		Queues: map[string]int{"default": fleetOpts.Executors}, Lease: lease, Logger: slog.New(slog.DiscardHandler),
		ReaperInterval: 200 * time.Millisecond, ReconcileInterval: time.Second, PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, e.Register(enginetest.StressWorkflow(&dbRecorder{pool: pool, schema: schema, worker: worker}, fleetOpts)))
	return e
}

// runFleetChild is the child process: an engine that runs until stdin closes.
func runFleetChild() {
	// A 5 s lease: short enough for the reaper to recover the killed child
	// quickly, long enough that a loaded machine does not expire a live
	// child's lease (a stale step may then overlap its replacement, which
	// fences allow and this test would report).
	e := fleetEngine(childTB{}, os.Getenv(fleetURLEnv), os.Getenv(fleetSchemaEnv), "child", 5*time.Second)
	if err := e.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "child start:", err)
		os.Exit(2)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = e.Stop(ctx)
	os.Exit(0)
}

// childTB lets the child reuse fleetEngine's require calls.
type childTB struct{ testing.TB }

func (childTB) Helper() {}
func (childTB) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}
func (childTB) FailNow() { os.Exit(3) }

func TestFleetStressWithKilledProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet stress is long")
	}
	url := pgtest.URL(t)
	admin := pgtest.Pool(t)
	schema := pgtest.SchemaOf(admin)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := postgres.Migrate(ctx, admin, schema)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `CREATE TABLE fleet_log (id bigserial PRIMARY KEY, key text NOT NULL, worker text NOT NULL,
		started timestamptz NOT NULL, ended timestamptz)`)
	require.NoError(t, err)

	var engines []*durable.Engine
	for i := 0; i < 4; i++ {
		engines = append(engines, fleetEngine(t, url, schema, fmt.Sprintf("engine-%d", i), 30*time.Second))
	}
	ids, err := engines[0].InsertMany(ctx, enginetest.StressRequests(2000, fleetOpts))
	require.NoError(t, err)

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), fleetChildEnv+"=1", fleetURLEnv+"="+url, fleetSchemaEnv+"="+schema)
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	defer func() { _ = stdin.Close(); _ = child.Process.Kill(); _ = child.Wait() }()
	for _, e := range engines {
		require.NoError(t, e.Start(ctx))
	}
	sigCtx, sigStop := context.WithCancel(ctx)
	sigDone := make(chan struct{})
	go func() { defer close(sigDone); enginetest.Signaller(sigCtx, engines, ids) }()

	// Kill the child with SIGKILL once it is busy.
	var childSteps int
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM fleet_log WHERE worker = 'child'").Scan(&childSteps))
		if childSteps >= 30 {
			break
		}
	}
	require.GreaterOrEqual(t, childSteps, 30, "the child process took part")
	require.NoError(t, child.Process.Kill())
	_ = child.Wait()
	var killedAt time.Time
	require.NoError(t, admin.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&killedAt))
	var childHeld int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM instances WHERE status = 'executing' AND worker = 'child'").Scan(&childHeld))
	t.Logf("killed the child after %d keyed steps; it held %d claims", childSteps, childHeld)

	for _, id := range ids {
		in, err := engines[0].Wait(ctx, id)
		require.NoError(t, err, "instance %s did not finish: %+v", id, in)
		require.Equal(t, store.StatusDone, in.Status, "instance %s: %s", id, in.LastError)
	}
	sigStop()
	<-sigDone
	var stale int64
	for _, e := range engines {
		require.NoError(t, e.Stop(ctx))
		stale += e.StaleOutcomes()
	}
	require.Zero(t, stale, "no live engine lost a claim")

	// The outside log: no key ever ran over its K. A step of the killed
	// child that never logged its end ended when the process died.
	limits, err := gate.NewLimits(enginetest.StressLimits)
	require.NoError(t, err)
	type event struct {
		at     time.Time
		delta  int
		worker string
	}
	byKey := map[string][]event{}
	rows, err := admin.Query(ctx, "SELECT key, worker, started, ended FROM fleet_log")
	require.NoError(t, err)
	defer rows.Close()
	var logged, open int
	for rows.Next() {
		var key, worker string
		var started time.Time
		var ended *time.Time
		require.NoError(t, rows.Scan(&key, &worker, &started, &ended))
		logged++
		if ended == nil {
			require.Equal(t, "child", worker, "only the killed process leaves a step open (key %s, started %s, killed at %s)",
				key, started.Format(time.StampMicro), killedAt.Format(time.StampMicro))
			open++
			ended = &killedAt
		}
		byKey[key] = append(byKey[key], event{started, +1, worker}, event{*ended, -1, worker})
	}
	require.NoError(t, rows.Err())
	maxSeen := map[string]int{}
	for key, evs := range byKey {
		sort.Slice(evs, func(i, j int) bool {
			if !evs[i].at.Equal(evs[j].at) {
				return evs[i].at.Before(evs[j].at)
			}
			return evs[i].delta < evs[j].delta // an end before a start at the same instant
		})
		cur := 0
		running := map[string]int{}
		for _, ev := range evs {
			cur += ev.delta
			running[ev.worker] += ev.delta
			maxSeen[key] = max(maxSeen[key], cur)
			require.LessOrEqual(t, cur, limits.K(key), "key %s ran %d at once (K = %d) at %s; running per worker: %v", key, cur, limits.K(key), ev.at, running)
		}
	}
	t.Logf("%d keyed steps logged (%d cut by the kill); max at once: bulk:0=%d api:0=%d acct:0=%d", logged, open, maxSeen["bulk:0"], maxSeen["api:0"], maxSeen["acct:0"])
	require.GreaterOrEqual(t, maxSeen["bulk:0"], 4, "the bulk gate ran several at once, not one")

	// One reconciler sweep makes every counter equal the executing-rows truth.
	st, err := postgres.New(ctx, admin, postgres.Options{Schema: schema})
	require.NoError(t, err)
	rep, err := st.Reconcile(ctx, 0, time.Time{})
	require.NoError(t, err)
	t.Logf("final reconcile: %+v", rep)
	var wrong int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM key_slots s WHERE s.available <> s.capacity - (
		SELECT count(*) FROM instances i WHERE i.status = 'executing' AND i.key = s.key AND i.key_shard = s.shard)`).Scan(&wrong))
	require.Zero(t, wrong, "counters equal capacity minus executing rows")
	enginetest.CheckKeysFree(t, st, fleetOpts)
}
