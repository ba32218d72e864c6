package durable

import (
	"context"
	"fmt"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// lifecycle is where an engine is in its life.
type lifecycle int

const (
	stateNew      lifecycle = iota // registering; Tick may drive it
	stateStarting                  // Start is syncing limits and reclaiming
	stateRunning                   // the scheduler runs
	stateStopped                   // Stop was called; final
)

// Start syncs the configured limits and schedules to the store, reclaims claims left by a
// dead predecessor with the same WorkerID, and starts the scheduler. A limit
// change that alters keys held by live instances is logged with the number
// of instances affected, or refused in Strict mode. A Stop that comes while
// Start runs wins: Start then returns ErrStopped and starts nothing.
func (e *Engine) Start(ctx context.Context) error {
	e.mu.Lock()
	switch e.state {
	case stateNew:
	case stateStopped:
		e.mu.Unlock()
		return ErrStopped
	default:
		e.mu.Unlock()
		return fmt.Errorf("durable: %w", ErrStarted)
	}
	e.state = stateStarting
	e.mu.Unlock()
	s := e.rt.NewScheduler()
	s.Listen() // while the store work below runs (see Scheduler.Listen)
	err := e.prepareStart(ctx)
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.state == stateStopped:
		s.Abandon()
		return ErrStopped
	case err != nil:
		s.Abandon()
		e.state = stateNew // Start may be tried again
		return err
	}
	e.sched, e.state = s, stateRunning
	s.Start()
	e.startMarking()
	return nil
}

// prepareStart is the store work of Start before the scheduler runs.
func (e *Engine) prepareStart(ctx context.Context) error {
	if err := e.syncLimits(ctx); err != nil {
		return err
	}
	if _, err := e.SyncSchedules(ctx); err != nil {
		return fmt.Errorf("durable: start: %w", err)
	}
	// Before the first claim, so that the fleet sees the queues worked
	// as soon as Start returns.
	e.markQueues(ctx)
	if err := e.rt.ReleaseTickRows(ctx); err != nil { // the scheduler does not know them
		return fmt.Errorf("durable: start: %w", err)
	}
	if e.generatedID {
		return nil // a new id: no claim of a previous run holds it
	}
	if n, err := e.st.ReclaimWorker(ctx, e.cfg.WorkerID, e.storeNow()); err != nil {
		return fmt.Errorf("durable: start: reclaim: %w", err)
	} else if n > 0 {
		e.log.Warn("reclaimed claims of a previous run of this worker", "n", n)
	}
	return nil
}

// syncLimits stores the configured limits and rate limits as the
// namespace's desired state and warns, per key name, about changes that
// alter live keys. In Strict mode such a change is refused before anything
// is stored (a dry run of the same sync finds it). A configuration that
// leaves Limits and RateLimits nil syncs nothing: an inserter, an admin
// tool or a worker of another service never wipes the fleet's gates.
func (e *Engine) syncLimits(ctx context.Context) error {
	defer e.forgetStoredLimits()
	if e.cfg.Limits == nil && e.cfg.RateLimits == nil {
		return nil
	}
	var want store.KeyLimits
	if e.cfg.Limits != nil {
		want.Limits = append([]gate.Limit{}, e.limits.All()...)
	}
	if e.cfg.RateLimits != nil {
		want.RateLimits = append([]gate.RateLimit{}, e.rates.All()...)
	}
	if e.cfg.Strict {
		res, err := e.st.SyncKeyLimits(ctx, e.cfg.Namespace, want, store.SyncOptions{DryRun: true})
		if err != nil {
			return fmt.Errorf("durable: start: sync limits of namespace %q: %w", e.cfg.Namespace, err)
		}
		for _, w := range store.LiveChangeWarnings(res) {
			return fmt.Errorf("durable: start: %w", w.Error())
		}
	}
	res, err := e.st.SyncKeyLimits(ctx, e.cfg.Namespace, want, store.SyncOptions{})
	if err != nil {
		return fmt.Errorf("durable: start: sync limits of namespace %q: %w", e.cfg.Namespace, err)
	}
	for _, w := range store.LiveChangeWarnings(res) {
		e.recordWarning(w)
		e.log.Warn("limit change alters live keys", "name", w.Name, "live_instances", w.Live, "detail", w.Message)
	}
	return nil
}

// SyncConcurrencyPolicies stores defs as the queue policies of the
// engine's namespace (see store.Store): policies the namespace owned that
// defs omits are removed unless opts.KeepOmitted (the zero SyncOptions are
// the defaults; DryRun stores nothing), and a queue owned by another
// namespace is an error wrapping store.ErrNamespaceConflict. Every engine
// sharing the store applies a change from its next claim on: no restart,
// no matching configuration needed. It returns the namespace's stored
// policies.
func (e *Engine) SyncConcurrencyPolicies(ctx context.Context, defs []store.ConcurrencyPolicy, opts store.SyncOptions) ([]store.ConcurrencyPolicy, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	out, err := e.st.SyncConcurrencyPolicies(ctx, e.cfg.Namespace, defs, opts)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	e.wakeAll()
	return out, nil
}

// ListConcurrencyPolicies returns every stored queue policy, of every
// namespace, sorted by queue.
func (e *Engine) ListConcurrencyPolicies(ctx context.Context) ([]store.ConcurrencyPolicy, error) {
	out, err := e.st.ListConcurrencyPolicies(ctx)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	return out, nil
}

// Stop stops claiming, releases claimed rows that have not started, lets
// running steps finish until ctx's deadline (then cancels them and releases
// their claims), commits their outcomes, and closes nothing else: the store
// stays open for its owner to close. Stop returns by ctx's deadline even if
// the store is unreachable; outcomes it could not commit are not lost but
// re-run (their claims expire and the reaper retries the steps). Calling Stop again, even concurrently,
// waits for the first call to finish (or for its own ctx) and returns nil.
func (e *Engine) Stop(ctx context.Context) error {
	e.mu.Lock()
	if e.state == stateStopped {
		done := e.stopDone
		e.mu.Unlock()
		if done != nil {
			select {
			case <-done:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	s := e.sched
	e.state = stateStopped
	done := make(chan struct{})
	e.stopDone = done
	e.mu.Unlock()
	defer close(done)
	e.stopMarking()
	if s == nil {
		return nil
	}
	return s.Stop(ctx)
}

// StaleOutcomes returns how many outcomes of this engine were discarded
// because their claim was no longer current.
func (e *Engine) StaleOutcomes() int64 { return e.rt.StaleOutcomes() }

// TickReport is what one Tick did.
type TickReport struct {
	// Claimed are the rows that ran in this round each in a slot of its
	// own: first those the previous round's commit handed to the engine (a
	// slot an outcome freed, given straight to its key's next row), then
	// those claimed, in claim order, across queues (sorted by queue name).
	// They all held their slots at once.
	Claimed []TickStep
	// Chained are the rows that ran after a row of Claimed, in its slot:
	// each was reserved as that row's successor, and that row's outcome
	// passed the slot to it.
	Chained []TickStep
	// Outcomes are the committed outcomes, in the order the steps ran (an
	// outcome the store refused for its data is replaced by the failure it
	// became; one refused even so is left out, its claim left to the
	// reaper).
	Outcomes []TickOutcome
	// Stale counts outcomes that did not commit.
	Stale int
	// Fired counts await timeouts that fired before the claim.
	Fired int
	// Scheduled counts instances started by due schedule ticks before the claim.
	Scheduled int
	// NextDue is the earliest future time a row becomes eligible, an
	// await times out or a schedule ticks, over all queues (zero: none known).
	NextDue time.Time
}

// Tick runs one synchronous scheduling round without goroutines, through
// the slot protocol the live scheduler uses: it fires due schedule ticks
// and due timers, runs the rows the previous round's commit handed to the
// engine, claims up to each queue's executor count less those, runs the
// steps one after another (each row, then the successor reserved for it,
// in its slot), and commits all their outcomes as one batch, which may
// hand the slots they free to their keys' next rows for the next round.
// The rows of one round held their slots at the same time, as if they ran
// in parallel. It is the deterministic driver behind durabletest; it
// refuses to run on a started engine.
func (e *Engine) Tick(ctx context.Context) (TickReport, error) {
	e.mu.RLock()
	state := e.state
	e.mu.RUnlock()
	if state != stateNew {
		return TickReport{}, fmt.Errorf("durable: tick: engine is started or stopped")
	}
	// The round is the runtime's (claim, run, commit as the live scheduler
	// does); the report shows its rows and outcomes without the claims'
	// fences and hints, which are the store's and the runtime's business.
	e.markQueuesIfDue(ctx)
	rnd, err := e.rt.Tick(ctx)
	rep := TickReport{Stale: rnd.Stale, Fired: rnd.Fired, Scheduled: rnd.Scheduled, NextDue: rnd.NextDue,
		Claimed: tickSteps(rnd.Claimed), Chained: tickSteps(rnd.Chained)}
	for _, o := range rnd.Outcomes {
		rep.Outcomes = append(rep.Outcomes, tickOutcomeOf(o))
	}
	return rep, err
}

// TickStep is a step a Tick ran: the instance, the step, and the keys whose
// slots it held.
type TickStep struct {
	ID       string
	Workflow string
	Version  int
	Queue    string
	Step     string
	// Attempt is 0 on the step's first run and grows by one per retry.
	Attempt int
	// Key is the step's first key ("" : none), and Keys every key it held
	// (Key first; nil: none).
	Key  string
	Keys []string
}

// TickOutcome is the committed outcome of a step a Tick ran.
type TickOutcome struct {
	// ID is the instance and Step the step that ran.
	ID   string
	Step string
	// Outcome is what the run came to, as the step history records it:
	// the transition's kind ("next", "done", "await", ...), "error" or
	// "panic" for a step error, or OutcomeInvalidTransition.
	Outcome string
	// Next is the step the instance runs next ("" when it ended).
	Next string
	// Error is the step's error, or why the instance stopped or failed.
	Error string
}

func tickSteps(cs []store.Claimed) []TickStep {
	var out []TickStep
	for _, c := range cs {
		out = append(out, TickStep{ID: c.ID, Workflow: c.Workflow, Version: c.Version, Queue: c.Queue,
			Step: c.Step, Attempt: c.Attempt, Key: c.Key, Keys: c.KeyList()})
	}
	return out
}

func tickOutcomeOf(o store.Outcome) TickOutcome {
	t := TickOutcome{ID: o.ID, Outcome: o.Kind.String(), Error: o.Error}
	if !o.Kind.Terminal() {
		t.Next = o.Step
	}
	// Every outcome an engine's step makes carries its history entry;
	// without one the kind is all there is to say.
	if h := o.History; h != nil {
		t.Step, t.Outcome = h.Step, h.Outcome
	}
	return t
}
