package durable

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

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
		retry: opts.Retry, onError: opts.OnError, steps: map[string]*stepDef{},
	}}
}

// Step adds a step. Registering a name twice replaces the earlier step.
func (w *Workflow[S]) Step(name string, fn steps.Func[S], opts ...steps.Options) *Workflow[S] {
	var o steps.Options
	if len(opts) > 0 {
		o = opts[0]
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
	steps   map[string]*stepDef
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
