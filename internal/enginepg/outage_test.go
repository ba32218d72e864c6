package enginepg

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/pgcluster"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/transitions"
)

type outageState struct {
	N int `json:"n"`
}

// TestDatabaseOutage: engineSurvivesOutage stops the database under a running
// engine while steps are in flight, keeps it down for a few seconds, and
// starts it again. The engine must keep trying with backoff, log the outage
// once (not once per attempt or per loop) and its end once, commit the
// outcomes of the steps that ran through the outage, and finish every
// instance without being restarted. An Insert during the outage fails with
// an error and loses nothing that was inserted before.
func TestDatabaseOutage(t *testing.T) {
	c := throwaway(t)
	t.Run("engine resumes", func(t *testing.T) { engineSurvivesOutage(t, c) })
	t.Run("wait rides it out", func(t *testing.T) { waitRidesOutOutage(t, c) })
	t.Run("stop keeps its deadline", func(t *testing.T) { stopDuringOutage(t, c) })
}

func engineSurvivesOutage(t *testing.T, c *pgcluster.Cluster) {
	ctx := waitCtx(t, 120*time.Second)
	pool, err := pgxpool.New(ctx, c.URL(""))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = postgres.Migrate(ctx, pool, "outage")
	require.NoError(t, err)
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: "outage"})
	require.NoError(t, err)

	var running, finished atomic.Int64
	wf := durable.NewWorkflow[outageState]("outage", "work", durable.WorkflowOptions{Retry: fastRetry(3)})
	wf.Step("work", func(ctx steps.Context, s outageState) (transitions.Transition, error) {
		running.Add(1)
		defer running.Add(-1)
		time.Sleep(400 * time.Millisecond) // long enough to straddle the stop
		s.N++
		finished.Add(1)
		if s.N < 3 {
			return transitions.Next("work", s), nil
		}
		return transitions.Done(s.N), nil
	})
	var logs logBuffer
	e := engine(t, durable.Config{Store: st, Logger: logs.logger(slog.LevelInfo), WorkerID: "outage-worker",
		Lease: 20 * time.Second, HeartbeatInterval: 200 * time.Millisecond, ReconcileInterval: 300 * time.Millisecond,
		Queues: map[string]int{"default": 4}}, wf)
	startEngine(t, e)

	var ids []string
	for i := range 12 {
		key := gate.ConcurrencyKey{}
		if i%3 == 0 {
			key = gate.Identity("acct", "a")
		}
		id, err := e.Insert(ctx, "outage", outageState{}, durable.InsertOptions{Key: key})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	require.Eventually(t, func() bool { return running.Load() > 0 && finished.Load() > 2 }, 20*time.Second, 10*time.Millisecond)

	require.NoError(t, c.StopServer())
	stoppedAt := finished.Load()
	_, err = e.Insert(ctx, "outage", outageState{}, durable.InsertOptions{})
	require.Error(t, err, "an insert while the database is down fails")
	time.Sleep(3 * time.Second) // every loop fails many times meanwhile
	assert.Equal(t, 1, logs.Count("store unavailable"), "the outage is logged once, not per attempt:\n%s", logs.String())
	assert.Zero(t, logs.Count("store available again"))

	require.NoError(t, c.StartServer(ctx))
	for _, id := range ids {
		n, err := durable.Result[int](ctx, e, id)
		require.NoError(t, err, "instance %s finishes after the outage without a restart", id)
		assert.Equal(t, 3, n)
	}
	assert.Greater(t, finished.Load(), stoppedAt, "steps ran after the outage")
	late, err := e.Insert(ctx, "outage", outageState{}, durable.InsertOptions{})
	require.NoError(t, err, "inserts work again")
	_, err = durable.Result[int](ctx, e, late)
	require.NoError(t, err)

	require.Eventually(t, func() bool { return logs.Count("store available again") == 1 }, 10*time.Second, 20*time.Millisecond,
		"the recovery is logged once:\n%s", logs.String())
	assert.Equal(t, 1, logs.Count("store unavailable"), "one outage, one line:\n%s", logs.String())
	// The lease outlived the outage: no claim was lost, so no step ran
	// twice (a lost claim's step runs again once the reaper gives its row
	// back). Stale outcomes are logged, not asserted: a flush whose commit
	// landed as the server went down finds its outcomes applied when it is
	// sent again. The engine tells those by the step history, which this
	// store does not keep, or by the rows (landedEarlier), so a stale count
	// here is not a lost claim.
	assert.EqualValues(t, 3*(len(ids)+1), finished.Load(), "every step ran once: no claim was lost")
	t.Logf("stale outcomes: %d", e.StaleOutcomes())

	all, err := st.List(ctx, store.ListFilter{Limit: 100})
	require.NoError(t, err)
	assert.Len(t, all, len(ids)+1, "the insert that failed during the outage left nothing behind")
	for _, in := range all {
		assert.Equal(t, store.StatusDone, in.Status)
	}
	t.Logf("log:\n%s", logs.String())
}

// waitRidesOutOutage checks that Wait keeps waiting while the database is
// down instead of returning the first connection error.
func waitRidesOutOutage(t *testing.T, c *pgcluster.Cluster) {
	ctx := waitCtx(t, 120*time.Second)
	pool, err := pgxpool.New(ctx, c.URL(""))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = postgres.Migrate(ctx, pool, "wait")
	require.NoError(t, err)
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: "wait"})
	require.NoError(t, err)
	wf := durable.NewWorkflow[outageState]("gated", "work", durable.WorkflowOptions{})
	wf.Step("work", func(ctx steps.Context, s outageState) (transitions.Transition, error) {
		return transitions.Done(7), nil
	})
	e := engine(t, durable.Config{Store: st, Lease: 20 * time.Second}, wf)
	id, err := e.Insert(ctx, "gated", outageState{}, durable.InsertOptions{})
	require.NoError(t, err)

	res := make(chan error, 1)
	go func() {
		n, err := durable.Result[int](ctx, e, id)
		if err == nil && n != 7 {
			err = assert.AnError
		}
		res <- err
	}()
	require.NoError(t, c.StopServer())
	time.Sleep(time.Second)
	select {
	case err := <-res:
		t.Fatalf("Wait returned during the outage: %v", err)
	default:
	}
	require.NoError(t, c.StartServer(ctx))
	startEngine(t, e)
	select {
	case err := <-res:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not return after the database came back")
	}

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	require.NoError(t, c.StopServer())
	_, err = e.Wait(short, id)
	require.ErrorIs(t, err, context.DeadlineExceeded, "with the database down, Wait waits until its context ends")
	assert.Contains(t, err.Error(), "last store error", "and says why it could not tell")
	require.NoError(t, c.StartServer(ctx))
}

// stopDuringOutage stops an engine whose last outcome cannot be committed
// because the database is down: Stop must return by its deadline with an
// error (it used to retry the flush for as long as the outage lasted), and
// the step must run again, on another engine, once the database is back.
func stopDuringOutage(t *testing.T, c *pgcluster.Cluster) {
	ctx := waitCtx(t, 90*time.Second)
	pool, err := pgxpool.New(ctx, c.URL(""))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = postgres.Migrate(ctx, pool, "stop")
	require.NoError(t, err)
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: "stop"})
	require.NoError(t, err)
	running := make(chan struct{}, 1)
	release := make(chan struct{})
	var runs atomic.Int64
	wf := durable.NewWorkflow[outageState]("stopper", "work", durable.WorkflowOptions{})
	wf.Step("work", func(ctx steps.Context, s outageState) (transitions.Transition, error) {
		if runs.Add(1) == 1 {
			running <- struct{}{}
			<-release
		}
		return transitions.Done(5), nil
	})
	first := engine(t, durable.Config{Store: st, WorkerID: "first", Lease: 2 * time.Second}, wf)
	require.NoError(t, first.Start(ctx))
	id, err := first.Insert(ctx, "stopper", outageState{}, durable.InsertOptions{})
	require.NoError(t, err)
	<-running
	require.NoError(t, c.StopServer())
	close(release) // the step finishes while the database is down

	stopCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	began := time.Now()
	err = first.Stop(stopCtx)
	require.Error(t, err, "the outcome could not be committed")
	assert.Contains(t, err.Error(), "not committed by the deadline")
	assert.Less(t, time.Since(began), 5*time.Second, "Stop kept its deadline")

	require.NoError(t, c.StartServer(ctx))
	second := engine(t, durable.Config{Store: st, WorkerID: "second", Lease: 2 * time.Second}, wf)
	startEngine(t, second)
	n, err := durable.Result[int](ctx, second, id)
	require.NoError(t, err, "the step runs again once its lease expired")
	assert.Equal(t, 5, n)
	assert.Equal(t, int64(2), runs.Load(), "at-least-once: the uncommitted run was repeated")
}
