package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

// PanicError is the error a step's panic becomes; it carries the stack.
type PanicError struct {
	Value any
	Stack string
}

func (p *PanicError) Error() string { return fmt.Sprintf("panic: %v", p.Value) }

// TransitionError is a step's transition that cannot be carried out: a
// programming error (a next step the workflow does not have, a transition
// not built with the transitions package, a state, result or child state
// that cannot be encoded, such as a NaN float). The instance fails at
// once, without retries, and the engine logs it at ERROR: running the step
// again would return the same transition, side effects and all.
type TransitionError struct {
	Msg string
	// Err is the cause, when there is one: an encoding error wraps
	// ErrEncode.
	Err error
}

func (e *TransitionError) Error() string { return e.Msg }

// Unwrap returns the cause (nil: none).
func (e *TransitionError) Unwrap() error { return e.Err }

// OutcomeInvalidTransition is the history outcome (store.HistoryEntry) of a
// step whose transition was a TransitionError.
const OutcomeInvalidTransition = "invalid transition"

// after says when something d from now happens, in the terms of the store:
// an absolute time under a fake clock (durabletest drives time), otherwise a
// delay the store adds to its own clock, so that every run time and timeout
// is on one clock whatever the engine's clock says.
func (e *Engine) after(d time.Duration) (time.Time, time.Duration) {
	if e.fakeTime {
		return e.cfg.Clock.Now().Add(d), 0
	}
	return time.Time{}, d
}

// skewDelay is how long a row this worker cannot run (unknown version or
// step) waits before it is offered again, to a worker that may know it.
const skewDelay = 30 * time.Second

// execute runs one claimed step to completion and returns the outcome to
// commit. It never panics and never blocks beyond the step itself.
func (e *Engine) execute(ctx context.Context, c store.Claimed) store.Outcome {
	started := e.cfg.Clock.Now()
	ctx, span := e.tel.startStep(ctx, c)
	t0 := time.Now()
	out, label, errText := e.run(ctx, c)
	// Error text comes from user code (errors, panic values, stop reasons):
	// make it storable so that one odd message cannot make a whole batch
	// of outcomes fail to commit.
	errText, out.Error = cleanText(errText), cleanText(out.Error)
	e.tel.endStep(ctx, span, c, label, errText, time.Since(t0))
	out.ID, out.Fence = c.ID, c.Fence
	out.History = &store.HistoryEntry{
		InstanceID: c.ID, Step: c.Step, Attempt: c.Attempt, Key: c.Key, Worker: e.cfg.WorkerID,
		StartedAt: started, FinishedAt: e.cfg.Clock.Now(), Outcome: label, Error: errText,
	}
	for _, k := range c.Also {
		out.History.Also = append(out.History.Also, k.Key)
	}
	if label == transitions.KindStop.String() {
		// The reason is the instance's last error: its history row says
		// the same (a Stop is not a step error, so its span is not one).
		out.History.Error = out.Error
	}
	return out
}

func (e *Engine) run(ctx context.Context, c store.Claimed) (out store.Outcome, label, errText string) {
	def := e.lookup(c.Workflow, c.Version)
	if def == nil {
		// Deployment skew: leave it for a worker that knows this version.
		msg := fmt.Sprintf("%v %q version %d is not registered on worker %s", ErrUnknownWorkflow, c.Workflow, c.Version, e.cfg.WorkerID)
		if e.skew.record(c.Workflow, c.Version, "", e.cfg.Clock.Now()) {
			e.log.Warn("handing back instances of a workflow version this worker does not register, for a worker that does; "+
				"until one runs, they wait (durable health lists them)", "workflow", c.Workflow, "version", c.Version, "worker", e.cfg.WorkerID)
		}
		return e.unchanged(c, msg), "skipped", msg
	}
	sd := def.steps[c.Step]
	if sd == nil {
		msg := fmt.Sprintf("step %q of %s v%d is not registered on worker %s", c.Step, c.Workflow, c.Version, e.cfg.WorkerID)
		if e.skew.record(c.Workflow, c.Version, c.Step, e.cfg.Clock.Now()) {
			e.log.Warn("handing back instances at a step this worker's version of the workflow does not have, for a worker that does; "+
				"until one runs, they wait (durable health lists them)", "workflow", c.Workflow, "version", c.Version, "step", c.Step,
				"worker", e.cfg.WorkerID)
		}
		return e.unchanged(c, msg), "skipped", msg
	}
	sctx := e.newStepContext(ctx, c, def)
	var cancel context.CancelFunc = func() {}
	if sd.opts.Timeout > 0 {
		sctx.Context, cancel = context.WithTimeout(sctx.Context, sd.opts.Timeout)
	}
	if !stepStarting(ctx) {
		cancel()
		return store.Outcome{}, "not started", "" // canceled before it started: the runtime ignores this
	}
	t, err := callStep(sd, sctx, c.State)
	cancel()
	if err == nil {
		out, err = e.transitionOutcome(c, def, t)
		if err == nil {
			return out, t.Kind.String(), ""
		}
	}
	return e.errorOutcome(sctx, c, def, sd, err)
}

// callStep runs the step, turning a panic into a *PanicError.
func callStep(sd *stepDef, ctx steps.Context, state json.RawMessage) (t transitions.Transition, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: string(debug.Stack())}
		}
	}()
	return sd.run(ctx, state)
}

// unchanged re-offers the row later with everything as it was, marked as a
// hand-back so that the store keeps when it first became ready and Health
// counts it.
func (e *Engine) unchanged(c store.Claimed, msg string) store.Outcome {
	out := store.Outcome{Kind: store.OutcomeReady, Step: c.Step, State: c.State, Attempt: c.Attempt, Error: msg, HandBack: true}
	out.RunAt, out.Delay = e.after(skewDelay)
	return out
}

// errorOutcome applies the error handler: retry (state unchanged) or fail.
func (e *Engine) errorOutcome(sctx *stepContext, c store.Claimed, def *definition, sd *stepDef, err error) (store.Outcome, string, string) {
	label := "error"
	var pe *PanicError
	if errors.As(err, &pe) {
		label = "panic"
		sctx.Logger().Error("step panicked", "panic", fmt.Sprint(pe.Value), "stack", pe.Stack)
	}
	msg := err.Error()
	var de *decodeError
	var te *TransitionError
	if errors.As(err, &te) {
		label = OutcomeInvalidTransition
		sctx.Logger().Error("step returned a transition that cannot be carried out (a programming error); the instance fails without retries", "err", msg)
	}
	if errors.As(err, &de) || te != nil {
		return store.Outcome{Kind: store.OutcomeFailed, Step: c.Step, State: c.State, Attempt: c.Attempt, Error: msg}, label, msg
	}
	var delay time.Duration
	var retry bool
	if def.onError != nil {
		delay, retry = safeHandler(def.onError, sctx, err)
	} else {
		policy := def.retry
		if sd.opts.Retry != nil {
			policy = *sd.opts.Retry
		}
		if e.jitter != nil {
			delay, retry = policy.DelayWith(c.Attempt, e.jitter)
		} else {
			delay, retry = policy.Delay(c.Attempt)
		}
	}
	if !retry {
		return store.Outcome{Kind: store.OutcomeFailed, Step: c.Step, State: c.State, Attempt: c.Attempt, Error: msg}, label, msg
	}
	out := store.Outcome{Kind: store.OutcomeReady, Step: c.Step, State: c.State, Attempt: c.Attempt + 1, Error: msg}
	out.RunAt, out.Delay = e.after(delay)
	return out, label, msg
}

func safeHandler(h ErrorHandler, ctx steps.Context, err error) (d time.Duration, retry bool) {
	defer func() {
		if r := recover(); r != nil {
			d, retry = 0, false
		}
	}()
	return h(ctx, err)
}

// transitionOutcome turns a step's transition into the outcome to commit. An
// invalid transition (unknown next step, state that does not encode) is an
// error for the handler.
func (e *Engine) transitionOutcome(c store.Claimed, def *definition, t transitions.Transition) (store.Outcome, error) {
	out := store.Outcome{}
	if c.Signal != nil {
		out.ConsumeSignal = c.Signal.ID
	}
	needStep := func() error {
		if _, ok := def.steps[t.Step]; !ok {
			return &TransitionError{Msg: fmt.Sprintf("transition %s from step %q to unknown step %q of %s v%d (steps: %s)",
				t.Kind, c.Step, t.Step, def.name, def.version, strings.Join(def.stepNames(), ", "))}
		}
		out.Step = t.Step
		return nil
	}
	encodeState := func() error {
		s, err := e.encode("state", t.State)
		out.State = s
		return unencodable(c, "state", err)
	}
	if t.Timeout != 0 && t.Kind != transitions.KindAwait {
		return out, &TransitionError{Msg: fmt.Sprintf("transition %s from step %q has a Timeout, which only an Await takes", t.Kind, c.Step)}
	}
	if t.Timeout < 0 {
		return out, &TransitionError{Msg: fmt.Sprintf("await from step %q has a negative Timeout (%s)", c.Step, t.Timeout)}
	}
	switch t.Kind {
	case transitions.KindNext:
		out.Kind = store.OutcomeReady
		out.RunAt, out.Delay = e.after(0)
		if err := needStep(); err != nil {
			return out, err
		}
	case transitions.KindRetry:
		out.Kind, out.Step, out.Attempt = store.OutcomeReady, c.Step, c.Attempt+1
		out.RunAt, out.Delay = e.after(t.Delay)
	case transitions.KindSleep:
		out.Kind = store.OutcomeReady
		if err := needStep(); err != nil {
			return out, err
		}
		out.RunAt, out.Delay = e.after(t.Delay)
		if !t.Until.IsZero() {
			out.RunAt = t.Until
		}
	case transitions.KindAwait:
		if err := checkName("await signal name", t.Signal); err != nil {
			return out, err
		}
		out.Kind, out.AwaitSignal = store.OutcomeAwait, t.Signal
		if err := needStep(); err != nil {
			return out, err
		}
		if t.Timeout > 0 {
			out.TimeoutAt, out.Timeout = e.after(t.Timeout)
		}
	case transitions.KindSpawn:
		out.Kind = store.OutcomeSpawn
		if err := needStep(); err != nil {
			return out, err
		}
		reqs := make([]InsertRequest, len(t.Children))
		for i, ch := range t.Children {
			// Keys a child cannot hold are the step's mistake, as a key
			// edit's: the same step would spawn them again.
			if _, err := insertKeys(ch.Key, ch.Keys); err != nil {
				return out, &TransitionError{Msg: fmt.Sprintf("spawn from step %q: child #%d (%s): %v", c.Step, i, ch.Workflow, err), Err: err}
			}
			q := ch.Queue
			if q == "" {
				q = c.Queue
			}
			reqs[i] = InsertRequest{Workflow: ch.Workflow, State: ch.State, Options: InsertOptions{Key: ch.Key, Keys: ch.Keys, Queue: q, Priority: ch.Priority}}
		}
		children, err := e.prepareInserts(reqs, c.ID)
		if err != nil {
			if errors.Is(err, ErrEncode) {
				return out, unencodable(c, "child state", err)
			}
			return out, fmt.Errorf("spawn: %w", err)
		}
		out.Children = children
	case transitions.KindDone:
		out.Kind, out.Step, out.State = store.OutcomeDone, c.Step, c.State
		res, err := e.encode("result", t.Result)
		if err != nil {
			return out, unencodable(c, "result", err)
		}
		out.Result = res
		return out, nil
	case transitions.KindStop:
		out.Kind, out.Step, out.State, out.Attempt, out.Error = store.OutcomeFailed, c.Step, c.State, c.Attempt, t.Reason
		if out.Error == "" {
			out.Error = "stopped"
		}
		return out, nil
	default:
		return out, &TransitionError{Msg: fmt.Sprintf("invalid transition (kind %d) from step %q: build it with the transitions package", t.Kind, c.Step)}
	}
	if err := encodeState(); err != nil {
		return out, err
	}
	if err := e.keysOutcome(c, t, &out); err != nil {
		return out, err
	}
	return out, nil
}

// keysOutcome applies a transition's key edits (or, for a Transition built
// by hand without them, its KeyChange) to the keys the row holds now and
// sets the outcome's whole new key set. An edit that cannot apply is a
// TransitionError; every key the row did not hold goes through checkKey.
func (e *Engine) keysOutcome(c store.Claimed, t transitions.Transition, out *store.Outcome) error {
	edits := t.KeyEdits
	if len(edits) == 0 && t.KeyChange != nil {
		ed := transitions.KeyEdit{Op: transitions.KeySet}
		if k := t.KeyChange.Key; !k.IsZero() { // an invalid key is not zero: refused below
			ed.Keys = []gate.ConcurrencyKey{k}
		}
		edits = []transitions.KeyEdit{ed}
	}
	if len(edits) == 0 {
		return nil
	}
	held, err := rowKeys(c.Instance)
	if err != nil {
		return fmt.Errorf("transition %s from step %q: the row's keys: %w", t.Kind, c.Step, err)
	}
	keys, err := nextKeys(held, edits)
	if err != nil {
		return &TransitionError{Msg: fmt.Sprintf("transition %s from step %q changes its concurrency keys wrongly: %v", t.Kind, c.Step, err), Err: err}
	}
	for _, k := range keys {
		if !slices.ContainsFunc(held, func(h gate.ConcurrencyKey) bool { return h.String() == k.String() }) {
			if err := e.checkKey(k); err != nil {
				return err
			}
		}
	}
	key, intent, also, err := storeKeys(keys)
	if err != nil {
		return &TransitionError{Msg: fmt.Sprintf("transition %s from step %q changes its concurrency keys wrongly: %v", t.Kind, c.Step, err), Err: err}
	}
	out.SetKey, out.Key, out.KeyIntent, out.Also = true, key, intent, also
	return nil
}

// unencodable turns an error of encoding what step c returned (its new
// state, result or a child's state) into a TransitionError: the same
// step would return the same value again, so retrying it only repeats its
// side effects. Other errors (a payload over Config.MaxPayloadBytes, which
// may depend on what the step fetched) are returned as they are.
func unencodable(c store.Claimed, what string, err error) error {
	if err == nil || !errors.Is(err, ErrEncode) {
		return err
	}
	return &TransitionError{Msg: fmt.Sprintf("step %q of %s v%d returned a %s that cannot be encoded: %v", c.Step, c.Workflow, c.Version, what, err), Err: err}
}

// stepContext implements steps.Context.
type stepContext struct {
	context.Context
	e *Engine
	c store.Claimed
	// log is the step's logger, built the first time Logger is called:
	// most steps never log, and With formats its attributes at once.
	logOnce sync.Once
	log     *slog.Logger
}

func (e *Engine) newStepContext(ctx context.Context, c store.Claimed, def *definition) *stepContext {
	return &stepContext{Context: ctx, e: e, c: c}
}

func (s *stepContext) InstanceID() string { return s.c.ID }
func (s *stepContext) Workflow() string   { return s.c.Workflow }
func (s *stepContext) Step() string       { return s.c.Step }
func (s *stepContext) Attempt() int       { return s.c.Attempt }
func (s *stepContext) Key() string        { return s.c.Key }
func (s *stepContext) Keys() []string     { return s.c.KeyList() }
func (s *stepContext) TimedOut() bool     { return s.c.TimedOut }
func (s *stepContext) Now() time.Time     { return s.e.cfg.Clock.Now() }

// Logger is the engine's logger with the step's instance, workflow, step
// and attempt.
func (s *stepContext) Logger() *slog.Logger {
	s.logOnce.Do(func() {
		s.log = s.e.log.With("instance", s.c.ID, "workflow", s.c.Workflow, "step", s.c.Step, "attempt", s.c.Attempt)
	})
	return s.log
}

func (s *stepContext) Signal() (steps.Signal, bool) {
	if s.c.Signal == nil {
		return steps.Signal{}, false
	}
	return steps.Signal{Name: s.c.Signal.Name, Payload: s.c.Signal.Payload, SentAt: s.c.Signal.CreatedAt}, true
}

func (s *stepContext) Children() ([]steps.Child, error) {
	kids, err := s.e.st.Children(s, s.c.ID)
	if err != nil {
		return nil, err
	}
	out := make([]steps.Child, len(kids))
	for i, k := range kids {
		out[i] = steps.Child{ID: k.ID, Workflow: k.Workflow, Status: string(k.Status), Result: k.Result, Error: k.LastError}
	}
	return out, nil
}

var _ steps.Context = (*stepContext)(nil)
