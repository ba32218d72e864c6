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
	// KeyChange is set by ReleaseKey or SwitchKey (the last one given).
	// It is kept for code that reads it; the engine applies KeyEdits, and
	// applies KeyChange only to a Transition that has no KeyEdits (one built
	// by hand), as SetKeys of its Key (none for the zero key).
	KeyChange *KeyChange
	// KeyEdits are the changes to the instance's concurrency keys that the
	// options gave (ReleaseKey, SwitchKey, AddKey, DropKey, ReplaceKey,
	// SetKeys), in the order given. The engine applies them one after the
	// other to the keys the instance holds now; the keys they leave are
	// the keys of the next step (see KeyEdit).
	KeyEdits []KeyEdit
}

// KeyChange replaces every concurrency key of the instance with Key from
// the next claim on. A zero Key releases them all.
type KeyChange struct {
	Key gate.ConcurrencyKey
}

// KeyOp is what a KeyEdit does to the instance's keys.
type KeyOp int

const (
	// KeySet replaces every key with KeyEdit.Keys (none: releases them
	// all). ReleaseKey, SwitchKey and SetKeys make it.
	KeySet KeyOp = iota + 1
	// KeyAdd adds KeyEdit.Key and keeps the others (AddKey).
	KeyAdd
	// KeyDrop releases KeyEdit.Key and keeps the others (DropKey).
	KeyDrop
	// KeyReplace replaces KeyEdit.Old with KeyEdit.Key and keeps the
	// others (ReplaceKey).
	KeyReplace
)

var keyOpNames = map[KeyOp]string{KeySet: "set", KeyAdd: "add", KeyDrop: "drop", KeyReplace: "replace"}

// String returns the lower-case name of the operation.
func (o KeyOp) String() string {
	if s, ok := keyOpNames[o]; ok {
		return s
	}
	return "invalid"
}

// KeyEdit is one change to the instance's concurrency keys. Keys are
// matched by their name:id, whatever their declared intent. An edit that
// cannot apply is a programming error, and the instance fails at once
// without retries: dropping or replacing a key the instance does not hold,
// adding a key it holds (or replacing a key with another it holds), an
// invalid or zero key, a key given twice to SetKeys, or edits that leave
// more than durable.MaxKeys keys.
type KeyEdit struct {
	// Op is what the edit does.
	Op KeyOp
	// Key is the key added, dropped, or put in Old's place.
	Key gate.ConcurrencyKey
	// Old is the key ReplaceKey replaces.
	Old gate.ConcurrencyKey
	// Keys are the keys KeySet leaves (none: no key).
	Keys []gate.ConcurrencyKey
}

// Child is one instance a Spawn inserts. Children carry their own keys.
type Child struct {
	// Workflow is the registered workflow name of the child.
	Workflow string
	// State is the child's initial state.
	State any
	// Key is the child's concurrency key (zero: none): the one-key
	// shorthand of Keys.
	Key gate.ConcurrencyKey
	// Keys are the child's concurrency keys when it has several (at most
	// durable.MaxKeys, none twice): each of its steps runs only when every
	// one of them has room. Setting both Key and Keys is an error.
	Keys []gate.ConcurrencyKey
	// Queue is the child's queue ("" : the parent's queue).
	Queue string
	// Priority is the child's priority (lower runs first).
	Priority int
}

// Option modifies a Next, Retry, Await or Sleep transition. The key
// options (ReleaseKey, SwitchKey, AddKey, DropKey, ReplaceKey, SetKeys)
// apply in the order given, starting from the keys the instance holds.
type Option func(*Transition)

// ReleaseKey releases EVERY concurrency key of the instance: the following
// steps run with no key and pay nothing for admission. To release one key
// of several and keep the others, use DropKey.
func ReleaseKey() Option {
	return func(t *Transition) {
		t.KeyChange = &KeyChange{}
		t.KeyEdits = append(t.KeyEdits, KeyEdit{Op: KeySet})
	}
}

// SwitchKey replaces EVERY concurrency key of the instance with k (a zero k
// releases them all); the next step is admitted under k alone at its claim.
//
// With several keys this drops all the others: a step that holds an
// account's identity and a payment gate and returns SwitchKey(gate) no
// longer holds the account, so another step of the same account may run
// beside it. To change one key and keep the others, use ReplaceKey (or
// AddKey and DropKey).
func SwitchKey(k gate.ConcurrencyKey) Option {
	return func(t *Transition) {
		t.KeyChange = &KeyChange{Key: k}
		e := KeyEdit{Op: KeySet}
		if !k.IsZero() {
			e.Keys = []gate.ConcurrencyKey{k}
		}
		t.KeyEdits = append(t.KeyEdits, e)
	}
}

// AddKey adds k to the instance's concurrency keys and keeps the others:
// from the next step on, each step runs only when every key has room. Adding
// a key the instance already holds (same name:id) is a programming error.
func AddKey(k gate.ConcurrencyKey) Option {
	return func(t *Transition) { t.KeyEdits = append(t.KeyEdits, KeyEdit{Op: KeyAdd, Key: k}) }
}

// DropKey releases k (matched by name:id) and keeps the instance's other
// keys. Dropping a key the instance does not hold is a programming error.
func DropKey(k gate.ConcurrencyKey) Option {
	return func(t *Transition) { t.KeyEdits = append(t.KeyEdits, KeyEdit{Op: KeyDrop, Key: k}) }
}

// ReplaceKey puts k in the place of old (matched by name:id) and keeps the
// instance's other keys: the one-key change that SwitchKey is not when the
// instance holds several. old must be held, and k must not be held unless
// it is old itself (with another intent).
func ReplaceKey(old, k gate.ConcurrencyKey) Option {
	return func(t *Transition) { t.KeyEdits = append(t.KeyEdits, KeyEdit{Op: KeyReplace, Old: old, Key: k}) }
}

// SetKeys replaces every concurrency key of the instance with ks (none:
// release them all): at most durable.MaxKeys keys, none twice, none zero.
func SetKeys(ks ...gate.ConcurrencyKey) Option {
	return func(t *Transition) {
		t.KeyEdits = append(t.KeyEdits, KeyEdit{Op: KeySet, Keys: append([]gate.ConcurrencyKey(nil), ks...)})
	}
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
