// Package durabletest unit-tests workflows deterministically, with no
// database: a fake clock, the in-memory store (which passes the same
// conformance suite as PostgreSQL), and a driver that runs steps in claim
// order. Rows claimed in one round hold their slots together, as if they
// ran in parallel, so concurrency keys behave as in production and the Env
// records, per key, the most instances that ever ran at once.
//
// The same test gives the same interleaving on every run.
package durabletest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/transitions"
)

// Epoch is the fake clock's default start: 2030-01-01T00:00:00Z.
var Epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// Clock is a fake clock that moves only when told to.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a fake clock at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the fake time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t (never backwards).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
}

// Options configures an Env.
type Options struct {
	// Limits are the named key limits, as in durable.Config.
	Limits []gate.Limit
	// RateLimits are the rate limits by key name, as in durable.Config;
	// their buckets refill on the fake clock.
	RateLimits []gate.RateLimit
	// Queues and their executor counts (default {"default": 10}): how many
	// rows of a queue one round may claim.
	Queues map[string]int
	// Strict is durable.Config.Strict.
	Strict bool
	// Schedules are the periodic workflows, as in durable.Config: they
	// are synced when the Env is made (anchored at the clock's start), and
	// advancing the clock fires each due tick at its own time, in order.
	Schedules []durable.Schedule
	// Start is the fake clock's start (default Epoch).
	Start time.Time
	// MaxRounds guards against a workflow that never goes idle (default 10,000).
	MaxRounds int
	// Logger receives the engine's logs (default: discarded).
	Logger *slog.Logger
}

// Env is a test environment for workflows. Its methods fail the test on
// unexpected errors; use Engine for calls whose errors the test asserts.
type Env struct {
	t      testing.TB
	Clock  *Clock
	Store  *memory.Store
	Engine *durable.Engine
	limits gate.Limits
	opts   Options

	maxSeen map[string]int
	steps   int
	delayed []delayedSignal
}

type delayedSignal struct {
	at       time.Time
	id, name string
	payload  any
	seq      int
}

// New returns an Env with defs registered. The engine is never started: the
// Env drives it round by round.
func New(t testing.TB, opts Options, defs ...durable.Definition) *Env {
	t.Helper()
	if opts.Start.IsZero() {
		opts.Start = Epoch
	}
	if opts.MaxRounds == 0 {
		opts.MaxRounds = 10000
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	clock := NewClock(opts.Start)
	st := memory.New(memory.Options{Clock: clock.Now})
	eng, err := durable.New(durable.Config{Store: st, Queues: opts.Queues, Limits: opts.Limits, RateLimits: opts.RateLimits, Strict: opts.Strict,
		Schedules: opts.Schedules, Clock: clock, Logger: opts.Logger, WorkerID: "durabletest"})
	if err != nil {
		t.Fatalf("durabletest: %v", err)
	}
	if err := eng.Register(defs...); err != nil {
		t.Fatalf("durabletest: %v", err)
	}
	limits, err := gate.NewLimits(opts.Limits)
	if err != nil {
		t.Fatalf("durabletest: %v", err)
	}
	if _, err := st.SyncKeyLimits(context.Background(), store.DefaultNamespace,
		store.KeyLimits{Limits: limits.All(), RateLimits: opts.RateLimits}); err != nil {
		t.Fatalf("durabletest: %v", err)
	}
	if _, err := eng.SyncSchedules(context.Background()); err != nil {
		t.Fatalf("durabletest: %v", err)
	}
	return &Env{t: t, Clock: clock, Store: st, Engine: eng, limits: limits, opts: opts, maxSeen: map[string]int{}}
}

// Scheduled returns the instances the schedule named name started so far,
// oldest tick first.
func (e *Env) Scheduled(name string) []store.Instance {
	e.t.Helper()
	all, err := e.Store.List(context.Background(), store.ListFilter{})
	if err != nil {
		e.t.Fatalf("durabletest: %v", err)
	}
	prefix := "schedule:" + name + ":"
	var out []store.Instance
	for _, in := range all {
		if strings.HasPrefix(in.UniqueKey, prefix) {
			out = append(out, in)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UniqueKey < out[j].UniqueKey })
	return out
}

// Insert inserts an instance and returns its id.
func (e *Env) Insert(workflow string, state any, opts durable.InsertOptions) string {
	e.t.Helper()
	id, err := e.Engine.Insert(context.Background(), workflow, state, opts)
	if err != nil {
		e.t.Fatalf("durabletest: insert %s: %v", workflow, err)
	}
	return id
}

// Signal sends a signal now.
func (e *Env) Signal(id, name string, payload any) {
	e.t.Helper()
	if err := e.Engine.Signal(context.Background(), id, name, payload, durable.SignalOptions{}); err != nil {
		e.t.Fatalf("durabletest: signal %s: %v", name, err)
	}
}

// SignalAfter schedules a signal at the fake time now + d; it is sent when
// the clock reaches that time (during Advance or RunUntilDone).
func (e *Env) SignalAfter(d time.Duration, id, name string, payload any) {
	e.delayed = append(e.delayed, delayedSignal{at: e.Clock.Now().Add(d), id: id, name: name, payload: payload, seq: len(e.delayed)})
	sort.SliceStable(e.delayed, func(i, j int) bool { return e.delayed[i].at.Before(e.delayed[j].at) })
}

// Cancel cancels an instance.
func (e *Env) Cancel(id string) {
	e.t.Helper()
	if err := e.Engine.Cancel(context.Background(), id); err != nil {
		e.t.Fatalf("durabletest: cancel: %v", err)
	}
}

// RunUntilIdle runs rounds at the current fake time until no row is
// claimable, and returns the number of steps run.
func (e *Env) RunUntilIdle() int {
	e.t.Helper()
	n, _ := e.runIdle()
	return n
}

func (e *Env) runIdle() (int, time.Time) {
	e.t.Helper()
	total := 0
	for round := 0; ; round++ {
		if round >= e.opts.MaxRounds {
			e.t.Fatalf("durabletest: still busy after %d rounds; does a workflow loop without waiting?", round)
		}
		rep, err := e.Engine.Tick(context.Background())
		if err != nil {
			e.t.Fatalf("durabletest: %v", err)
		}
		e.record(rep.Claimed)
		for _, o := range rep.Outcomes {
			if h := o.History; h != nil && h.Outcome == durable.OutcomeInvalidTransition {
				e.t.Errorf("durabletest: instance %s: %s", o.ID, o.Error)
			}
		}
		total += len(rep.Claimed)
		if len(rep.Claimed) == 0 && rep.Fired == 0 {
			e.steps += total
			return total, rep.NextDue
		}
	}
}

// record notes, per key, how many rows of one round held it at once, and
// fails the test if that exceeds the key's K.
func (e *Env) record(claimed []store.Claimed) {
	e.t.Helper()
	per := map[string]int{}
	for _, c := range claimed {
		if c.Key != "" {
			per[c.Key]++
		}
	}
	for k, n := range per {
		if n > e.maxSeen[k] {
			e.maxSeen[k] = n
		}
		if limit := e.limits.K(k); n > limit {
			e.t.Errorf("durabletest: key %q ran %d at once, over its K = %d", k, n, limit)
		}
	}
}

// Advance moves the fake clock forward by d, running everything that
// becomes due on the way (timers, retries, await timeouts, scheduled
// signals) at its own time, in order.
func (e *Env) Advance(d time.Duration) {
	e.t.Helper()
	e.advanceTo(e.Clock.Now().Add(d))
}

func (e *Env) advanceTo(target time.Time) {
	e.t.Helper()
	for {
		_, due := e.runIdle()
		next := due
		if len(e.delayed) > 0 && (next.IsZero() || e.delayed[0].at.Before(next)) {
			next = e.delayed[0].at
		}
		if next.IsZero() || next.After(target) {
			e.Clock.Set(target)
			e.sendDue()
			e.runIdle()
			return
		}
		e.Clock.Set(next)
		e.sendDue()
	}
}

func (e *Env) sendDue() {
	e.t.Helper()
	now := e.Clock.Now()
	for len(e.delayed) > 0 && !e.delayed[0].at.After(now) {
		s := e.delayed[0]
		e.delayed = e.delayed[1:]
		e.Signal(s.id, s.name, s.payload)
	}
}

// RunUntilDone runs, jumping the fake clock to the next timer whenever
// everything is parked, until the instance is terminal. It fails the test if
// the instance can never finish (parked with no timer and no scheduled signal).
func (e *Env) RunUntilDone(id string) store.Instance {
	e.t.Helper()
	for jumps := 0; ; jumps++ {
		if jumps >= e.opts.MaxRounds {
			// A schedule always has a next tick: an instance that waits for
			// something that never comes would jump the clock forever.
			in := e.Get(id)
			e.t.Fatalf("durabletest: instance %s is still %s at step %q after %d clock jumps (to %s)", id, in.Status, in.Step, jumps, e.Clock.Now().Format(time.RFC3339))
		}
		_, due := e.runIdle()
		in := e.Get(id)
		if in.Status.Terminal() {
			return in
		}
		next := due
		if len(e.delayed) > 0 && (next.IsZero() || e.delayed[0].at.Before(next)) {
			next = e.delayed[0].at
		}
		if next.IsZero() {
			e.t.Fatalf("durabletest: instance %s is %s at step %q and nothing will wake it (await %q)", id, in.Status, in.Step, in.AwaitSignal)
		}
		e.Clock.Set(next)
		e.sendDue()
	}
}

// Get returns an instance.
func (e *Env) Get(id string) store.Instance {
	e.t.Helper()
	in, err := e.Engine.Get(context.Background(), id)
	if err != nil {
		e.t.Fatalf("durabletest: %v", err)
	}
	return in
}

// State decodes an instance's current state into S.
func State[S any](e *Env, id string) S {
	e.t.Helper()
	var s S
	in := e.Get(id)
	if err := json.Unmarshal(in.State, &s); err != nil {
		e.t.Fatalf("durabletest: decode state of %s: %v", id, err)
	}
	return s
}

// Result decodes a done instance's result into T; it fails the test if the
// instance is not done.
func Result[T any](e *Env, id string) T {
	e.t.Helper()
	var out T
	in := e.Get(id)
	if in.Status != store.StatusDone {
		e.t.Fatalf("durabletest: instance %s is %s (last error %q), not done", id, in.Status, in.LastError)
	}
	if err := json.Unmarshal(in.Result, &out); err != nil {
		e.t.Fatalf("durabletest: decode result of %s: %v", id, err)
	}
	return out
}

// History returns the steps an instance ran, oldest first.
func (e *Env) History(id string) []store.HistoryEntry {
	e.t.Helper()
	h, err := e.Store.History(context.Background(), id)
	if err != nil {
		e.t.Fatalf("durabletest: %v", err)
	}
	return h
}

// StepNames returns the names of the steps an instance ran, in order.
func (e *Env) StepNames(id string) []string {
	e.t.Helper()
	var out []string
	for _, h := range e.History(id) {
		out = append(out, h.Step)
	}
	return out
}

// Key explains a key now: who holds its slots and who waits.
func (e *Env) Key(key string) store.KeyInfo {
	e.t.Helper()
	info, err := e.Store.KeyInfo(context.Background(), key)
	if err != nil {
		e.t.Fatalf("durabletest: %v", err)
	}
	return info
}

// MaxConcurrency is the most instances that ever held key at once.
func (e *Env) MaxConcurrency(key string) int { return e.maxSeen[key] }

// Keys returns every key seen so far, sorted.
func (e *Env) Keys() []string {
	out := make([]string, 0, len(e.maxSeen))
	for k := range e.maxSeen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// StepsRun is the number of steps run so far.
func (e *Env) StepsRun() int { return e.steps }

// StepOptions are what RunStep's fake context reports.
type StepOptions struct {
	InstanceID string
	Attempt    int
	Key        string
	// Signal, if non-nil, is what ctx.Signal() returns.
	Signal *steps.Signal
	// TimedOut is what ctx.TimedOut() returns.
	TimedOut bool
	// Children is what ctx.Children() returns.
	Children []steps.Child
}

// RunStep runs one step of wf in isolation with state and a fake context,
// and returns its transition. Panics become a *durable.PanicError.
func RunStep[S any](e *Env, wf *durable.Workflow[S], step string, state S, opts StepOptions) (transitions.Transition, error) {
	if opts.InstanceID == "" {
		opts.InstanceID = "00000000-0000-0000-0000-000000000000"
	}
	ctx := &fakeContext{Context: context.Background(), wf: wf.Name(), step: step, opts: opts, clock: e.Clock, log: e.opts.Logger}
	return wf.Call(ctx, step, state)
}

type fakeContext struct {
	context.Context
	wf, step string
	opts     StepOptions
	clock    *Clock
	log      *slog.Logger
}

func (f *fakeContext) InstanceID() string { return f.opts.InstanceID }
func (f *fakeContext) Workflow() string   { return f.wf }
func (f *fakeContext) Step() string       { return f.step }
func (f *fakeContext) Attempt() int       { return f.opts.Attempt }
func (f *fakeContext) Key() string        { return f.opts.Key }
func (f *fakeContext) TimedOut() bool     { return f.opts.TimedOut }
func (f *fakeContext) Now() time.Time     { return f.clock.Now() }
func (f *fakeContext) Logger() *slog.Logger {
	return f.log
}
func (f *fakeContext) Signal() (steps.Signal, bool) {
	if f.opts.Signal == nil {
		return steps.Signal{}, false
	}
	return *f.opts.Signal, true
}
func (f *fakeContext) Children() ([]steps.Child, error) { return f.opts.Children, nil }

// String describes the concurrency seen per key, for test failure messages.
func (e *Env) String() string {
	s := ""
	for _, k := range e.Keys() {
		s += fmt.Sprintf("%s: max %d of K=%d\n", k, e.maxSeen[k], e.limits.K(k))
	}
	return s
}
