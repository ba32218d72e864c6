package durabletest_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/pgstoretest"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

// TestMain drops the PostgreSQL schemas the tests used (and stops a
// throwaway cluster if pgtest started one).
func TestMain(m *testing.M) { pgtest.Main(m) }

// onEveryStore runs body on an Env with the definitions defs makes, once on
// the in-memory store and once on PostgreSQL, and checks that both runs
// return the same transcript. Without a PostgreSQL server the PostgreSQL
// run is skipped, or fails when CI=true (see pgtest).
func onEveryStore(t *testing.T, opts durabletest.Options, defs func() []durable.Definition, body func(t *testing.T, env *durabletest.Env) []string) {
	var memory []string
	t.Run("memory", func(t *testing.T) {
		memory = body(t, durabletest.New(t, opts, defs()...))
		require.NotEmpty(t, memory)
	})
	t.Run("postgres", func(t *testing.T) {
		pg := opts
		pg.Postgres = pgstoretest.Migrated.Pool(t)
		got := body(t, durabletest.New(t, pg, defs()...))
		assert.Equal(t, memory, got, "PostgreSQL and the in-memory store agree")
	})
}

type ticket struct {
	Tries int    `json:"tries"`
	Log   string `json:"log"`
}

// ticketFlows: a support ticket that is triaged under its customer's key
// (K = 1), calls a flaky API under a gate (K = 2) with jittered retries,
// waits for an agent's reply or a timeout, fans out to notifier children
// and sleeps before closing.
func ticketFlows() []durable.Definition {
	notify := durable.NewWorkflow[string]("notify", "send", durable.WorkflowOptions{})
	notify.Step("send", func(ctx steps.Context, to string) (transitions.Transition, error) {
		return transitions.Done("sent to " + to), nil
	})
	wf := durable.NewWorkflow[ticket]("ticket", "triage", durable.WorkflowOptions{})
	wf.Step("triage", func(ctx steps.Context, s ticket) (transitions.Transition, error) {
		s.Log += "triage;"
		return transitions.Next("lookup", s, transitions.SwitchKey(gate.Gate("crm", "eu"))), nil
	})
	wf.Step("lookup", func(ctx steps.Context, s ticket) (transitions.Transition, error) {
		if ctx.Attempt() < 2 {
			return transitions.Transition{}, fmt.Errorf("crm busy")
		}
		s.Log += fmt.Sprintf("lookup@%d;", ctx.Attempt())
		return transitions.Await("reply", "answer", s, transitions.Timeout(time.Hour), transitions.ReleaseKey()), nil
	})
	wf.Step("answer", func(ctx steps.Context, s ticket) (transitions.Transition, error) {
		if sig, ok := ctx.Signal(); ok {
			var who string
			if err := sig.Decode(&who); err != nil {
				return transitions.Transition{}, err
			}
			s.Log += fmt.Sprintf("reply by %s sent at +%s;", who, sig.SentAt.Sub(durabletest.Epoch))
		} else {
			s.Log += "no reply;"
		}
		return transitions.Spawn([]transitions.Child{{Workflow: "notify", State: "customer"}, {Workflow: "notify", State: "agent"}}, "close", s), nil
	})
	wf.Step("close", func(ctx steps.Context, s ticket) (transitions.Transition, error) {
		kids, err := ctx.Children()
		if err != nil {
			return transitions.Transition{}, err
		}
		if s.Tries == 0 {
			s.Tries++
			s.Log += fmt.Sprintf("%d notified;", len(kids))
			return transitions.Sleep(24*time.Hour, "close", s), nil
		}
		return transitions.Done(s.Log + "closed"), nil
	})
	return []durable.Definition{wf, notify}
}

func TestSameResultsOnEveryStore(t *testing.T) {
	onEveryStore(t, durabletest.Options{Limits: []gate.Limit{{Name: "crm", Limit: 2}}}, ticketFlows, func(t *testing.T, env *durabletest.Env) []string {
		var ids []string
		for i := 0; i < 5; i++ {
			ids = append(ids, env.Insert("ticket", ticket{}, durable.InsertOptions{Key: gate.Identity("customer", fmt.Sprint(i%3))}))
		}
		ids = append(ids, env.InsertMany(durable.InsertRequest{Workflow: "ticket", State: ticket{},
			Options: durable.InsertOptions{Key: gate.Identity("customer", "late"), Delay: 90 * time.Minute}})...)
		env.CrashDuring("triage")
		env.SignalAfter(10*time.Minute, ids[0], "reply", "ana")
		env.SignalAfter(20*time.Minute, ids[3], "reply", "bo")
		env.RunUntilIdle()
		env.Advance(2 * time.Hour)
		for _, id := range ids {
			env.RunUntilDone(id)
		}
		assert.Equal(t, 2, env.MaxConcurrency("crm:eu"), "the gate ran up to its limit")
		assert.Equal(t, 1, env.MaxConcurrency("customer:0"))
		assert.Equal(t, "triage;lookup@2;reply by ana sent at +10m0s;2 notified;closed", durabletest.Result[string](env, ids[0]))
		assert.Equal(t, "triage;lookup@2;no reply;2 notified;closed", durabletest.Result[string](env, ids[1]))
		return transcript(env, ids...)
	})
}

// transcript is what a test sees of instances: each one's steps with
// attempt, time, outcome and key, its status and result, then the most each
// key ran at once, the crashes and the end time. Times are in milliseconds
// since Epoch (PostgreSQL keeps microseconds; jitter has nanoseconds), and
// results are decoded (PostgreSQL's jsonb does not keep the JSON's text).
func transcript(env *durabletest.Env, ids ...string) []string {
	ms := func(t time.Time) time.Duration { return t.Sub(durabletest.Epoch).Round(time.Millisecond) }
	var out []string
	for i, id := range ids {
		for _, h := range env.History(id) {
			out = append(out, fmt.Sprintf("#%d %s/%d@%s %s %s", i, h.Step, h.Attempt, ms(h.StartedAt), h.Outcome, h.Key))
		}
		in := env.Get(id)
		var result any
		if len(in.Result) > 0 {
			if err := json.Unmarshal(in.Result, &result); err != nil {
				result = err
			}
		}
		out = append(out, fmt.Sprintf("#%d %s %v", i, in.Status, result))
	}
	for _, k := range env.Keys() {
		out = append(out, fmt.Sprintf("%s max %d", k, env.MaxConcurrency(k)))
	}
	return append(out, fmt.Sprintf("crashes %d, end %s, steps %d", env.Crashes(), ms(env.Clock.Now()), env.StepsRun()))
}

// TestFakeClockBehindTheDatabaseClock: the fake clock, not the database's,
// decides when an inserted row is due, whichever of the two is ahead.
func TestFakeClockBehindTheDatabaseClock(t *testing.T) {
	start := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC) // long before the database's now()
	onEveryStore(t, durabletest.Options{Start: start}, ticketFlows, func(t *testing.T, env *durabletest.Env) []string {
		now := env.Insert("notify", "now", durable.InsertOptions{})
		later := env.Insert("notify", "later", durable.InsertOptions{Delay: time.Hour})
		env.RunUntilIdle()
		assert.Equal(t, "sent to now", durabletest.Result[string](env, now))
		assert.False(t, env.Get(later).Status.Terminal(), "not due before the fake clock reaches it")
		env.RunUntilDone(later)
		assert.Equal(t, start.Add(time.Hour), env.Clock.Now())
		return []string{durabletest.Result[string](env, later), env.Clock.Now().Sub(start).String()}
	})
}

// TestSchedulesOnEveryStore: a schedule is anchored at the fake clock's
// start on PostgreSQL too, so its ticks fall at the same virtual times.
func TestSchedulesOnEveryStore(t *testing.T) {
	opts := durabletest.Options{Schedules: []durable.Schedule{
		{Name: "every5", Workflow: "report", Cron: "@every 5m", StateAt: tickOf},
	}}
	reports := func() []durable.Definition { return []durable.Definition{reportWorkflow()} }
	onEveryStore(t, opts, reports, func(t *testing.T, env *durabletest.Env) []string {
		env.Advance(4 * time.Minute)
		require.Empty(t, env.Scheduled("every5"), "nothing before the first tick")
		env.Advance(11 * time.Minute)
		var ticks []string
		for _, in := range env.Scheduled("every5") {
			ticks = append(ticks, durabletest.State[report](env, in.ID).Tick.Sub(durabletest.Epoch).String())
		}
		assert.Equal(t, []string{"5m0s", "10m0s", "15m0s"}, ticks)
		return ticks
	})
}
