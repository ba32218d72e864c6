package durable_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/transitions"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// backends runs fn once per store backend, each on a fresh store.
func backends(t *testing.T, fn func(t *testing.T, st store.Store)) {
	t.Run("memory", func(t *testing.T) {
		st := memory.New(memory.Options{})
		t.Cleanup(func() { _ = st.Close() })
		fn(t, st)
	})
	t.Run("postgres", func(t *testing.T) {
		fn(t, pgStore(t))
	})
}

func pgStore(t *testing.T) store.Store {
	t.Helper()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	schema := pgtest.SchemaOf(pool)
	_, err := postgres.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: schema, History: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// gateWorkflow holds its step until release is closed (or its context ends).
func gateWorkflow(release <-chan struct{}, running *atomic.Int32) *durable.Workflow[counter] {
	wf := durable.NewWorkflow[counter]("hold", "hold", durable.WorkflowOptions{Retry: fastRetry(1)})
	wf.Step("hold", func(ctx steps.Context, s counter) (transitions.Transition, error) {
		running.Add(1)
		defer running.Add(-1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return transitions.Done(s.N), nil
	})
	return wf
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func queueOf(h durable.Health, name string) store.QueueHealth {
	for _, q := range h.Queues {
		if q.Queue == name {
			return q
		}
	}
	return store.QueueHealth{}
}

func TestEngineHealth(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := waitCtx(t)
		release := make(chan struct{})
		var running atomic.Int32
		e := newEngine(t, durable.Config{Store: st, Limits: []gate.Limit{{Name: "stripe", Limit: 1}}, Queues: map[string]int{"default": 4}},
			gateWorkflow(release, &running), counterWorkflow())
		start(t, e)
		t.Cleanup(func() {
			select {
			case <-release:
			default:
				close(release)
			}
		})

		// Three holders of one K = 1 gate key: one executes, two are blocked.
		for range 3 {
			_, err := e.Insert(ctx, "hold", counter{N: 1}, durable.InsertOptions{Key: gate.Gate("stripe", "secret-tenant")})
			require.NoError(t, err)
		}
		// An identity key the stripe limit captures: the engine warns.
		_, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Identity("stripe", "secret-id")})
		require.NoError(t, err)

		var h durable.Health
		eventually(t, "one executing and two blocked", func() bool {
			h, err = e.Health(ctx)
			require.NoError(t, err)
			q := queueOf(h, "default")
			return q.Executing == 1 && q.Blocked >= 2 && running.Load() == 1
		})
		require.Len(t, h.Gates, 1)
		g := h.Gates[0]
		assert.Equal(t, store.GateHealth{Name: "stripe", Limit: 1, Shards: 1, Active: 1, BlockedReady: g.BlockedReady,
			SaturatedKeys: 1, HighestKeyActive: 1}, g)
		assert.GreaterOrEqual(t, g.BlockedReady, int64(2))
		require.NotEmpty(t, h.Warnings)
		assert.Equal(t, gate.IdentityCaptured, h.Warnings[0].Kind)
		assert.Equal(t, "stripe", h.Warnings[0].Name)
		assert.Nil(t, h.LastReconcile, "no sweep yet")
		assert.False(t, h.At.IsZero())

		rep, err := e.Reconcile(ctx)
		require.NoError(t, err)
		h, err = e.Health(ctx)
		require.NoError(t, err)
		require.NotNil(t, h.LastReconcile)
		assert.Equal(t, rep.Drift, h.LastReconcile.Drift)
		assert.Equal(t, 0, h.LastReconcile.Drift, "no crash, no drift")

		b, err := json.Marshal(h)
		require.NoError(t, err)
		var fields map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(b, &fields))
		for _, f := range []string{"at", "queues", "gates", "rate_limits", "warnings", "last_reconcile", "reconcile_totals", "stale_outcomes", "skipped",
			"schedules", "handed_back", "handed_back_capped", "unworked_queues", "paused_queues", "oldest_snapshot"} {
			assert.Contains(t, fields, f)
		}
		assert.Len(t, fields, 15, "no undocumented field: %s", b)
		assert.Equal(t, "[]", string(fields["unworked_queues"]), "the engine works default: an empty list, not null")
		assert.Equal(t, "[]", string(fields["paused_queues"]), "an empty list, not null")
		assert.Equal(t, "[]", string(fields["schedules"]), "an empty list, not null")
		assert.Equal(t, "[]", string(fields["handed_back"]), "an empty list, not null")
		assert.Equal(t, "[]", string(fields["skipped"]), "an empty list, not null")
		assert.NotContains(t, string(b), "secret", "no key id in health")

		close(release)
		eventually(t, "everything done", func() bool {
			h, err = e.Health(ctx)
			require.NoError(t, err)
			q := queueOf(h, "default")
			return q.Executing == 0 && q.Blocked == 0 && q.Ready == 0
		})
	})
}

func TestEngineHealthReportsReconcilerDrift(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := waitCtx(t)
		e := newEngine(t, durable.Config{Store: st, Limits: []gate.Limit{{Name: "stripe", Limit: 2}}}, counterWorkflow())
		// Sync the limits as Start would, without running the scheduler.
		_, err := st.SyncLimits(ctx, []gate.Limit{{Name: "stripe", Limit: 2}})
		require.NoError(t, err)
		_, err = e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Gate("stripe", "t")})
		require.NoError(t, err)
		// A worker claims and dies; the reaper takes the claim back without
		// crediting the gate (a crash path): one slot of drift.
		res, err := st.Claim(ctx, store.ClaimRequest{Queue: durable.DefaultQueue, Worker: "ghost", Limit: 1, Lease: time.Millisecond})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 1)
		eventually(t, "the ghost's lease to be reaped", func() bool {
			n, err := st.Reap(ctx, time.Time{})
			require.NoError(t, err)
			return n == 1
		})
		h, err := e.Health(ctx)
		require.NoError(t, err)
		assert.Nil(t, h.LastReconcile)
		assert.Equal(t, durable.ReconcileHealth{}, h.ReconcileTotals)

		rep, err := e.Reconcile(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Drift)
		h, err = e.Health(ctx)
		require.NoError(t, err)
		require.NotNil(t, h.LastReconcile)
		assert.Equal(t, 1, h.LastReconcile.Drift)
		assert.Equal(t, 1, h.LastReconcile.CountersRepaired)
		assert.Equal(t, 1, h.ReconcileTotals.Drift)

		_, err = e.Reconcile(ctx)
		require.NoError(t, err)
		h, err = e.Health(ctx)
		require.NoError(t, err)
		assert.Equal(t, 0, h.LastReconcile.Drift, "the last sweep found nothing more")
		assert.Equal(t, 1, h.ReconcileTotals.Drift, "the totals remember")
	})
}

func TestEngineHealthCountsStaleOutcomes(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := waitCtx(t)
		release := make(chan struct{})
		var running atomic.Int32
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		e := newEngine(t, durable.Config{Store: st, MeterProvider: mp, Lease: 2 * time.Hour, HeartbeatInterval: time.Hour}, gateWorkflow(release, &running))
		start(t, e)
		_, err := e.Insert(ctx, "hold", counter{}, durable.InsertOptions{})
		require.NoError(t, err)
		eventually(t, "the step to run", func() bool { return running.Load() == 1 })
		// The claim is reaped (as if its lease had expired): the running
		// step's outcome is stale. A reap skips locked rows, and the
		// engine's next claim may hold the row's lock for a moment (a
		// window keeps the lock of a row it saw ready and found claimed
		// once locked: see the postgres store's sqlPromote).
		eventually(t, "the claim to be reaped", func() bool {
			n, err := st.Reap(ctx, time.Now().Add(3*time.Hour))
			require.NoError(t, err)
			require.LessOrEqual(t, n, 1)
			return n == 1
		})
		close(release)
		eventually(t, "the stale outcome", func() bool { return e.StaleOutcomes() == 1 })
		h, err := e.Health(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(1), h.StaleOutcomes)

		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(ctx, &rm))
		assert.Equal(t, int64(1), findSum(rm, "durable.outcomes.stale"))
	})
}

// countingStore counts Health calls.
type countingStore struct {
	store.Store
	mu    sync.Mutex
	calls int
}

func (c *countingStore) Health(ctx context.Context, now time.Time) (store.Health, error) {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	return c.Store.Health(ctx, now)
}

func (c *countingStore) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// gauges returns every int64 gauge point by metric name and attribute set.
func gauges(t *testing.T, rm metricdata.ResourceMetrics) map[string]map[attribute.Distinct]metricdata.DataPoint[int64] {
	t.Helper()
	out := map[string]map[attribute.Distinct]metricdata.DataPoint[int64]{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok {
				out[m.Name] = map[attribute.Distinct]metricdata.DataPoint[int64]{}
				for _, p := range g.DataPoints {
					out[m.Name][p.Attributes.Equivalent()] = p
				}
			}
		}
	}
	return out
}

func gaugeValue(t *testing.T, gs map[string]map[attribute.Distinct]metricdata.DataPoint[int64], name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	set := attribute.NewSet(attrs...)
	p, ok := gs[name][set.Equivalent()]
	require.True(t, ok, "gauge %s%v observed; got %v", name, attrs, gs[name])
	return p.Value
}

func TestGaugesReadACachedHealth(t *testing.T) {
	ctx := waitCtx(t)
	st := &countingStore{Store: memory.New(memory.Options{})}
	_, err := st.SyncLimits(ctx, []gate.Limit{{Name: "stripe", Limit: 2}})
	require.NoError(t, err)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEngine(t, durable.Config{Store: st, MeterProvider: mp, HealthInterval: time.Hour,
		Limits: []gate.Limit{{Name: "stripe", Limit: 2}}}, counterWorkflow())

	const secret = "tenant-secret-9931"
	for range 5 {
		_, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Gate("stripe", secret)})
		require.NoError(t, err)
	}
	res, err := st.Claim(ctx, store.ClaimRequest{Queue: durable.DefaultQueue, Worker: "w", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 2, "the gate admits two")

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	gs := gauges(t, rm)
	q := durable.AttrQueue.String(durable.DefaultQueue)
	assert.Equal(t, int64(2), gaugeValue(t, gs, "durable.queue.depth", q, durable.AttrState.String("executing")))
	assert.Equal(t, int64(3), gaugeValue(t, gs, "durable.queue.depth", q, durable.AttrState.String("blocked")))
	assert.Equal(t, int64(0), gaugeValue(t, gs, "durable.queue.depth", q, durable.AttrState.String("ready")))
	for _, s := range []string{"scheduled", "awaiting", "failed"} {
		assert.Equal(t, int64(0), gaugeValue(t, gs, "durable.queue.depth", q, durable.AttrState.String(s)))
	}
	g := durable.AttrGate.String("stripe")
	assert.Equal(t, int64(2), gaugeValue(t, gs, "durable.gate.limit", g))
	assert.Equal(t, int64(2), gaugeValue(t, gs, "durable.gate.active", g))
	assert.Equal(t, int64(3), gaugeValue(t, gs, "durable.gate.blocked", g))
	assert.Equal(t, int64(1), gaugeValue(t, gs, "durable.gate.saturated_keys", g))
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "durable.queue.oldest_ready" {
				found = true
			}
			for _, set := range attributeSets(m) {
				for _, kv := range set.ToSlice() {
					assert.NotContains(t, kv.Value.String(), secret, "metric %s carries a key id", m.Name)
				}
			}
		}
	}
	assert.True(t, found, "durable.queue.oldest_ready observed")
	assert.Equal(t, 1, st.count())

	// Collections within HealthInterval reuse the snapshot.
	for range 5 {
		require.NoError(t, reader.Collect(ctx, &rm))
	}
	assert.Equal(t, 1, st.count(), "one store Health call per interval, not per collection")
	assert.Equal(t, int64(3), gaugeValue(t, gauges(t, rm), "durable.gate.blocked", g))
}

func TestGaugesRefreshAfterTheInterval(t *testing.T) {
	ctx := waitCtx(t)
	st := &countingStore{Store: memory.New(memory.Options{})}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEngine(t, durable.Config{Store: st, MeterProvider: mp, HealthInterval: 20 * time.Millisecond}, counterWorkflow())
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	_, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	time.Sleep(30 * time.Millisecond)
	require.NoError(t, reader.Collect(ctx, &rm))
	assert.Equal(t, 2, st.count())
	assert.Equal(t, int64(1), gaugeValue(t, gauges(t, rm), "durable.queue.depth",
		durable.AttrQueue.String(durable.DefaultQueue), durable.AttrState.String("ready")))
}

func TestNegativeHealthIntervalRegistersNoGauges(t *testing.T) {
	ctx := waitCtx(t)
	st := &countingStore{Store: memory.New(memory.Options{})}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEngine(t, durable.Config{Store: st, MeterProvider: mp, HealthInterval: -1}, counterWorkflow())
	_, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	assert.Empty(t, gauges(t, rm))
	assert.Equal(t, 0, st.count(), "no Health call without gauges")
	_, err = e.Health(ctx)
	require.NoError(t, err, "Health itself still works")
}

// TestPolicyGaugesCarryQueueNamesOnly observes a queue policy's pressure
// as gauges: its limit, active rows, the ready rows its full MaxActive
// holds back and its keys at MaxActivePerKey with work waiting, each with
// the queue name as its only attribute.
func TestPolicyGaugesCarryQueueNamesOnly(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := waitCtx(t)
		_, err := st.SyncConcurrencyPolicies(ctx, "ns", []store.ConcurrencyPolicy{{Queue: durable.DefaultQueue, MaxActive: 2, MaxActivePerKey: 1}}, store.SyncOptions{})
		require.NoError(t, err)
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		e := newEngine(t, durable.Config{Store: st, MeterProvider: mp, HealthInterval: time.Hour}, counterWorkflow())
		const secret = "tenant-secret-4417"
		for range 2 {
			_, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Identity("account", secret)})
			require.NoError(t, err)
		}
		// Keyless rows after the keyed ones (priority), so that every
		// store sees the key's second row before the queue is full.
		for range 3 {
			_, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{Priority: 1})
			require.NoError(t, err)
		}
		res, err := st.Claim(ctx, store.ClaimRequest{Queue: durable.DefaultQueue, Worker: "w", Limit: 10, Lease: time.Hour})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 2, "MaxActive 2: the key's first row and a keyless row")

		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(ctx, &rm))
		gs := gauges(t, rm)
		q := durable.AttrQueue.String(durable.DefaultQueue)
		assert.Equal(t, int64(2), gaugeValue(t, gs, "durable.policy.limit", q))
		assert.Equal(t, int64(2), gaugeValue(t, gs, "durable.policy.active", q))
		assert.Equal(t, int64(2), gaugeValue(t, gs, "durable.policy.blocked_ready", q), "two keyless rows wait for MaxActive")
		assert.Equal(t, int64(1), gaugeValue(t, gs, "durable.policy.saturated_keys", q), "the key at its budget with a row waiting")
		for _, name := range []string{"durable.policy.limit", "durable.policy.active", "durable.policy.blocked_ready", "durable.policy.saturated_keys"} {
			require.Len(t, gs[name], 1, "%s: one point, for the one queue with a policy", name)
			for _, p := range gs[name] {
				assert.Equal(t, []attribute.KeyValue{q}, p.Attributes.ToSlice(), "%s carries the queue name only", name)
			}
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				for _, set := range attributeSets(m) {
					for _, kv := range set.ToSlice() {
						assert.NotContains(t, kv.Value.String(), secret, "metric %s carries a key id", m.Name)
					}
				}
			}
		}
	})
}

// TestHandBacksShowInHealthAndLogOnce: a worker that claims instances at a
// step its version of their workflow does not have (a deploy that renamed
// it) hands them back; the store's Health counts them per version, their
// wait is aged from when they first became ready, and the worker logs a
// warning once per version, not once per hand-back. (Rows of a version it
// does not register it never claims: TestUnregisteredVersionIsNeverClaimed.)
func TestHandBacksShowInHealthAndLogOnce(t *testing.T) {
	ctx := waitCtx(t)
	st := memory.New(memory.Options{})
	def := func(step string) durable.Definition {
		wf := durable.NewWorkflow[counter]("billing", step, durable.WorkflowOptions{})
		wf.Step(step, func(ctx steps.Context, s counter) (transitions.Transition, error) {
			return transitions.Done(s.N), nil
		})
		return wf
	}
	newer := newEngine(t, durable.Config{Store: st, WorkerID: "newer"}, def("b")) // never started
	for range 3 {
		_, err := newer.Insert(ctx, "billing", counter{}, durable.InsertOptions{})
		require.NoError(t, err)
	}

	var logs bytes.Buffer
	older := newEngine(t, durable.Config{Store: st, WorkerID: "older",
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}, def("a"))
	start(t, older)
	var h durable.Health
	// The worker counts a hand-back (Skipped) when its step is skipped,
	// before the flusher commits it: wait for the store to count them too.
	eventually(t, "three hand-backs", func() bool {
		var err error
		h, err = older.Health(ctx)
		require.NoError(t, err)
		return len(h.Skipped) == 1 && h.Skipped[0].Count == 3 && len(h.HandedBack) == 1 && h.HandedBack[0].Count == 3
	})
	assert.Equal(t, []store.HandBackHealth{{Workflow: "billing", Version: 1, Count: 3}}, h.HandedBack)
	assert.False(t, h.HandedBackCapped)
	q := queueOf(h, "default")
	assert.Equal(t, int64(3), q.Scheduled, "handed back for later")
	assert.Positive(t, q.OldestReady, "aged from when they became ready, though none is due")

	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, older.Stop(stopCtx))
	out := logs.String()
	assert.Equal(t, 1, strings.Count(out, "level=WARN"), "one warning per workflow version:\n%s", out)
	assert.Contains(t, out, "workflow=billing version=1 step=b worker=older")
}

// TestUnregisteredVersionIsNeverClaimed: rows of a workflow version no
// running worker registers (a newer one, inserted by a newer deploy) stay
// ready, unclaimed and untouched, while the older worker runs its own
// version's rows; Health shows them as ready, not handed back.
func TestUnregisteredVersionIsNeverClaimed(t *testing.T) {
	ctx := waitCtx(t)
	st := memory.New(memory.Options{})
	def := func(version int) durable.Definition {
		wf := durable.NewWorkflow[counter]("billing", "a", durable.WorkflowOptions{Version: version})
		wf.Step("a", func(ctx steps.Context, s counter) (transitions.Transition, error) {
			return transitions.Done(s.N), nil
		})
		return wf
	}
	newer := newEngine(t, durable.Config{Store: st, WorkerID: "newer"}, def(2)) // never started
	var v2 []string
	for range 3 {
		id, err := newer.Insert(ctx, "billing", counter{}, durable.InsertOptions{})
		require.NoError(t, err)
		v2 = append(v2, id)
	}
	older := newEngine(t, durable.Config{Store: st, WorkerID: "older"}, def(1))
	mine, err := older.Insert(ctx, "billing", counter{N: 7}, durable.InsertOptions{})
	require.NoError(t, err)
	start(t, older)
	in, err := older.Wait(ctx, mine)
	require.NoError(t, err)
	require.Equal(t, store.StatusDone, in.Status)
	h, err := older.Health(ctx)
	require.NoError(t, err)
	assert.Empty(t, h.HandedBack)
	assert.Equal(t, int64(3), queueOf(h, "default").Ready)
	for _, id := range v2 {
		got, err := older.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, store.StatusReady, got.Status)
		assert.Zero(t, got.Attempt)
		assert.Empty(t, got.LastError, "never claimed, never handed back")
	}
}
