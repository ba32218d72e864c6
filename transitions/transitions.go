// Package transitions defines what a step returns: where the instance goes
// next. Every transition is committed, with the new state, before anything
// else happens to the instance.
package transitions

import (
	"time"

	"github.com/godurable/godurable/gate"
)

// Kind is the kind of a transition.
type Kind int

const (
	// KindNext continues at another step; the attempt resets to 0.
	KindNext Kind = iota + 1
	// KindRetry runs the same step again after a delay; attempt + 1.
	KindRetry
	// KindAwait parks until a named signal arrives (or a timeout fires).
	KindAwait
	// KindSleep parks until a time, as a durable timer.
	KindSleep
	// KindSpawn inserts child instances and parks until all are terminal.
	KindSpawn
	// KindDone is terminal success.
	KindDone
	// KindStop is terminal failure.
	KindStop
)

var kindNames = map[Kind]string{KindNext: "next", KindRetry: "retry", KindAwait: "await",
	KindSleep: "sleep", KindSpawn: "spawn", KindDone: "done", KindStop: "stop"}

// String returns the lower-case name of the kind.
func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return "invalid"
}

// Transition is the value a step returns. Build it with the constructors of
// this package; the zero Transition is invalid.
type Transition struct {
	// Kind is what happens next.
	Kind Kind
	// Step is the step to run next (Next, Await, Sleep, Spawn) .
	Step string
	// State is the new state, JSON-encoded by the engine.
	State any
	// Delay is how long Retry waits, or how long Sleep sleeps when Until is zero.
	Delay time.Duration
	// Until is the wall-clock time Sleep wakes at (if non-zero).
	Until time.Time
	// Signal is the signal name Await waits for.
	Signal string
	// Timeout bounds an Await (0: wait forever). On timeout the next step
	// runs with no signal and steps.Context.TimedOut() true.
	Timeout time.Duration
	// Children are the instances Spawn inserts.
	Children []Child
	// Result is the result of Done.
	Result any
	// Reason is the failure reason of Stop.
	Reason string
	// KeyChange is set by ReleaseKey or SwitchKey.
	KeyChange *KeyChange
}

// KeyChange replaces the instance's concurrency key from the next claim on.
// A zero Key releases it.
type KeyChange struct {
	Key gate.ConcurrencyKey
}

// Child is one instance a Spawn inserts. Children carry their own keys.
type Child struct {
	// Workflow is the registered workflow name of the child.
	Workflow string
	// State is the child's initial state.
	State any
	// Key is the child's concurrency key (zero: none).
	Key gate.ConcurrencyKey
	// Queue is the child's queue ("" : the parent's queue).
	Queue string
	// Priority is the child's priority (lower runs first).
	Priority int
}

// Option modifies a Next, Retry, Await or Sleep transition.
type Option func(*Transition)

// ReleaseKey drops the instance's concurrency key: the following steps run
// with no key and pay nothing for admission.
func ReleaseKey() Option {
	return func(t *Transition) { t.KeyChange = &KeyChange{} }
}

// SwitchKey replaces the instance's concurrency key with k; the next step is
// admitted under k at its claim.
func SwitchKey(k gate.ConcurrencyKey) Option {
	return func(t *Transition) { t.KeyChange = &KeyChange{Key: k} }
}

// Timeout bounds an Await: after d the next step runs without a signal.
// Only an Await takes it: the engine refuses any other transition with a
// Timeout as a programming error (the instance fails at once).
func Timeout(d time.Duration) Option {
	return func(t *Transition) { t.Timeout = d }
}

func apply(t Transition, opts []Option) Transition {
	for _, o := range opts {
		o(&t)
	}
	return t
}

// Next continues at step with state; the attempt resets to 0.
func Next(step string, state any, opts ...Option) Transition {
	return apply(Transition{Kind: KindNext, Step: step, State: state}, opts)
}

// Retry runs the current step again after delay with state; attempt + 1.
func Retry(state any, after time.Duration, opts ...Option) Transition {
	return apply(Transition{Kind: KindRetry, State: state, Delay: after}, opts)
}

// Await parks the instance, releasing its concurrency slot, until a signal
// named signal arrives; then next runs and sees the signal. A signal sent
// before the await is not lost: it is waiting in the inbox.
func Await(signal, next string, state any, opts ...Option) Transition {
	return apply(Transition{Kind: KindAwait, Signal: signal, Step: next, State: state}, opts)
}

// Sleep parks the instance for d (a durable timer), releasing its slot, then
// runs next.
func Sleep(d time.Duration, next string, state any, opts ...Option) Transition {
	return apply(Transition{Kind: KindSleep, Delay: d, Step: next, State: state}, opts)
}

// SleepUntil parks the instance until t, releasing its slot, then runs next.
func SleepUntil(t time.Time, next string, state any, opts ...Option) Transition {
	return apply(Transition{Kind: KindSleep, Until: t, Step: next, State: state}, opts)
}

// Spawn inserts children and parks, releasing the slot, until every child is
// terminal; then next runs and can read their results.
func Spawn(children []Child, next string, state any) Transition {
	return Transition{Kind: KindSpawn, Children: children, Step: next, State: state}
}

// Done ends the instance successfully with result (JSON-encoded).
func Done(result any) Transition { return Transition{Kind: KindDone, Result: result} }

// Stop ends the instance as failed with reason.
func Stop(reason string) Transition { return Transition{Kind: KindStop, Reason: reason} }
