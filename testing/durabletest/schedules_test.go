package durabletest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

type report struct {
	Tick time.Time `json:"tick"`
}

func reportWorkflow() *durable.Workflow[report] {
	return durable.NewWorkflow[report]("report", "send", durable.WorkflowOptions{}).
		Step("send", func(ctx steps.Context, r report) (transitions.Transition, error) {
			return transitions.Done(r.Tick), nil
		})
}

func tickOf(tick time.Time) (any, error) { return report{Tick: tick}, nil }

func TestScheduleFiresOncePerTickAsTheClockAdvances(t *testing.T) {
	env := durabletest.New(t, durabletest.Options{Schedules: []durable.Schedule{
		{Name: "every5", Workflow: "report", Cron: "@every 5m", StateAt: tickOf},
	}}, reportWorkflow())
	env.Advance(4 * time.Minute)
	require.Empty(t, env.Scheduled("every5"), "nothing before the first tick")
	env.Advance(11 * time.Minute)
	got := env.Scheduled("every5")
	require.Len(t, got, 3, "three ticks in 15 minutes of @every 5m")
	for i, in := range got {
		want := durabletest.Epoch.Add(time.Duration(i+1) * 5 * time.Minute)
		require.Equal(t, store.StatusDone, in.Status)
		require.Equal(t, want, durabletest.State[report](env, in.ID).Tick, "tick %d is in its state", i)
	}
}

func TestDailyScheduleAcrossDaylightSavingChanges(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	for _, c := range []struct {
		name  string
		start time.Time
	}{
		{"spring forward (2026-03-08)", time.Date(2026, 3, 5, 12, 0, 0, 0, ny)},
		{"fall back (2026-11-01)", time.Date(2026, 10, 29, 12, 0, 0, 0, ny)},
	} {
		// 09:00 is unambiguous; 02:30 does not exist on the spring-forward
		// night and 01:30 happens twice on the fall-back one.
		for _, expr := range []string{"0 9 * * *", "30 2 * * *", "30 1 * * *", "@daily"} {
			t.Run(c.name+" "+expr, func(t *testing.T) {
				env := durabletest.New(t, durabletest.Options{Start: c.start, Schedules: []durable.Schedule{
					{Name: "daily", Workflow: "report", Cron: expr, TimeZone: "America/New_York", StateAt: tickOf},
				}}, reportWorkflow())
				env.Advance(7 * 24 * time.Hour)
				got := env.Scheduled("daily")
				require.Len(t, got, 7, "once a day for a week")
				for i, in := range got {
					tick := durabletest.State[report](env, in.ID).Tick.In(ny)
					day := c.start.AddDate(0, 0, i+1)
					require.Equal(t, day.Format("2006-01-02"), tick.Format("2006-01-02"), "one per calendar day (%s)", tick)
					if expr == "0 9 * * *" {
						require.Equal(t, "09:00", tick.Format("15:04"), "09:00 local on %s", tick)
					}
				}
			})
		}
	}
}

func TestScheduleCatchUpAfterAnOutage(t *testing.T) {
	for _, c := range []struct {
		catchUp durable.Schedule
		want    int
	}{
		{durable.Schedule{CatchUp: durable.CatchUpSkip}, 1},
		{durable.Schedule{CatchUp: durable.CatchUpOnce}, 2},
	} {
		t.Run(string(c.catchUp.CatchUp), func(t *testing.T) {
			sc := c.catchUp
			sc.Name, sc.Workflow, sc.Cron, sc.StateAt = "hourly", "report", "@hourly", tickOf
			env := durabletest.New(t, durabletest.Options{Schedules: []durable.Schedule{sc}}, reportWorkflow())
			env.Advance(time.Hour)
			require.Len(t, env.Scheduled("hourly"), 1)

			// Every engine is down for five hours: the clock moves with nothing
			// running, then one round runs.
			env.Clock.Set(env.Clock.Now().Add(5*time.Hour + 30*time.Minute))
			env.RunUntilIdle()
			got := env.Scheduled("hourly")
			require.Len(t, got, c.want, "never a burst of the five missed ticks")
			if c.want == 2 {
				require.Equal(t, durabletest.Epoch.Add(6*time.Hour), durabletest.State[report](env, got[1].ID).Tick,
					"the missed window runs once, as its latest tick")
			}
			env.Advance(time.Hour)
			require.Len(t, env.Scheduled("hourly"), c.want+1, "then the next tick runs on time")
		})
	}
}

func TestScheduleOverlapPolicies(t *testing.T) {
	slow := durable.NewWorkflow[report]("slow", "wait", durable.WorkflowOptions{}).
		Step("wait", func(ctx steps.Context, r report) (transitions.Transition, error) {
			return transitions.Sleep(12*time.Minute, "end", r), nil
		}).
		Step("end", func(ctx steps.Context, r report) (transitions.Transition, error) {
			return transitions.Done(r.Tick), nil
		})
	for _, c := range []struct {
		overlap durable.Schedule
		want    int
	}{
		// Ticks at 5, 10, 15, 20, 25, 30 minutes; each run takes 12.
		{durable.Schedule{Overlap: durable.OverlapAllow}, 6},
		// 5 runs to 17: 10 and 15 skip; 20 runs to 32: 25 and 30 skip.
		{durable.Schedule{Overlap: durable.OverlapSkip}, 2},
	} {
		t.Run(string(c.overlap.Overlap), func(t *testing.T) {
			sc := c.overlap
			sc.Name, sc.Workflow, sc.Cron, sc.StateAt = "slow", "slow", "@every 5m", tickOf
			env := durabletest.New(t, durabletest.Options{Schedules: []durable.Schedule{sc}}, slow)
			env.Advance(30 * time.Minute)
			require.Len(t, env.Scheduled("slow"), c.want)
		})
	}
}
