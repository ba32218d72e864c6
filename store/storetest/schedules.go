package storetest

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/periodic"
	"github.com/godurable/godurable/store"
)

func (h *harness) syncSchedules(ns string, defs ...store.Schedule) []store.Schedule {
	h.t.Helper()
	got, err := h.s.SyncSchedules(h.ctx, ns, defs, store.SyncOptions{})
	require.NoError(h.t, err)
	return got
}

func (h *harness) schedule(name string) store.Schedule {
	h.t.Helper()
	all, err := h.s.ListSchedules(h.ctx)
	require.NoError(h.t, err)
	for _, sc := range all {
		if sc.Name == name {
			return sc
		}
	}
	h.t.Fatalf("no stored schedule %q", name)
	return store.Schedule{}
}

func scheduleNames(scs []store.Schedule) []string {
	out := []string{}
	for _, sc := range scs {
		out = append(out, sc.Name)
	}
	return out
}

// every5 is a schedule of workflow "wf" every five minutes.
func every5(name string) store.Schedule {
	return store.Schedule{Name: name, Workflow: "wf", Cron: "@every 5m", Queue: queue}
}

// tickInstance is the instance a tick starts.
func tickInstance(name string, tick time.Time) *store.NewInstance {
	ni := inst("")
	ni.State = json.RawMessage(`{"tick":"` + tick.Format(time.RFC3339) + `"}`)
	ni.UniqueKey = periodic.TickKey(name, tick)
	ni.UniqueStatuses = []store.Status{store.StatusReady, store.StatusBlocked, store.StatusExecuting,
		store.StatusAwaiting, store.StatusChildren, store.StatusDone, store.StatusFailed, store.StatusCanceled}
	return &ni
}

func (h *harness) fire(req store.FireRequest) store.FireResult {
	h.t.Helper()
	res, err := h.s.FireSchedule(h.ctx, req)
	require.NoError(h.t, err)
	return res
}

var scheduleDefTests = []test{
	{"schedules/sync stores definitions with defaults, lists and prunes what a namespace owns", func(h *harness) {
		got := h.syncSchedules("workers", every5("b"), store.Schedule{Name: "a", Workflow: "wf", Cron: "0 9 * * *",
			TimeZone: "America/New_York", Priority: 3, Key: "report:daily", Overlap: periodic.OverlapQueue,
			CatchUp: periodic.CatchUpOnce, Grace: 30 * time.Second, UniqueStatuses: []store.Status{store.StatusDone}})
		require.Equal(h.t, []string{"a", "b"}, scheduleNames(got))
		a := got[0]
		require.Equal(h.t, "workers", a.Namespace)
		require.Equal(h.t, "America/New_York", a.TimeZone)
		require.Equal(h.t, 3, a.Priority)
		require.Equal(h.t, "report:daily", a.Key)
		require.Equal(h.t, periodic.OverlapQueue, a.Overlap)
		require.Equal(h.t, periodic.CatchUpOnce, a.CatchUp)
		require.Equal(h.t, 30*time.Second, a.Grace)
		require.Equal(h.t, []store.Status{store.StatusDone}, a.UniqueStatuses)
		require.False(h.t, a.Anchor.IsZero(), "a new schedule is anchored at the sync")
		require.True(h.t, a.LastTick.IsZero())
		require.Equal(h.t, periodic.OverlapAllow, got[1].Overlap, "default overlap")
		require.Equal(h.t, periodic.CatchUpSkip, got[1].CatchUp, "default catch-up")

		h.syncSchedules("billing", every5("invoices"))
		got = h.syncSchedules("workers", every5("a"))
		require.Equal(h.t, []string{"a"}, scheduleNames(got), "omitted schedules of the namespace are pruned")
		all, err := h.s.ListSchedules(h.ctx)
		require.NoError(h.t, err)
		require.Equal(h.t, []string{"a", "invoices"}, scheduleNames(all))

		got, err = h.s.SyncSchedules(h.ctx, "workers", []store.Schedule{every5("c")}, store.SyncOptions{KeepOmitted: true})
		require.NoError(h.t, err)
		require.Equal(h.t, []string{"a", "c"}, scheduleNames(got), "KeepOmitted adds without pruning")

		got, err = h.s.SyncSchedules(h.ctx, "workers", []store.Schedule{}, store.SyncOptions{DryRun: true})
		require.NoError(h.t, err)
		require.Empty(h.t, got, "a dry run reports the result")
		require.Equal(h.t, []string{"a", "c"}, scheduleNames(h.syncSchedules("workers", every5("a"), every5("c"))), "and stores nothing")

		require.Empty(h.t, h.syncSchedules("workers"), "an explicit empty set removes the namespace's own")
		all, err = h.s.ListSchedules(h.ctx)
		require.NoError(h.t, err)
		require.Equal(h.t, []string{"invoices"}, scheduleNames(all))
	}},
	{"schedules/a definition keeps several keys, in the one order", func(h *harness) {
		sc := every5("multi")
		sc.Key, sc.KeyIntent = "stripe:global", gate.GateIntent
		sc.Also = []store.KeyRef{{Key: "acct:1", Intent: gate.IdentityIntent}}
		got := h.syncSchedules("workers", sc)[0]
		require.Equal(h.t, "acct:1", got.Key, "the identity first, as store.NormalizeKeys orders them")
		require.Equal(h.t, gate.IdentityIntent, got.KeyIntent)
		require.Equal(h.t, []store.KeyRef{{Key: "stripe:global", Intent: gate.GateIntent}}, got.Also)
		require.Equal(h.t, got, h.schedule("multi"))

		same := h.syncSchedules("workers", sc)[0]
		require.Equal(h.t, got.Epoch, same.Epoch, "the same keys are the same definition")
		sc.Also = []store.KeyRef{{Key: "acct:2", Intent: gate.IdentityIntent}}
		changed := h.syncSchedules("workers", sc)[0]
		require.NotEqual(h.t, got.Epoch, changed.Epoch, "another key is another definition")
		require.Equal(h.t, "acct:2", changed.Key)

		sc.Also = []store.KeyRef{{Key: "stripe:global"}}
		_, err := h.s.SyncSchedules(h.ctx, "workers", []store.Schedule{sc}, store.SyncOptions{})
		require.Error(h.t, err, "a key twice")
		sc.Key, sc.Also = "", []store.KeyRef{{Key: "acct:1"}}
		_, err = h.s.SyncSchedules(h.ctx, "workers", []store.Schedule{sc}, store.SyncOptions{})
		require.Error(h.t, err, "other keys without a key")
	}},
	{"schedules/another namespace cannot take a schedule over", func(h *harness) {
		h.syncSchedules("billing", every5("invoices"))
		_, err := h.s.SyncSchedules(h.ctx, "workers", []store.Schedule{every5("mine"), every5("invoices")}, store.SyncOptions{})
		require.ErrorIs(h.t, err, store.ErrNamespaceConflict)
		all, err := h.s.ListSchedules(h.ctx)
		require.NoError(h.t, err)
		require.Equal(h.t, []string{"invoices"}, scheduleNames(all), "nothing of the refused sync is stored")
		require.Equal(h.t, "billing", all[0].Namespace)
	}},
	{"schedules/a bad definition is refused", func(h *harness) {
		for _, bad := range []store.Schedule{
			{Name: "x", Workflow: "wf", Cron: "not cron"},
			{Name: "x", Workflow: "wf", Cron: "@daily", TimeZone: "Nowhere/Land"},
			{Name: "x", Cron: "@daily"},
			{Name: "", Workflow: "wf", Cron: "@daily"},
			{Name: "x", Workflow: "wf", Cron: "@daily", Overlap: "sometimes"},
			{Name: "x", Workflow: "wf", Cron: "@daily", CatchUp: "all"},
		} {
			_, err := h.s.SyncSchedules(h.ctx, "workers", []store.Schedule{bad}, store.SyncOptions{})
			require.Error(h.t, err, "%+v", bad)
		}
		_, err := h.s.SyncSchedules(h.ctx, "workers", []store.Schedule{every5("a"), every5("a")}, store.SyncOptions{})
		require.Error(h.t, err, "a name twice")
		all, err := h.s.ListSchedules(h.ctx)
		require.NoError(h.t, err)
		require.Empty(h.t, all)
	}},
	{"schedules/a fire records the tick and inserts its instance once", func(h *harness) {
		sc := h.syncSchedules("workers", every5("r"))[0]
		tick := at(5 * time.Minute)
		res := h.fire(store.FireRequest{Name: "r", Epoch: sc.Epoch, Tick: tick, Instance: tickInstance("r", tick), Now: tick})
		require.False(h.t, res.Stale)
		require.False(h.t, res.Duplicate)
		require.NotEmpty(h.t, res.Inserted)
		require.Equal(h.t, tick, res.Schedule.LastTick)
		require.Equal(h.t, res.Inserted, res.Schedule.LastInstance)
		require.Equal(h.t, tick, res.Schedule.LastFiredAt)
		require.NotEqual(h.t, sc.Epoch, res.Schedule.Epoch)
		require.Equal(h.t, res.Schedule, h.schedule("r"))
		got := h.get(res.Inserted)
		require.Equal(h.t, periodic.TickKey("r", tick), got.UniqueKey)

		// A second engine that planned from the same epoch records nothing.
		again := h.fire(store.FireRequest{Name: "r", Epoch: sc.Epoch, Tick: tick, Instance: tickInstance("r", tick), Now: tick})
		require.True(h.t, again.Stale)
		require.Empty(h.t, again.Inserted)
		// Nor does a tick that is not after the last, even from the current epoch.
		again = h.fire(store.FireRequest{Name: "r", Epoch: res.Schedule.Epoch, Tick: tick, Instance: tickInstance("r", tick)})
		require.True(h.t, again.Stale)
		list, err := h.s.List(h.ctx, store.ListFilter{Workflow: "wf"})
		require.NoError(h.t, err)
		require.Len(h.t, list, 1, "one instance for the tick")

		// A tick whose instance is already there (its unique key taken) is
		// recorded without a second instance.
		next := at(10 * time.Minute)
		h.insert(*tickInstance("r", next))
		dup := h.fire(store.FireRequest{Name: "r", Epoch: res.Schedule.Epoch, Tick: next, Instance: tickInstance("r", next)})
		require.False(h.t, dup.Stale)
		require.True(h.t, dup.Duplicate)
		list, err = h.s.List(h.ctx, store.ListFilter{Workflow: "wf"})
		require.NoError(h.t, err)
		require.Len(h.t, list, 2)
	}},
	{"schedules/a skipped tick is recorded without an instance", func(h *harness) {
		sc := h.syncSchedules("workers", every5("r"))[0]
		res := h.fire(store.FireRequest{Name: "r", Epoch: sc.Epoch, Tick: at(5 * time.Minute)})
		require.False(h.t, res.Stale)
		require.Empty(h.t, res.Inserted)
		require.Equal(h.t, at(5*time.Minute), res.Schedule.LastTick)
		require.Empty(h.t, res.Schedule.LastInstance)
		require.True(h.t, res.Schedule.LastFiredAt.IsZero())
	}},
	{"schedules/SkipIfRunning skips while the last instance is not terminal", func(h *harness) {
		sc := h.syncSchedules("workers", store.Schedule{Name: "r", Workflow: "wf", Cron: "@every 5m", Overlap: periodic.OverlapSkip})[0]
		t1, t2, t3 := at(5*time.Minute), at(10*time.Minute), at(15*time.Minute)
		first := h.fire(store.FireRequest{Name: "r", Epoch: sc.Epoch, Tick: t1, Instance: tickInstance("r", t1), SkipIfRunning: true})
		require.NotEmpty(h.t, first.Inserted)
		second := h.fire(store.FireRequest{Name: "r", Epoch: first.Schedule.Epoch, Tick: t2, Instance: tickInstance("r", t2), SkipIfRunning: true})
		require.True(h.t, second.SkippedRunning)
		require.Empty(h.t, second.Inserted)
		require.Equal(h.t, t2, second.Schedule.LastTick)
		require.Equal(h.t, first.Inserted, second.Schedule.LastInstance, "the running instance stays the last")

		c := h.claimOne("w", t2)
		h.commit("w", t2, done(c))
		third := h.fire(store.FireRequest{Name: "r", Epoch: second.Schedule.Epoch, Tick: t3, Instance: tickInstance("r", t3), SkipIfRunning: true})
		require.False(h.t, third.SkippedRunning)
		require.NotEmpty(h.t, third.Inserted, "the previous one is done: the tick starts")
	}},
	{"schedules/concurrent fires of one tick record it once", func(h *harness) {
		sc := h.syncSchedules("workers", every5("r"))[0]
		tick := at(5 * time.Minute)
		const n = 8
		results := make([]store.FireResult, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = h.s.FireSchedule(h.ctx, store.FireRequest{Name: "r", Epoch: sc.Epoch, Tick: tick,
					Instance: tickInstance("r", tick)})
			}()
		}
		wg.Wait()
		recorded := 0
		for i := range n {
			require.NoError(h.t, errs[i])
			if !results[i].Stale {
				recorded++
				require.NotEmpty(h.t, results[i].Inserted)
			}
		}
		require.Equal(h.t, 1, recorded, "one engine records the tick")
		list, err := h.s.List(h.ctx, store.ListFilter{Workflow: "wf"})
		require.NoError(h.t, err)
		require.Len(h.t, list, 1, "one instance for the tick")
	}},
	{"schedules/pause survives syncs, refuses fires, and resume anchors at now", func(h *harness) {
		sc := h.syncSchedules("workers", every5("r"))[0]
		_, err := h.s.PauseSchedule(h.ctx, "nope", true, at(0))
		require.ErrorIs(h.t, err, store.ErrScheduleNotFound)
		_, err = h.s.FireSchedule(h.ctx, store.FireRequest{Name: "nope", Tick: at(0)})
		require.ErrorIs(h.t, err, store.ErrScheduleNotFound)

		p, err := h.s.PauseSchedule(h.ctx, "r", true, at(time.Minute))
		require.NoError(h.t, err)
		require.True(h.t, p.Paused)
		require.NotEqual(h.t, sc.Epoch, p.Epoch)
		res := h.fire(store.FireRequest{Name: "r", Epoch: p.Epoch, Tick: at(5 * time.Minute), Instance: tickInstance("r", at(5*time.Minute))})
		require.True(h.t, res.Stale, "a paused schedule fires nothing")

		changed := every5("r")
		changed.Cron = "@every 10m"
		got := h.syncSchedules("workers", changed)
		require.True(h.t, got[0].Paused, "a sync does not resume")
		require.Equal(h.t, "@every 10m", got[0].Cron)
		require.Equal(h.t, p.Anchor, got[0].Anchor, "a sync keeps the anchor")
		require.NotEqual(h.t, p.Epoch, got[0].Epoch, "a definition change moves the epoch")
		same := h.syncSchedules("workers", changed)
		require.Equal(h.t, got[0].Epoch, same[0].Epoch, "an unchanged definition keeps the epoch")

		r, err := h.s.PauseSchedule(h.ctx, "r", false, at(20*time.Minute))
		require.NoError(h.t, err)
		require.False(h.t, r.Paused)
		require.Equal(h.t, at(20*time.Minute), r.Anchor)
		again, err := h.s.PauseSchedule(h.ctx, "r", false, at(30*time.Minute))
		require.NoError(h.t, err)
		require.Equal(h.t, r, again, "resuming a running schedule changes nothing")
	}},
}
