// Package steps defines what a step is: the function type, the context it
// runs with, and per-step options such as a timeout and a retry policy.
package steps

import (
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/godurable/godurable/transitions"
)

// Func is a step of a workflow over state type S. It returns the transition
// to take; a returned error (or a panic) goes to the workflow's error handler.
type Func[S any] func(ctx Context, s S) (transitions.Transition, error)

// Context is what a running step can see. It is a context.Context that is
// cancelled when the step's timeout passes, its lease is lost, the instance
// is cancelled, or the engine's stop deadline passes.
type Context interface {
	context.Context
	// InstanceID is the id of the running instance.
	InstanceID() string
	// Workflow is the workflow name.
	Workflow() string
	// Step is the name of the running step.
	Step() string
	// Attempt is 0 on the first run of a step and grows by one per retry.
	Attempt() int
	// Key is the concurrency key the step was admitted under ("" for
	// none); with several keys, the first of Keys.
	Key() string
	// Keys are every concurrency key the step was admitted under and holds
	// while it runs: Key first, then the others in key order (nil: none).
	Keys() []string
	// Signal returns the signal that woke this step after an Await.
	Signal() (Signal, bool)
	// TimedOut reports whether this step runs because an Await timed out.
	TimedOut() bool
	// Children returns the children of the Spawn that this step follows.
	Children() ([]Child, error)
	// Now is the engine's clock (a fake clock under durabletest).
	Now() time.Time
	// Logger is a logger carrying the instance id, workflow and step.
	Logger() *slog.Logger
}

// Signal is a delivered signal.
type Signal struct {
	// Name of the signal.
	Name string
	// Payload is the JSON payload (may be nil).
	Payload json.RawMessage
	// SentAt is when the signal was stored.
	SentAt time.Time
}

// Decode unmarshals the payload into v.
func (s Signal) Decode(v any) error { return json.Unmarshal(s.Payload, v) }

// Child is a spawned child's terminal outcome.
type Child struct {
	// ID of the child instance.
	ID string
	// Workflow of the child.
	Workflow string
	// Status is "done", "failed" or "canceled".
	Status string
	// Result is the JSON result of a child that is done.
	Result json.RawMessage
	// Error is the failure of a child that failed.
	Error string
}

// Decode unmarshals the child's result into v.
func (c Child) Decode(v any) error { return json.Unmarshal(c.Result, v) }

// Options are one step's settings, passed as one value to
// durable.Workflow.StepWith; the zero Options is what durable.Workflow.Step
// gives a step (no timeout, the workflow's retry policy).
type Options struct {
	// Timeout cancels the step's context after this long (0: no timeout).
	// A step that overruns its timeout is handled like an error.
	Timeout time.Duration
	// Retry overrides the workflow's retry policy for this step.
	Retry *RetryPolicy
}

// RetryPolicy is exponential backoff (cenkalti/backoff) up to MaxAttempts.
type RetryPolicy struct {
	// MaxAttempts is how many times the step runs in all before the instance
	// stops as failed. Default 10.
	MaxAttempts int
	// InitialInterval is the first delay. Default 1s.
	InitialInterval time.Duration
	// MaxInterval caps the delay. Default 5m.
	MaxInterval time.Duration
	// Multiplier grows the delay per attempt. Default 2.
	Multiplier float64
	// RandomizationFactor jitters each delay by ±factor. Default 0.2; set a
	// negative value for no jitter. The engine draws the jitter from
	// durable.Config.Jitter (durabletest seeds it).
	RandomizationFactor float64
}

// DefaultRetryPolicy is the policy a workflow gets when it sets none.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{MaxAttempts: 10, InitialInterval: time.Second, MaxInterval: 5 * time.Minute, Multiplier: 2, RandomizationFactor: 0.2}
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	d := DefaultRetryPolicy()
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = d.MaxAttempts
	}
	if p.InitialInterval <= 0 {
		p.InitialInterval = d.InitialInterval
	}
	if p.MaxInterval <= 0 {
		p.MaxInterval = d.MaxInterval
	}
	if p.Multiplier <= 0 {
		p.Multiplier = d.Multiplier
	}
	if p.RandomizationFactor == 0 {
		p.RandomizationFactor = d.RandomizationFactor
	} else if p.RandomizationFactor < 0 {
		p.RandomizationFactor = 0
	}
	return p
}

// Delay returns the delay before the retry that follows a failed attempt
// (attempt 0 is the first run), and false once MaxAttempts runs are used up.
// Its jitter comes from math/rand's global source; DelayWith takes another.
func (p RetryPolicy) Delay(attempt int) (time.Duration, bool) {
	return p.DelayWith(attempt, rand.Float64)
}

// DelayWith is Delay with the jitter drawn from random, which must return a
// uniform number in [0, 1). The delay is the exponential interval of the
// attempt spread evenly over ±RandomizationFactor of it, so a seeded random
// gives the same delays on every run (durabletest relies on it).
func (p RetryPolicy) DelayWith(attempt int, random func() float64) (time.Duration, bool) {
	p = p.withDefaults()
	if attempt+1 >= p.MaxAttempts {
		return 0, false
	}
	// backoff computes the capped exponential interval; the jitter is
	// applied here so that its source is the caller's.
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = p.InitialInterval
	b.MaxInterval = p.MaxInterval
	b.Multiplier = p.Multiplier
	b.RandomizationFactor = 0
	b.MaxElapsedTime = 0
	b.Reset()
	d := b.NextBackOff()
	for i := 0; i < attempt; i++ {
		d = b.NextBackOff()
	}
	if f := p.RandomizationFactor; f > 0 {
		d = max(time.Duration(float64(d)*(1-f+2*f*random())), 0)
	}
	return d, true
}
