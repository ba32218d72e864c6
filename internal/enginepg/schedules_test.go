package enginepg

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/transitions"
)

// Several engines share one database and run the same schedules; each
// tick must start exactly one instance, whatever happens to the engines.

type tickState struct {
	Tick time.Time `json:"tick"`
}

func tickStateAt(tick time.Time) (any, error) { return tickState{Tick: tick}, nil }

// tickWorkflow runs body in its only step.
func tickWorkflow(name string, body func()) *durable.Workflow[tickState] {
	return durable.NewWorkflow[tickState](name, "run", durable.WorkflowOptions{}).
		Step("run", func(ctx steps.Context, s tickState) (transitions.Transition, error) {
			body()
			return transitions.Done(s.Tick), nil
		})
}

// fleetEngine is one engine of a fleet: its own store handle on the shared schema.
func fleetEngine(t *testing.T, st *postgres.Store, worker string, sc durable.Schedule, wf durable.Definition) *durable.Engine {
	t.Helper()
	return engine(t, durable.Config{Store: st, WorkerID: worker, Schedules: []durable.Schedule{sc},
		Queues: map[string]int{"default": 4}}, wf)
}

// ticksOf returns the ticks of the schedule's instances, in order, and
// fails the test if one tick has two instances.
func ticksOf(t *testing.T, st store.Store, name string) []time.Time {
	t.Helper()
	all, err := st.List(context.Background(), store.ListFilter{})
	require.NoError(t, err)
	seen := map[string]bool{}
	var ticks []time.Time
	for _, in := range all {
		rest, ok := strings.CutPrefix(in.UniqueKey, "schedule:"+name+":")
		if !ok {
			continue
		}
		require.False(t, seen[rest], "tick %s started twice", rest)
		seen[rest] = true
		tick, err := time.Parse(time.RFC3339, rest)
		require.NoError(t, err)
		ticks = append(ticks, tick)
	}
	slices.SortFunc(ticks, time.Time.Compare)
	return ticks
}

func stopEngine(t *testing.T, e *durable.Engine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, e.Stop(ctx))
}

func TestScheduleFleetStartsOneInstancePerTick(t *testing.T) {
	_, pool := pgStore(t)
	schema := pgtest.SchemaOf(pool)
	var runs atomic.Int64
	wf := tickWorkflow("tick", func() { runs.Add(1) })
	sc := durable.Schedule{Name: "every-second", Workflow: "tick", Cron: "@every 1s", StateAt: tickStateAt,
		Grace: 900 * time.Millisecond}
	handle := func() *postgres.Store {
		st, err := postgres.New(context.Background(), pool, postgres.Options{Schema: schema})
		require.NoError(t, err)
		return st
	}
	var engines []*durable.Engine
	for _, w := range []string{"a", "b", "c"} {
		e := fleetEngine(t, handle(), "sched-"+w, sc, wf)
		startEngine(t, e)
		engines = append(engines, e)
	}
	time.Sleep(3 * time.Second)
	// One engine is stopped mid-schedule and comes back 1.5 s later.
	stopEngine(t, engines[0])
	time.Sleep(1500 * time.Millisecond)
	again := fleetEngine(t, handle(), "sched-a", sc, wf)
	startEngine(t, again)
	time.Sleep(3 * time.Second)
	for _, e := range []*durable.Engine{engines[1], engines[2], again} {
		stopEngine(t, e)
	}

	st := handle()
	ticks := ticksOf(t, st, "every-second")
	require.GreaterOrEqual(t, len(ticks), 6, "about 7.5 s of @every 1s: %v", ticks)
	for i := 1; i < len(ticks); i++ {
		assert.Equal(t, time.Second, ticks[i].Sub(ticks[i-1]), "no tick missed between %s and %s", ticks[i-1], ticks[i])
	}
	scs, err := st.ListSchedules(context.Background())
	require.NoError(t, err)
	require.Len(t, scs, 1)
	assert.Equal(t, ticks[len(ticks)-1], scs[0].LastTick, "the last tick is recorded")
}

// TestScheduleRestartAfterAnOutage stops every engine for several ticks and
// restarts one 600 ms after a tick: the ticks of the outage never run as a
// burst; CatchUpSkip runs none of them, CatchUpOnce runs one at once.
func TestScheduleRestartAfterAnOutage(t *testing.T) {
	for _, catchUp := range []durable.Schedule{{CatchUp: durable.CatchUpSkip}, {CatchUp: durable.CatchUpOnce}} {
		t.Run(string(catchUp.CatchUp), func(t *testing.T) {
			st, pool := pgStore(t)
			schema := pgtest.SchemaOf(pool)
			wf := tickWorkflow("tick", func() {})
			sc := catchUp
			sc.Name, sc.Workflow, sc.Cron, sc.StateAt, sc.Grace = "s", "tick", "@every 1s", tickStateAt, 250*time.Millisecond
			handle := func() *postgres.Store {
				h, err := postgres.New(context.Background(), pool, postgres.Options{Schema: schema})
				require.NoError(t, err)
				return h
			}
			a, b := fleetEngine(t, handle(), "out-a", sc, wf), fleetEngine(t, handle(), "out-b", sc, wf)
			startEngine(t, a)
			startEngine(t, b)
			time.Sleep(2500 * time.Millisecond)
			stopEngine(t, a)
			stopEngine(t, b)
			before := ticksOf(t, st, "s")
			require.NotEmpty(t, before)
			lastBefore := before[len(before)-1]

			// Down for more than three ticks; back 600 ms after a whole second.
			time.Sleep(3 * time.Second)
			now := time.Now()
			time.Sleep(now.Truncate(time.Second).Add(time.Second + 600*time.Millisecond).Sub(now))
			restarted := time.Now()
			c := fleetEngine(t, handle(), "out-a", sc, wf)
			startEngine(t, c)
			time.Sleep(300 * time.Millisecond)
			// The missed window's ticks are the ones after the last before
			// the outage and not after the restart: a tick due since the
			// restart is on time, whenever a loaded machine gets to it.
			var window []time.Time
			for _, tk := range ticksOf(t, st, "s") {
				if tk.After(lastBefore) && !tk.After(restarted) {
					window = append(window, tk)
				}
			}
			if sc.CatchUp == durable.CatchUpOnce {
				require.Len(t, window, 1, "one instance for the missed window: %v", window)
				assert.WithinDuration(t, restarted.Truncate(time.Second), window[0], 1100*time.Millisecond, "as its latest tick")
			} else {
				require.Empty(t, window, "missed ticks are skipped: %v", window)
			}
			time.Sleep(1500 * time.Millisecond)
			stopEngine(t, c)
			var after int
			for _, tk := range ticksOf(t, st, "s") {
				if tk.After(restarted) {
					after++
				}
			}
			assert.GreaterOrEqual(t, after, 1, "ticks after the restart run on time")
		})
	}
}

func TestScheduleOverlapPoliciesOnAFleet(t *testing.T) {
	for _, c := range []struct {
		overlap durable.Schedule
		maxRun  func(t *testing.T, max int64)
		ticks   func(t *testing.T, n int)
	}{
		{durable.Schedule{Overlap: durable.OverlapAllow},
			func(t *testing.T, max int64) { assert.Greater(t, max, int64(1), "runs overlap") },
			func(t *testing.T, n int) { assert.GreaterOrEqual(t, n, 4) }},
		{durable.Schedule{Overlap: durable.OverlapSkip},
			func(t *testing.T, max int64) { assert.Equal(t, int64(1), max, "never two runs at once") },
			func(t *testing.T, n int) { assert.LessOrEqual(t, n, 3, "ticks during a run are skipped") }},
		{durable.Schedule{Overlap: durable.OverlapQueue},
			func(t *testing.T, max int64) { assert.Equal(t, int64(1), max, "never two runs at once") },
			func(t *testing.T, n int) {
				assert.GreaterOrEqual(t, n, 4, "every tick starts an instance, queued behind the key")
			}},
	} {
		t.Run(string(c.overlap.Overlap), func(t *testing.T) {
			st, pool := pgStore(t)
			schema := pgtest.SchemaOf(pool)
			var running, maxRunning atomic.Int64
			wf := tickWorkflow("slow", func() {
				n := running.Add(1)
				for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
				}
				time.Sleep(2200 * time.Millisecond)
				running.Add(-1)
			})
			sc := c.overlap
			sc.Name, sc.Workflow, sc.Cron, sc.StateAt, sc.Grace = "slow", "slow", "@every 1s", tickStateAt, 900*time.Millisecond
			var engines []*durable.Engine
			for _, w := range []string{"a", "b"} {
				h, err := postgres.New(context.Background(), pool, postgres.Options{Schema: schema})
				require.NoError(t, err)
				e := fleetEngine(t, h, "ov-"+w, sc, wf)
				startEngine(t, e)
				engines = append(engines, e)
			}
			time.Sleep(5500 * time.Millisecond)
			for _, e := range engines {
				stopEngine(t, e)
			}
			c.maxRun(t, maxRunning.Load())
			c.ticks(t, len(ticksOf(t, st, "slow")))
		})
	}
}
