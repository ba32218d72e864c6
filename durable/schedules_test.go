package durable_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/periodic"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

func noopWorkflow(name string) *durable.Workflow[counter] {
	return durable.NewWorkflow[counter](name, "run", durable.WorkflowOptions{}).
		Step("run", func(ctx steps.Context, c counter) (transitions.Transition, error) {
			return transitions.Done(c.N), nil
		})
}

func TestScheduleErrorsAtNewAndStart(t *testing.T) {
	for _, c := range []struct {
		name string
		sc   durable.Schedule
		want string
	}{
		{"bad cron", durable.Schedule{Name: "s", Workflow: "wf", Cron: "every day"}, `schedule "s": invalid schedule: cron "every day"`},
		{"bad zone", durable.Schedule{Name: "s", Workflow: "wf", Cron: "@daily", TimeZone: "Europe/Atlantis"}, `time zone "Europe/Atlantis"`},
		{"bad overlap", durable.Schedule{Name: "s", Workflow: "wf", Cron: "@daily", Overlap: "never"}, `overlap policy "never"`},
		{"no name", durable.Schedule{Workflow: "wf", Cron: "@daily"}, "empty schedule name"},
		{"state twice", durable.Schedule{Name: "s", Workflow: "wf", Cron: "@daily", State: 1,
			StateAt: func(time.Time) (any, error) { return 1, nil }}, "State or StateAt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := durable.New(durable.Config{Store: memory.New(memory.Options{}), Schedules: []durable.Schedule{c.sc}})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			if c.name == "bad cron" {
				assert.ErrorIs(t, err, periodic.ErrInvalid)
			}
		})
	}

	e := newEngine(t, durable.Config{Schedules: []durable.Schedule{{Name: "s", Workflow: "missing", Cron: "@daily"}}}, noopWorkflow("wf"))
	err := e.Start(context.Background())
	require.ErrorIs(t, err, durable.ErrUnknownWorkflow)
	assert.Contains(t, err.Error(), `schedule "s"`)
	assert.Contains(t, err.Error(), `"missing"`)
}

func TestScheduleSyncLeavesStoredSchedulesAloneWhenNotMentioned(t *testing.T) {
	ctx := context.Background()
	st := memory.New(memory.Options{})
	wf := noopWorkflow("wf")
	owner := newEngine(t, durable.Config{Store: st, Schedules: []durable.Schedule{
		{Name: "a", Workflow: "wf", Cron: "@daily"}, {Name: "b", Workflow: "wf", Cron: "@hourly"},
	}}, wf)
	got, err := owner.SyncSchedules(ctx)
	require.NoError(t, err)
	require.Len(t, got, 2)
	_, err = owner.PauseSchedule(ctx, "a", true)
	require.NoError(t, err)

	// An inserter whose Config does not mention schedules leaves them alone.
	inserter := newEngine(t, durable.Config{Store: st}, wf)
	start(t, inserter)
	all, err := inserter.ListSchedules(ctx)
	require.NoError(t, err)
	require.Len(t, all, 2)

	// A re-sync by an engine does not resume the pause.
	again := newEngine(t, durable.Config{Store: st, Schedules: []durable.Schedule{
		{Name: "a", Workflow: "wf", Cron: "@daily"}, {Name: "b", Workflow: "wf", Cron: "@hourly"},
	}}, wf)
	start(t, again)
	all, err = again.ListSchedules(ctx)
	require.NoError(t, err)
	require.True(t, all[0].Paused, "the pause is stored and survives re-syncs")

	h, err := again.Health(ctx)
	require.NoError(t, err)
	require.Len(t, h.Schedules, 2)
	assert.True(t, h.Schedules[0].Paused)
	assert.False(t, h.Schedules[1].Late)
	require.NotNil(t, h.Schedules[1].NextFire)

	// An explicit empty set removes the namespace's own.
	empty := newEngine(t, durable.Config{Store: st, Schedules: []durable.Schedule{}}, wf)
	got, err = empty.SyncSchedules(ctx)
	require.NoError(t, err)
	require.Empty(t, got)
	all, err = empty.ListSchedules(ctx)
	require.NoError(t, err)
	require.Empty(t, all)

	_, err = empty.PauseSchedule(ctx, "a", false)
	require.True(t, errors.Is(err, store.ErrScheduleNotFound), "%v", err)
}

func TestScheduleStateErrorLeavesTheTickUnrecorded(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := durabletest.NewClock(t0)
	fail := true
	e := newEngine(t, durable.Config{Store: memory.New(memory.Options{Clock: clock.Now}), Clock: clock,
		Schedules: []durable.Schedule{{Name: "s", Workflow: "wf", Cron: "@every 1s",
			StateAt: func(time.Time) (any, error) {
				if fail {
					return nil, errors.New("no report data yet")
				}
				return counter{N: 1}, nil
			}}}}, noopWorkflow("wf"))
	_, err := e.SyncSchedules(ctx)
	require.NoError(t, err)

	clock.Set(t0.Add(time.Second))
	_, err = e.Tick(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `schedule "s": state of tick 2030-01-01T00:00:01Z: no report data yet`)
	scs, err := e.ListSchedules(ctx)
	require.NoError(t, err)
	assert.True(t, scs[0].LastTick.IsZero(), "the tick is not recorded")

	fail = false
	rep, err := e.Tick(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Scheduled, "the tick fires once its state can be made")
	assert.Len(t, rep.Claimed, 1)
	scs, err = e.ListSchedules(ctx)
	require.NoError(t, err)
	assert.Equal(t, t0.Add(time.Second), scs[0].LastTick)
}

// A schedule of several keys starts each tick's instance holding every
// one of them, and a schedule's keys are checked as an insert's are.
func TestScheduleOfSeveralKeys(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := durabletest.NewClock(t0)
	st := memory.New(memory.Options{Clock: clock.Now})
	keys := []gate.ConcurrencyKey{gate.Gate("stripe", "global"), gate.Identity("acct", "1")}
	e := newEngine(t, durable.Config{Store: st, Clock: clock, Limits: []gate.Limit{{Name: "stripe", Limit: 2}},
		Schedules: []durable.Schedule{{Name: "s", Workflow: "wf", Cron: "@every 1s", State: counter{N: 1}, Keys: keys}}},
		noopWorkflow("wf"))
	scs, err := e.SyncSchedules(ctx)
	require.NoError(t, err)
	require.Len(t, scs, 1)
	assert.Equal(t, "acct:1", scs[0].Key)
	assert.Equal(t, []store.KeyRef{{Key: "stripe:global", Intent: gate.GateIntent}}, scs[0].Also)

	clock.Set(t0.Add(time.Second))
	rep, err := e.Tick(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Scheduled)
	require.Len(t, rep.Claimed, 1)
	assert.Equal(t, []string{"acct:1", "stripe:global"}, rep.Claimed[0].Keys, "the tick's instance holds both keys")

	for _, bad := range []durable.Schedule{
		{Name: "s", Workflow: "wf", Cron: "@daily", Key: gate.Identity("acct", "1"), Keys: keys},
		{Name: "s", Workflow: "wf", Cron: "@daily", Keys: []gate.ConcurrencyKey{gate.Identity("acct", "1"), gate.Identity("acct", "1")}},
	} {
		_, err := durable.New(durable.Config{Store: memory.New(memory.Options{}), Schedules: []durable.Schedule{bad}})
		assert.ErrorIs(t, err, durable.ErrInvalidInput)
	}
}
