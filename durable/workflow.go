package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/transitions"
)

// ErrorHandler decides what happens when a step returns an error or panics.
// It returns the delay before the step runs again and true to retry, or
// false to stop the instance as failed. The state is not changed by a retry
// decided here: the step runs again with the state it started with.
type ErrorHandler func(ctx steps.Context, err error) (retryAfter time.Duration, retry bool)

// WorkflowOptions configures a workflow definition.
type WorkflowOptions struct {
	// Version of the definition (default 1). Instances finish on the version
	// they were inserted with; register every version that still has live
	// instances.
	Version int
	// Queue new instances go to unless Insert says otherwise (default "default").
	Queue string
	// Retry is the default retry policy of every step (see steps.RetryPolicy
	// for its defaults: 10 attempts, exponential backoff from 1s).
	Retry steps.RetryPolicy
	// OnError replaces the default error handler (retry by Retry, then stop).
	OnError ErrorHandler
	// Retention, when positive, is how long this workflow's terminal
	// instances are kept: shorter than Config.Retention, which still bounds
	// every row (Register refuses a longer one). The reconciler deletes
	// them in bounded chunks (see store.Store.DeleteTerminal). Versions
	// of one workflow share the latest registered version's. Zero:
	// Config.Retention.
	Retention time.Duration
}

// Workflow is a state machine over the state type S: named steps, each
// returning a transition. Build it with NewWorkflow and Step, then pass it
// to Engine.Register.
type Workflow[S any] struct {
	def *definition
}

// Definition is a registrable workflow; *Workflow[S] implements it for every S.
type Definition interface {
	// Name is the workflow's name, the handle Insert takes.
	Name() string
	// Version is the definition's version.
	Version() int
	definition() *definition
}

// NewWorkflow starts a workflow definition with its name and initial step.
func NewWorkflow[S any](name, initial string, opts WorkflowOptions) *Workflow[S] {
	if opts.Version == 0 {
		opts.Version = 1
	}
	if opts.Queue == "" {
		opts.Queue = DefaultQueue
	}
	return &Workflow[S]{def: &definition{
		name: name, version: opts.Version, initial: initial, queue: opts.Queue,
		retry: opts.Retry, onError: opts.OnError, retention: opts.Retention, steps: map[string]*stepDef{},
	}}
}

// Step adds a step with the workflow's defaults: no timeout, and the retry
// policy and error handler of WorkflowOptions. StepWith adds one with its
// own steps.Options. A name added twice is an error at Engine.Register.
func (w *Workflow[S]) Step(name string, fn steps.Func[S]) *Workflow[S] {
	return w.StepWith(name, fn, steps.Options{})
}

// StepWith adds a step with its own settings (see steps.Options); the zero
// Options is Step's defaults. A name added twice is an error at
// Engine.Register.
func (w *Workflow[S]) StepWith(name string, fn steps.Func[S], o steps.Options) *Workflow[S] {
	if _, dup := w.def.steps[name]; dup {
		w.def.errs = append(w.def.errs, fmt.Errorf("step %q is defined twice", name))
	}
	w.def.steps[name] = &stepDef{
		name: name, opts: o,
		run: func(ctx steps.Context, raw json.RawMessage) (transitions.Transition, error) {
			var s S
			if len(raw) > 0 {
				if err := json.Unmarshal(raw, &s); err != nil {
					return transitions.Transition{}, &decodeError{err: err}
				}
			}
			return fn(ctx, s)
		},
	}
	return w
}

// Name is the workflow's name.
func (w *Workflow[S]) Name() string { return w.def.name }

// Version is the definition's version.
func (w *Workflow[S]) Version() int { return w.def.version }

func (w *Workflow[S]) definition() *definition { return w.def }

// definition is the type-erased form the engine runs.
type definition struct {
	name    string
	version int
	initial string
	queue   string
	retry   steps.RetryPolicy
	onError ErrorHandler
	// retention is WorkflowOptions.Retention.
	retention time.Duration
	steps     map[string]*stepDef
	errs      []error // mistakes made while defining it, reported at Register
}

type stepDef struct {
	name string
	opts steps.Options
	run  func(ctx steps.Context, raw json.RawMessage) (transitions.Transition, error)
}

func (d *definition) validate() error {
	if d.name == "" {
		return fmt.Errorf("workflow has no name")
	}
	if err := checkName("workflow name", d.name); err != nil {
		return err
	}
	if len(d.errs) > 0 {
		return fmt.Errorf("workflow %q: %w", d.name, errors.Join(d.errs...))
	}
	if err := checkName("queue name", d.queue); err != nil {
		return fmt.Errorf("workflow %q: %w", d.name, err)
	}
	for name := range d.steps {
		if err := checkName("step name", name); err != nil {
			return fmt.Errorf("workflow %q: %w", d.name, err)
		}
	}
	if len(d.steps) == 0 {
		return fmt.Errorf("workflow %q has no steps", d.name)
	}
	if d.retention < 0 {
		return fmt.Errorf("workflow %q: retention %v is negative (zero: Config.Retention)", d.name, d.retention)
	}
	if _, ok := d.steps[d.initial]; !ok {
		return fmt.Errorf("workflow %q: initial step %q is not defined", d.name, d.initial)
	}
	return nil
}

// decodeError marks a state that does not decode into the workflow's type:
// retrying cannot help, so the instance fails at once.
type decodeError struct{ err error }

func (e *decodeError) Error() string { return "decode state: " + e.err.Error() }
func (e *decodeError) Unwrap() error { return e.err }

// Call runs one step of the workflow directly, outside any engine, with
// panics turned into a *PanicError. It is for unit tests of a single step;
// durabletest.Env.RunStep builds the context for it.
func (w *Workflow[S]) Call(ctx steps.Context, step string, state S) (transitions.Transition, error) {
	sd := w.def.steps[step]
	if sd == nil {
		return transitions.Transition{}, fmt.Errorf("workflow %q has no step %q", w.def.name, step)
	}
	raw, err := json.Marshal(state)
	if err != nil {
		return transitions.Transition{}, fmt.Errorf("%w state: %v", ErrEncode, err)
	}
	return callStep(sd, ctx, raw)
}

// stepNames returns the definition's step names, sorted.
func (d *definition) stepNames() []string {
	names := make([]string, 0, len(d.steps))
	for n := range d.steps {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// TypedRequest is one instance of Workflow.InsertMany: a state of the
// workflow's own type, checked at compile time, and its insert options.
type TypedRequest[S any] struct {
	State   S
	Options InsertOptions
}

// ErrNotLatestVersion is returned by the inserts of a Workflow handle whose
// version is registered but is not the highest registered version of its
// name: new instances start on the highest version, so they must be
// inserted with that version's handle (and state type).
var ErrNotLatestVersion = errors.New("not the latest registered version")

// Insert starts an instance of w on e with state s and returns its id, as
// Engine.Insert does for w's name, but with the state type checked at
// compile time. w must be registered on e and be the highest registered
// version of its name; otherwise the error wraps ErrUnknownWorkflow or
// ErrNotLatestVersion and nothing is inserted. Wait for the typed result
// with Result.
func (w *Workflow[S]) Insert(ctx context.Context, e *Engine, s S, opts InsertOptions) (string, error) {
	if err := w.checkOn(e); err != nil {
		return "", err
	}
	return e.Insert(ctx, w.def.name, s, opts)
}

// InsertMany starts instances of w on e atomically (all or none), as
// Engine.InsertMany does, with the states' type checked at compile time.
// The registration rules of Insert apply.
func (w *Workflow[S]) InsertMany(ctx context.Context, e *Engine, reqs []TypedRequest[S]) ([]string, error) {
	if err := w.checkOn(e); err != nil {
		return nil, err
	}
	return e.InsertMany(ctx, w.requests(reqs))
}

// InsertTx starts an instance of w on e inside the caller's transaction tx,
// as Engine.InsertTx does, with the state type checked at compile time. The
// registration rules of Insert apply.
func (w *Workflow[S]) InsertTx(ctx context.Context, e *Engine, tx pgx.Tx, s S, opts InsertOptions) (string, error) {
	if err := w.checkOn(e); err != nil {
		return "", err
	}
	return e.InsertTx(ctx, tx, w.def.name, s, opts)
}

// InsertManyTx is InsertMany inside the caller's transaction tx (see
// Engine.InsertManyTx).
func (w *Workflow[S]) InsertManyTx(ctx context.Context, e *Engine, tx pgx.Tx, reqs []TypedRequest[S]) ([]string, error) {
	if err := w.checkOn(e); err != nil {
		return nil, err
	}
	return e.InsertManyTx(ctx, tx, w.requests(reqs))
}

func (w *Workflow[S]) requests(reqs []TypedRequest[S]) []InsertRequest {
	out := make([]InsertRequest, len(reqs))
	for i, r := range reqs {
		out[i] = InsertRequest{Workflow: w.def.name, State: r.State, Options: r.Options}
	}
	return out
}

// checkOn reports whether an insert of w's name on e starts an instance of
// w itself: w is registered on e and is the latest version of its name.
func (w *Workflow[S]) checkOn(e *Engine) error {
	if e == nil {
		return fmt.Errorf("durable: insert %s: nil engine", w.def.name)
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.defs[w.def.name][w.def.version] != w.def {
		return fmt.Errorf("durable: insert %s: %w: this definition (version %d) is not registered on this engine; call Register with it before inserting",
			w.def.name, ErrUnknownWorkflow, w.def.version)
	}
	if latest := e.latest[w.def.name]; latest != w.def {
		return fmt.Errorf("durable: insert %s: %w: version %d is registered, but new instances start on version %d: insert with that version's handle",
			w.def.name, ErrNotLatestVersion, w.def.version, latest.version)
	}
	return nil
}
