// Package chaos is the chaos test of godurable: several engine processes on
// one PostgreSQL database run a mixed workload while a controller kills
// random worker processes with SIGKILL, restarts them, and restarts the
// database once. An outside recorder (an append-only file per process,
// written by the step bodies) and the database itself are then checked:
// every instance terminal with its expected result, no key over its K at
// any moment, every gate counter equal to the executing-rows truth, and no
// stale outcome committed. cmd/durable-chaos is its command line.
//
// # What counts as a violation of K
//
// Each step body writes a start line before it does anything and an end line
// after it is done, both with the wall clock of the (single) host, so that
// the recorded interval encloses the body's work. For a process killed with
// SIGKILL, a step with a start line and no end line ends at the moment the
// controller saw the process die (after wait(2) returned): nothing of the
// body can run later. A killed worker's claim is taken over either when its
// replacement starts with the same worker id (startup reclaim, after the
// death) or when its lease expires (after the death too, as long as the
// dead worker was heartbeating until it died). So such a step, too, must
// never overlap more than K−1 other steps of its key.
//
// The one overlap the guarantee allows is a stale step: a live worker whose
// lease expired (its heartbeats could not reach the database for longer than
// the lease) while its step still ran, and whose claim the reaper gave to
// another worker. Fences, not the admission rules, make such a step's
// outcome commit nothing. The leases are chosen longer than the database
// restart plus two heartbeats so that this should not happen at all; if it
// does, the engine logs the stale outcome, and the checker excludes exactly
// the run whose outcome the engine discarded (and reports how many).
package chaos

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/transitions"
)

// Workflow names.
const (
	ParentWorkflow = "chaos"
	ChildWorkflow  = "chaos-child"
	// SignalName is the signal the controller sends and awaits wait for.
	SignalName = "go"
)

// KeyIDMarker is part of every key id of the workload, so that a search of
// the worker logs for it finds any key value that leaked into them.
const KeyIDMarker = "sid-"

// Limits are the gates of the workload: "api" keys run 3 at once over 2
// shards, "bulk" keys 5 at once over 3 shards. "acct" keys have no limit and
// so run at K = 1.
var Limits = []gate.Limit{{Name: "api", Limit: 3, Shards: 2}, {Name: "bulk", Limit: 5, Shards: 3}}

// RateLimits are the flow caps of the workload: steps of all "bulk" keys
// together start at most BulkRate per second after a burst of BulkBurst,
// on top of their gate (a stock cap). The checker verifies the bound from
// the recorded starts.
var RateLimits = []gate.RateLimit{{Name: "bulk", Limit: BulkRate, Period: time.Second, Burst: BulkBurst}}

// The "bulk" rate limit.
const (
	BulkRate  = 40
	BulkBurst = 8
)

// KeySpace sizes the keys the workload draws from.
type KeySpace struct {
	Acct, API, Bulk int
}

// DefaultKeySpace has few keys per name, so that keys are contended.
var DefaultKeySpace = KeySpace{Acct: 6, API: 3, Bulk: 2}

// State is the state of a chaos instance. Every run that commits a state
// appends its token to Chain, so the final state lists the committed runs in
// order; Steps is their count as the runs saw it (always len(Chain)).
type State struct {
	Steps int      `json:"steps"`
	Max   int      `json:"max"`
	Chain []string `json:"chain"`
	Child bool     `json:"child,omitempty"`
	// Kids is how many children this instance spawned (at most one spawn).
	Kids int `json:"kids,omitempty"`
}

// randomKey draws a key: a third K = 1, a third gated, a third none.
func (ks KeySpace) randomKey(r *mrand.Rand) gate.ConcurrencyKey {
	switch p := r.IntN(9); {
	case p < 3:
		return gate.Identity("acct", fmt.Sprintf("%s%d", KeyIDMarker, r.IntN(ks.Acct)))
	case p < 5:
		return gate.Gate("api", fmt.Sprintf("%s%d", KeyIDMarker, r.IntN(ks.API)))
	case p < 6:
		return gate.Gate("bulk", fmt.Sprintf("%s%d", KeyIDMarker, r.IntN(ks.Bulk)))
	default:
		return gate.ConcurrencyKey{}
	}
}

// randomKeys draws the keys of a row: a third of the rows that have a key
// get two (an account and an API gate, two accounts, or an API gate and a
// bulk gate), the others one key or none (randomKey). Two keys of one row
// are never the same key.
func (ks KeySpace) randomKeys(r *mrand.Rand) []gate.ConcurrencyKey {
	first := ks.randomKey(r)
	if first.IsZero() || r.IntN(3) > 0 {
		if first.IsZero() {
			return nil
		}
		return []gate.ConcurrencyKey{first}
	}
	acct := func() gate.ConcurrencyKey {
		return gate.Identity("acct", fmt.Sprintf("%s%d", KeyIDMarker, r.IntN(ks.Acct)))
	}
	api := gate.Gate("api", fmt.Sprintf("%s%d", KeyIDMarker, r.IntN(ks.API)))
	switch r.IntN(3) {
	case 0:
		return []gate.ConcurrencyKey{acct(), api}
	case 1:
		a, b := acct(), acct()
		if a.String() == b.String() {
			return []gate.ConcurrencyKey{a}
		}
		return []gate.ConcurrencyKey{b, a} // in either order: the store puts them in one
	default:
		return []gate.ConcurrencyKey{api, gate.Gate("bulk", fmt.Sprintf("%s%d", KeyIDMarker, r.IntN(ks.Bulk)))}
	}
}

// NewInstance returns the insert request of a new parent instance.
func (ks KeySpace) NewInstance(r *mrand.Rand) durable.InsertRequest {
	return durable.InsertRequest{Workflow: ParentWorkflow, State: State{Max: 2 + r.IntN(6)},
		Options: durable.InsertOptions{Keys: ks.randomKeys(r), Priority: r.IntN(3)}}
}

// keyEdit draws a change of the keys a step holds (held, in any order) for
// its next step: replace them all (SwitchKey), or, as often, add a key the
// step does not hold, drop one of several, or replace one with another.
func (ks KeySpace) keyEdit(r *mrand.Rand, held []string) transitions.Option {
	next := ks.randomKey(r)
	holds := func(k gate.ConcurrencyKey) bool { return slices.Contains(held, k.String()) }
	if r.IntN(2) == 0 || next.IsZero() || len(held) == 0 {
		return transitions.SwitchKey(next)
	}
	pick, err := gate.Parse(held[r.IntN(len(held))])
	if err != nil {
		return transitions.SwitchKey(next)
	}
	switch {
	case len(held) > 1 && r.IntN(2) == 0:
		return transitions.DropKey(pick)
	case !holds(next) && len(held) < 3 && r.IntN(2) == 0:
		return transitions.AddKey(next)
	case !holds(next):
		return transitions.ReplaceKey(pick, next)
	default:
		return transitions.SwitchKey(next)
	}
}

// Recorder is what the step bodies report to.
type Recorder interface {
	// Start records a body starting: its token, instance, keys (joined by
	// ","; "" for none), attempt, step, the token of the last committed run
	// it continues (prev, "" for none) and its position in the chain.
	Start(token, instance, keys string, attempt int, step, prev string, index int)
	// End records the body finishing with label (the transition kind,
	// "error" or "panic").
	End(token, label string)
	// Bad records something a body found wrong (a state that skipped a run,
	// a child that did not finish).
	Bad(token, msg string)
}

// Workflows returns the parent and child workflow definitions, reporting
// every run to rec.
func Workflows(rec Recorder, ks KeySpace) (parent, child durable.Definition) {
	retry := steps.RetryPolicy{MaxAttempts: 1000, InitialInterval: 2 * time.Millisecond, MaxInterval: 20 * time.Millisecond}
	p := durable.NewWorkflow[State](ParentWorkflow, "work", durable.WorkflowOptions{Retry: retry})
	c := durable.NewWorkflow[State](ChildWorkflow, "work", durable.WorkflowOptions{Retry: retry})
	work := func(ctx steps.Context, s State) (transitions.Transition, error) {
		return body(ctx, s, rec, ks, false)
	}
	joined := func(ctx steps.Context, s State) (transitions.Transition, error) {
		return body(ctx, s, rec, ks, true)
	}
	p.Step("work", work).Step("joined", joined)
	c.Step("work", work)
	return p, c
}

// ErrRandom is the error a run returns on purpose.
var ErrRandom = errors.New("chaos: random failure")

func newToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// body is the body of every step.
func body(ctx steps.Context, s State, rec Recorder, ks KeySpace, joined bool) (t transitions.Transition, err error) {
	token := newToken()
	prev := ""
	if n := len(s.Chain); n > 0 {
		prev = s.Chain[n-1]
	}
	rec.Start(token, ctx.InstanceID(), strings.Join(ctx.Keys(), ","), ctx.Attempt(), ctx.Step(), prev, len(s.Chain))
	label := "panic"
	defer func() { rec.End(token, label) }()
	if s.Steps != len(s.Chain) {
		rec.Bad(token, fmt.Sprintf("state says %d steps but its chain holds %d", s.Steps, len(s.Chain)))
	}
	var seed [2]uint64
	for i := range 8 {
		seed[0] = seed[0]<<8 | uint64(token[i])
		seed[1] = seed[1]<<8 | uint64(token[8+i])
	}
	r := mrand.New(mrand.NewPCG(seed[0], seed[1]))
	if joined {
		kids, err := ctx.Children()
		if err != nil {
			label = "error"
			return transitions.Transition{}, fmt.Errorf("read children (token=%s): %w", token, err)
		}
		if len(kids) != s.Kids {
			rec.Bad(token, fmt.Sprintf("spawned %d children, found %d", s.Kids, len(kids)))
		}
		for _, k := range kids {
			var cs State
			if k.Status != "done" || k.Decode(&cs) != nil || cs.Steps != cs.Max || len(cs.Chain) != cs.Max {
				rec.Bad(token, fmt.Sprintf("child %s is %s with result %s", k.ID, k.Status, k.Result))
			}
		}
	}
	pause := time.Duration(2+r.IntN(20)) * time.Millisecond
	if r.IntN(20) == 0 {
		pause = time.Duration(200+r.IntN(400)) * time.Millisecond // a slow step, for kills to land in
	}
	select {
	case <-time.After(pause):
	case <-ctx.Done():
	}
	next := s
	next.Chain = append(append([]string(nil), s.Chain...), token)
	next.Steps = len(next.Chain)
	if next.Steps >= s.Max {
		label = "done"
		return transitions.Done(next), nil
	}
	switch p := r.IntN(100); {
	case p < 22:
		label = "next"
		return transitions.Next("work", next), nil
	case p < 30:
		label = "next"
		return transitions.Next("work", next, transitions.ReleaseKey()), nil
	case p < 42:
		label = "next"
		return transitions.Next("work", next, ks.keyEdit(r, ctx.Keys())), nil
	case p < 54:
		label = "await"
		return transitions.Await(SignalName, "work", next, transitions.Timeout(time.Duration(30+r.IntN(300))*time.Millisecond)), nil
	case p < 62:
		label = "sleep"
		return transitions.Sleep(time.Duration(5+r.IntN(100))*time.Millisecond, "work", next), nil
	case p < 69 && !s.Child && s.Kids == 0:
		n := 1 + r.IntN(3)
		kids := make([]transitions.Child, n)
		for i := range kids {
			kids[i] = transitions.Child{Workflow: ChildWorkflow, State: State{Max: 1 + r.IntN(3), Child: true}, Keys: ks.randomKeys(r)}
		}
		next.Kids = n
		label = "spawn"
		return transitions.Spawn(kids, "joined", next), nil
	case p < 77:
		label = "retry"
		return transitions.Retry(next, time.Duration(1+r.IntN(10))*time.Millisecond), nil
	case p < 93:
		label = "error"
		return transitions.Transition{}, fmt.Errorf("%w (token=%s)", ErrRandom, token)
	default:
		panic(fmt.Sprintf("chaos: random panic (token=%s)", token))
	}
}
