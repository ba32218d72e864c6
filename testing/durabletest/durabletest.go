// Package durabletest unit-tests workflows deterministically, with no
// database: a fake clock, the in-memory store (which passes the same
// conformance suite as PostgreSQL), and a driver that runs steps in claim
// order. Rows claimed in one round hold their slots together, as if they
// ran in parallel, so concurrency keys behave as in production and the Env
// records, per key, the most instances that ever ran at once. A busy key's
// slot passes from step to step as it does in production: a round's
// commit hands the slot a step freed to the key's next row in turn, with
// the row after it reserved to run next in the same slot, and both run in
// the next round (see durable.Engine.Tick).
// Options.Postgres runs the same test against the PostgreSQL store.
//
// The same test gives the same interleaving and the same virtual times on
// every run: retry jitter is drawn from a source seeded by Options.Seed.
package durabletest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/store/postgres"
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

// Set moves the clock to t (never backwards). The clock keeps the location
// of its start, whatever t's (a store may return times in time.Local).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t.In(c.now.Location())
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
	// Lease is how long a claim holds without a heartbeat
	// (durable.Config.Lease, default 30s): a step crashed by CrashDuring
	// runs again once this much fake time has passed.
	Lease time.Duration
	// MaxRounds guards against a workflow that never goes idle (default 10,000).
	MaxRounds int
	// Logger receives the engine's logs (default: discarded).
	Logger *slog.Logger
	// Postgres, if set, runs the Env on the PostgreSQL store instead of
	// the in-memory one: the same test, the same fake clock (every store
	// call takes the fake time), on the schema that is the pool's
	// search_path (default postgres.DefaultSchema). The schema is migrated
	// if it is not yet, never emptied: give each test its own. The store
	// records history. PostgreSQL keeps times to the microsecond, so
	// virtual times with sub-microsecond parts (retry jitter) are rounded.
	Postgres *pgxpool.Pool
	// Seed seeds the jitter of retry delays (durable.Config.Jitter), so
	// that a test gives the same virtual times on every run; 0 means 1.
	// Change it to see other (but again reproducible) retry times.
	Seed uint64
}

// Env is a test environment for workflows. Its methods fail the test on
// unexpected errors; use Engine for calls whose errors the test asserts.
type Env struct {
	t     testing.TB
	Clock *Clock
	// Store is the store the Env runs on: in memory, or PostgreSQL with
	// Options.Postgres.
	Store  store.Store
	Engine *durable.Engine
	limits gate.Limits
	opts   Options

	maxSeen map[string]int
	steps   int
	delayed []delayedSignal
	crash   *crashStore
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
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	clock := NewClock(opts.Start)
	st, err := newStore(opts, clock)
	if err != nil {
		t.Fatalf("durabletest: %v", err)
	}
	crash := newCrashStore(st)
	eng, err := durable.New(durable.Config{Store: crash, Lease: opts.Lease, Queues: opts.Queues, Limits: opts.Limits, RateLimits: opts.RateLimits, Strict: opts.Strict,
		Schedules: opts.Schedules, Clock: clock, Logger: opts.Logger, WorkerID: "durabletest", Jitter: rand.New(rand.NewPCG(opts.Seed, 0)).Float64})
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
		store.KeyLimits{Limits: limits.All(), RateLimits: opts.RateLimits}, store.SyncOptions{}); err != nil {
		t.Fatalf("durabletest: %v", err)
	}
	if _, err := eng.SyncSchedules(context.Background()); err != nil {
		t.Fatalf("durabletest: %v", err)
	}
	return &Env{t: t, Clock: clock, Store: st, Engine: eng, limits: limits, opts: opts, maxSeen: map[string]int{}, crash: crash}
}

// newStore returns the store of an Env: in memory on the fake clock, or on
// PostgreSQL.
func newStore(opts Options, clock *Clock) (store.Store, error) {
	if opts.Postgres == nil {
		return memory.New(memory.Options{Clock: clock.Now}), nil
	}
	schema := opts.Postgres.Config().ConnConfig.RuntimeParams["search_path"]
	if schema == "" {
		schema = postgres.DefaultSchema
	}
	ctx := context.Background()
	if _, err := postgres.Migrate(ctx, opts.Postgres, schema); err != nil {
		return nil, fmt.Errorf("migrate schema %q: %w", schema, err)
	}
	return postgres.New(ctx, opts.Postgres, postgres.Options{Schema: schema, History: true, Clock: clock.Now})
}

// Scheduled returns the instances the schedule named name started so far,
// oldest tick first.
func (e *Env) Scheduled(name string) []durable.Instance {
	e.t.Helper()
	all, err := e.Store.List(context.Background(), store.ListFilter{})
	if err != nil {
		e.t.Fatalf("durabletest: %v", err)
	}
	prefix := "schedule:" + name + ":"
	var out []durable.Instance
	for _, in := range all {
		if strings.HasPrefix(in.UniqueKey, prefix) {
			out = append(out, e.Get(in.ID))
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

// InsertMany inserts instances atomically, in order, and returns their ids
// in the same order (see durable.Engine.InsertMany). Rows inserted together
// are ready together: one round may claim several of them.
func (e *Env) InsertMany(reqs ...durable.InsertRequest) []string {
	e.t.Helper()
	ids, err := e.Engine.InsertMany(context.Background(), reqs)
	if err != nil {
		e.t.Fatalf("durabletest: insert many: %v", err)
	}
	return ids
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

// Cancel cancels an instance as Engine.Cancel does (and its descendants,
// with durable.CancelOptions{Children: true}).
func (e *Env) Cancel(id string, opts durable.CancelOptions) {
	e.t.Helper()
	if err := e.Engine.Cancel(context.Background(), id, opts); err != nil {
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
		if err := e.crash.reapDue(context.Background(), e.Clock.Now()); err != nil {
			e.t.Fatalf("durabletest: reap crashed claims: %v", err)
		}
		held := e.crash.held() // before the round: its own crashes are among its claims
		rep, err := e.Engine.Tick(context.Background())
		if err != nil {
			e.t.Fatalf("durabletest: %v", err)
		}
		e.record(held, rep.Claimed)
		for _, o := range rep.Outcomes {
			// A transition the engine cannot carry out (an unknown step, a
			// state that cannot be encoded) is a bug in the workflow: the
			// instance failed without retries, and the test fails too.
			if o.Outcome == durable.OutcomeInvalidTransition {
				e.t.Errorf("durabletest: instance %s failed at step %q with a programming error: %s", o.ID, o.Step, o.Error)
			}
		}
		total += len(rep.Claimed) + len(rep.Chained)
		if len(rep.Claimed) == 0 && rep.Fired == 0 {
			e.steps += total
			return total, rep.NextDue
		}
	}
}

// record notes, per key, how many rows held it at once in one round (the
// rows that ran each in a slot of its own, and held: the crashed claims
// not yet reaped; a successor runs in its predecessor's slot), and fails
// the test if that exceeds the key's K. A row of several keys counts
// under each of them.
func (e *Env) record(held map[string]int, claimed []durable.TickStep) {
	e.t.Helper()
	per := held
	for _, c := range claimed {
		for _, k := range c.Keys {
			per[k]++
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
		next := e.nextEvent(due)
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

// nextEvent is the earliest of due (the stores' next run time or timeout),
// the next scheduled signal and the next lease end of a crashed claim
// (zero: none of them).
func (e *Env) nextEvent(due time.Time) time.Time {
	next := due
	for _, t := range []time.Time{e.firstDelayed(), e.crash.nextExpiry()} {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	return next
}

func (e *Env) firstDelayed() time.Time {
	if len(e.delayed) == 0 {
		return time.Time{}
	}
	return e.delayed[0].at
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
func (e *Env) RunUntilDone(id string) durable.Instance {
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
		next := e.nextEvent(due)
		if next.IsZero() {
			e.t.Fatalf("durabletest: instance %s is %s at step %q and nothing will wake it (await %q)", id, in.Status, in.Step, in.AwaitSignal)
		}
		e.Clock.Set(next)
		e.sendDue()
	}
}

// Get returns an instance as durable.Engine.Get shows it. The claim that
// runs it (worker, fence, lease) is the store's: Env.Store.Get reads it.
func (e *Env) Get(id string) durable.Instance {
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

// StepRun is one committed run of a step, as an instance's step history
// records it.
type StepRun struct {
	Step    string
	Attempt int
	// Key is the concurrency key the step ran under ("" : none).
	Key        string
	StartedAt  time.Time
	FinishedAt time.Time
	// Outcome is what the run came to: the transition's kind ("next",
	// "retry", "await", ...), "error" or "panic" (see
	// durable.TickOutcome.Outcome).
	Outcome string
	Error   string
}

// History returns the steps an instance ran, oldest first.
func (e *Env) History(id string) []StepRun {
	e.t.Helper()
	h, err := e.Store.History(context.Background(), id)
	if err != nil {
		e.t.Fatalf("durabletest: %v", err)
	}
	out := make([]StepRun, len(h))
	for i, r := range h {
		out[i] = StepRun{Step: r.Step, Attempt: r.Attempt, Key: r.Key, StartedAt: r.StartedAt,
			FinishedAt: r.FinishedAt, Outcome: r.Outcome, Error: r.Error}
	}
	return out
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

// KeyInfo is who holds a key's slots and who waits for them (see
// store.KeyInfo, whose rows it shows as durable.Engine.Get does).
type KeyInfo struct {
	Key string
	// K is the key's concurrency (its name's limit, or 1), and Shards the
	// number of slot counters K is split into (0 for a K = 1 key).
	K      int
	Shards int
	// Holders are the executing rows of the key.
	Holders []durable.Instance
	// Waiting counts ready and blocked rows of the key, Blocked the blocked
	// ones; NextInLine is the first of them in admission order and
	// OldestWaiting the one that has waited longest (nil when none).
	Waiting       int
	Blocked       int
	NextInLine    *durable.Instance
	OldestWaiting *durable.Instance
	// Available is how many more rows of the key a claim could admit now.
	Available int
	// RateLimit is the rate limit of the key's name (nil: none), and Bucket
	// the stored bucket the key draws from (nil: none stored, a full one).
	RateLimit *gate.RateLimit
	Bucket    *gate.Bucket
}

// Key explains a key now: who holds its slots and who waits.
func (e *Env) Key(key string) KeyInfo {
	e.t.Helper()
	info, err := e.Store.KeyInfo(context.Background(), key)
	if err != nil {
		e.t.Fatalf("durabletest: %v", err)
	}
	out := KeyInfo{Key: info.Key, K: info.K, Shards: info.Shards, Waiting: info.Waiting, Blocked: info.Blocked,
		Available: info.Available, RateLimit: info.RateLimit, Bucket: info.Bucket}
	for _, h := range info.Holders {
		out.Holders = append(out.Holders, e.Get(h.ID))
	}
	view := func(in *store.Instance) *durable.Instance {
		if in == nil {
			return nil
		}
		v := e.Get(in.ID)
		return &v
	}
	out.NextInLine, out.OldestWaiting = view(info.NextInLine), view(info.OldestWaiting)
	return out
}

// MaxConcurrency is the most instances that ever held key at once,
// counting every key of a step that held several.
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
	// Key is what ctx.Key() returns, and Keys what ctx.Keys() returns
	// (default: Key alone, or none).
	Key  string
	Keys []string
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
func (f *fakeContext) Keys() []string {
	if len(f.opts.Keys) == 0 && f.opts.Key != "" {
		return []string{f.opts.Key}
	}
	return f.opts.Keys
}
func (f *fakeContext) TimedOut() bool { return f.opts.TimedOut }
func (f *fakeContext) Now() time.Time { return f.clock.Now() }
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
