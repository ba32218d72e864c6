// Package enginetest holds engine-level tests that every backend runs: many
// engines sharing one store, random step outcomes, and a recorder outside the
// store that proves no key ever exceeded its K.
package enginetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

// Recorder counts, per key, the steps running at once, from outside the
// store: a step body calls Enter with the key it was admitted under and Exit
// when it returns. It records the highest count seen and every violation.
type Recorder struct {
	mu         sync.Mutex
	limits     gate.Limits
	cur        map[string]int
	max        map[string]int
	violations []string
	steps      int
}

// NewRecorder returns a recorder checking against limits.
func NewRecorder(limits gate.Limits) *Recorder {
	return &Recorder{limits: limits, cur: map[string]int{}, max: map[string]int{}}
}

// enter records a step starting under key ("" is ignored).
func (r *Recorder) enter(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.steps++
	if key == "" {
		return
	}
	r.cur[key]++
	if r.cur[key] > r.max[key] {
		r.max[key] = r.cur[key]
	}
	if k := r.limits.K(key); r.cur[key] > k {
		r.violations = append(r.violations, fmt.Sprintf("%s ran %d at once, K = %d", key, r.cur[key], k))
	}
}

// Exit records a step under key ending.
func (r *Recorder) Exit(key string) {
	if key == "" {
		return
	}
	r.mu.Lock()
	r.cur[key]--
	r.mu.Unlock()
}

// Running is how many steps of key run now.
func (r *Recorder) Running(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur[key]
}

// Violations returns every time a key exceeded its K.
func (r *Recorder) Violations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.violations...)
}

// Max returns the highest concurrency seen per key.
func (r *Recorder) Max() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.max))
	for k, v := range r.max {
		out[k] = v
	}
	return out
}

// StressState is the state of a stress instance.
type StressState struct {
	Seed  uint64 `json:"seed"`
	Steps int    `json:"steps"`
	Max   int    `json:"max"`
}

// StressOptions sizes a stress run.
type StressOptions struct {
	Engines   int
	Instances int
	// AcctKeys is the number of K=1 keys ("acct:i"); ApiKeys the number of
	// gate keys ("api:i", limit 3, 2 shards).
	AcctKeys, APIKeys int
	Executors         int
	Timeout           time.Duration
}

// StressLimits are the limits a stress run uses: "api" keys are gates of 3
// in 2 shards, the single "bulk:0" key a gate of 8 in 4 shards; "acct" keys
// have no limit (K = 1).
var StressLimits = []gate.Limit{{Name: "api", Limit: 3, Shards: 2}, {Name: "bulk", Limit: 8, Shards: 4}}

// StepRecorder observes step bodies: Enter is called with the key the step
// was admitted under when the body starts, and the returned func when it ends.
type StepRecorder interface {
	Enter(key string) (exit func())
}

// Enter implements StepRecorder.
func (r *Recorder) Enter(key string) func() {
	r.enter(key)
	return func() { r.Exit(key) }
}

// StressKey picks a random key: a K = 1 "acct" key, an "api" gate key, the
// "bulk:0" gate key, or none.
func StressKey(r *rand.Rand, o StressOptions) gate.ConcurrencyKey {
	switch r.IntN(4) {
	case 0:
		return gate.Identity("acct", fmt.Sprint(r.IntN(o.AcctKeys)))
	case 1:
		return gate.Gate("api", fmt.Sprint(r.IntN(o.APIKeys)))
	case 2:
		return gate.Gate("bulk", "0")
	default:
		return gate.ConcurrencyKey{}
	}
}

// StressWorkflow is the random workflow of a stress run: each step sleeps a
// random while under its key, then goes on with the same key, releases it,
// switches it, awaits a signal (with a timeout), sleeps, retries, fails or
// panics, until it has run its Max steps. The choices are seeded by the
// state, so a re-run step makes the same choice.
func StressWorkflow(rec StepRecorder, o StressOptions) *durable.Workflow[StressState] {
	wf := durable.NewWorkflow[StressState]("stress", "work", durable.WorkflowOptions{
		Retry: steps.RetryPolicy{MaxAttempts: 1000, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, RandomizationFactor: -1},
	})
	wf.Step("work", func(ctx steps.Context, s StressState) (transitions.Transition, error) {
		defer rec.Enter(ctx.Key())()
		r := rand.New(rand.NewPCG(s.Seed, uint64(s.Steps)*7919+uint64(ctx.Attempt())))
		time.Sleep(time.Duration(r.IntN(1500)) * time.Microsecond)
		s.Steps++
		if s.Steps >= s.Max {
			return transitions.Done(s.Steps), nil
		}
		switch p := r.IntN(100); {
		case p < 30:
			return transitions.Next("work", s), nil
		case p < 40:
			return transitions.Next("work", s, transitions.ReleaseKey()), nil
		case p < 55:
			return transitions.Next("work", s, transitions.SwitchKey(StressKey(r, o))), nil
		case p < 70:
			return transitions.Await("go", "work", s, transitions.Timeout(time.Duration(20+r.IntN(30))*time.Millisecond)), nil
		case p < 78:
			return transitions.Sleep(time.Duration(r.IntN(5))*time.Millisecond, "work", s), nil
		case p < 86:
			return transitions.Retry(s, time.Millisecond), nil
		case p < 94:
			return transitions.Transition{}, errors.New("random failure")
		default:
			panic("random panic")
		}
	})
	return wf
}

// StressRequests returns n random instances of the stress workflow.
func StressRequests(n int, o StressOptions) []durable.InsertRequest {
	r := rand.New(rand.NewPCG(1, 2))
	reqs := make([]durable.InsertRequest, n)
	for i := range reqs {
		reqs[i] = durable.InsertRequest{Workflow: "stress", State: StressState{Seed: r.Uint64(), Max: 1 + r.IntN(6)},
			Options: durable.InsertOptions{Key: StressKey(r, o), Priority: r.IntN(3)}}
	}
	return reqs
}

// Signaller sends "go" signals to random instances through random engines
// until ctx is done, racing their parks.
func Signaller(ctx context.Context, engines []*durable.Engine, ids []string) {
	r := rand.New(rand.NewPCG(3, 4))
	for ctx.Err() == nil {
		id := ids[r.IntN(len(ids))]
		_ = engines[r.IntN(len(engines))].Signal(ctx, id, "go", map[string]int{"n": 1}, durable.SignalOptions{})
		time.Sleep(200 * time.Microsecond)
	}
}

// Stress runs o.Engines engines on stores from newStore (all sharing one
// database) over random workflows and asserts the recorder saw no key over
// its K, every instance is terminal, and every key is free with full
// counters at the end.
func Stress(t *testing.T, newStore func() store.Store, o StressOptions) {
	limits, err := gate.NewLimits(StressLimits)
	require.NoError(t, err)
	rec := NewRecorder(limits)
	wf := StressWorkflow(rec, o)
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	var engines []*durable.Engine
	for i := 0; i < o.Engines; i++ {
		e, err := durable.New(durable.Config{Store: newStore(), Limits: StressLimits, Queues: map[string]int{"default": o.Executors},
			Logger: log, PollInterval: 20 * time.Millisecond, ReaperInterval: 50 * time.Millisecond, ReconcileInterval: time.Hour})
		require.NoError(t, err)
		require.NoError(t, e.Register(wf))
		engines = append(engines, e)
	}
	ids, err := engines[0].InsertMany(ctx, StressRequests(o.Instances, o))
	require.NoError(t, err)
	for _, e := range engines {
		require.NoError(t, e.Start(ctx))
	}
	sigDone := make(chan struct{})
	go func() {
		defer close(sigDone)
		Signaller(ctx, engines, ids)
	}()
	for _, id := range ids {
		in, err := engines[0].Wait(ctx, id)
		require.NoError(t, err, "instance %s did not finish: %+v", id, in)
		require.Equal(t, store.StatusDone, in.Status, "instance %s: %s", id, in.LastError)
	}
	cancel()
	<-sigDone
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer stopCancel()
	for _, e := range engines {
		require.NoError(t, e.Stop(stopCtx))
	}
	require.Empty(t, rec.Violations())
	st := engines[0].Store()
	for i := 0; i < o.AcctKeys; i++ {
		info, err := st.KeyInfo(stopCtx, fmt.Sprintf("acct:%d", i))
		require.NoError(t, err)
		require.Empty(t, info.Holders)
		require.Zero(t, info.Waiting)
	}
	CheckKeysFree(t, st, o)
	max := rec.Max()
	t.Logf("steps %d, max per key: api:0=%d bulk:0=%d acct:0=%d", rec.steps, max["api:0"], max["bulk:0"], max["acct:0"])
}

// CheckKeysFree asserts that no stress key has a holder or a waiter and
// that every gate key's counters are back to full.
func CheckKeysFree(t *testing.T, st store.Store, o StressOptions) {
	ctx := context.Background()
	check := func(key string, k int) {
		info, err := st.KeyInfo(ctx, key)
		require.NoError(t, err)
		require.Empty(t, info.Holders, key)
		require.Zero(t, info.Waiting, key)
		if info.Shards > 0 {
			require.Equal(t, k, info.Available, "%s counters must be back to full", key)
		}
	}
	for i := 0; i < o.AcctKeys; i++ {
		check(fmt.Sprintf("acct:%d", i), 1)
	}
	for i := 0; i < o.APIKeys; i++ {
		check(fmt.Sprintf("api:%d", i), 3)
	}
	check("bulk:0", 8)
}
