package main

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

// fakeStripe answers from a script: the i-th call returns errs[i] (nil when
// the script is shorter). durabletest runs steps one at a time, so it needs
// no lock.
type fakeStripe struct {
	errs  []error
	calls int
	keys  []string
}

func (f *fakeStripe) CreateCharge(_ context.Context, idem, _ string, _ int64, _ string) (string, error) {
	f.calls++
	f.keys = append(f.keys, idem)
	if f.calls <= len(f.errs) && f.errs[f.calls-1] != nil {
		return "", f.errs[f.calls-1]
	}
	return "ch_" + strconv.Itoa(f.calls), nil
}

// noJitter is ChargeRetry without randomization, so delays are exact.
func noJitter(attempts int) *steps.RetryPolicy {
	p := ChargeRetry()
	p.MaxAttempts, p.RandomizationFactor = attempts, -1
	return &p
}

func newEnv(t *testing.T, stripe *fakeStripe, opts durabletest.Options) (*durabletest.Env, *Service) {
	t.Helper()
	svc := &Service{Stripe: stripe, Retry: noJitter(5)}
	if opts.Limits == nil {
		opts.Limits = []gate.Limit{StripeLimit}
	}
	return durabletest.New(t, opts, svc.Workflow()), svc
}

func charge(order string) Charge {
	return Charge{Order: order, StripeAccount: "acct_1", AmountCents: 1200, Currency: "EUR"}
}

func insert(env *durabletest.Env, order string) string {
	return env.Insert(WorkflowName, charge(order), durable.InsertOptions{Key: OrderKey(order)})
}

func TestStripeGateCapsAtFive(t *testing.T) {
	env, _ := newEnv(t, &fakeStripe{}, durabletest.Options{Strict: true, Queues: map[string]int{durable.DefaultQueue: 20}})
	var ids []string
	for i := 0; i < 20; i++ {
		ids = append(ids, insert(env, strconv.Itoa(i)))
	}
	ctx := context.Background()

	// Round 1: the 20 validations hold 20 different order keys at once.
	rep, err := env.Engine.Tick(ctx)
	require.NoError(t, err)
	require.Equal(t, 20, len(rep.Claimed))
	info := env.Key("stripe:acct_1")
	assert.Equal(t, 5, info.K)
	assert.Equal(t, 2, info.Shards)
	assert.Equal(t, 20, info.Waiting, "every charge now waits for the Stripe gate")

	// Round 2: 20 executors are free, but the gate admits 5.
	rep, err = env.Engine.Tick(ctx)
	require.NoError(t, err)
	assert.Equal(t, 5, len(rep.Claimed), "claimed in round 2")
	for _, c := range rep.Claimed {
		assert.Equal(t, "stripe:acct_1", c.Key)
		assert.Equal(t, "charge", c.Step)
	}

	env.RunUntilIdle()
	assert.Equal(t, 5, env.MaxConcurrency("stripe:acct_1"), "with 15 charges left, the gate runs full: %s", env)
	for _, id := range ids {
		assert.Equal(t, 1, durabletest.Result[Receipt](env, id).Attempts)
	}
	assert.Empty(t, env.Engine.Warnings(), "order is an identity without limit, stripe a gate with one")
}

func TestStripeGateIsPerAccount(t *testing.T) {
	env, _ := newEnv(t, &fakeStripe{}, durabletest.Options{Queues: map[string]int{durable.DefaultQueue: 20}})
	for i := 0; i < 8; i++ {
		c := charge(strconv.Itoa(i))
		c.StripeAccount = "acct_" + strconv.Itoa(i%2)
		env.Insert(WorkflowName, c, durable.InsertOptions{Key: OrderKey(c.Order)})
	}
	env.RunUntilIdle()
	assert.Equal(t, 4, env.MaxConcurrency("stripe:acct_0"), "4 charges, room for 5: all at once")
	assert.Equal(t, 4, env.MaxConcurrency("stripe:acct_1"), "another account has its own 5 slots")
}

func TestRateLimitIsRetriedWithBackoff(t *testing.T) {
	stripe := &fakeStripe{errs: []error{ErrRateLimited, ErrRateLimited}}
	env, _ := newEnv(t, stripe, durabletest.Options{})
	id := insert(env, "42")
	in := env.RunUntilDone(id)
	require.Equal(t, store.StatusDone, in.Status)

	receipt := durabletest.Result[Receipt](env, id)
	assert.Equal(t, 3, receipt.Attempts)
	assert.Equal(t, "ch_3", receipt.ChargeID)
	assert.Equal(t, 3, stripe.calls)
	assert.Equal(t, stripe.keys[0], stripe.keys[2], "every attempt sends the same idempotency key")

	h := env.History(id)
	require.Len(t, h, 4)
	assert.Equal(t, "validate", h[0].Step)
	assert.Equal(t, "order:42", h[0].Key)
	var outcomes []string
	for i, e := range h[1:] {
		assert.Equal(t, "charge", e.Step)
		assert.Equal(t, i, e.Attempt, "each retry increases the attempt")
		assert.Equal(t, "stripe:acct_1", e.Key, "a retry stays under the gate key")
		outcomes = append(outcomes, e.Outcome)
	}
	assert.Equal(t, []string{"error", "error", "done"}, outcomes)
	assert.Contains(t, h[1].Error, "429")
	// Backoff without jitter: 10ms after the first 429, 20ms after the second.
	assert.Equal(t, 10*time.Millisecond, h[2].StartedAt.Sub(h[1].StartedAt))
	assert.Equal(t, 20*time.Millisecond, h[3].StartedAt.Sub(h[2].StartedAt))
}

func TestRateLimitRetriesGiveUp(t *testing.T) {
	stripe := &fakeStripe{errs: []error{ErrRateLimited, ErrRateLimited, ErrRateLimited, ErrRateLimited, ErrRateLimited}}
	env, _ := newEnv(t, stripe, durabletest.Options{})
	id := insert(env, "7")
	in := env.RunUntilDone(id)
	assert.Equal(t, store.StatusFailed, in.Status)
	assert.Equal(t, 5, stripe.calls, "MaxAttempts 5 means five calls in all")
	assert.Contains(t, in.LastError, "429")
}

func TestDeclineStopsWithoutRetry(t *testing.T) {
	stripe := &fakeStripe{errs: []error{ErrCardDeclined}}
	env, svc := newEnv(t, stripe, durabletest.Options{})
	tr, err := durabletest.RunStep(env, svc.Workflow(), "charge", charge("9"), durabletest.StepOptions{Key: "stripe:acct_1"})
	require.NoError(t, err)
	assert.Equal(t, transitions.KindStop, tr.Kind)
	assert.Contains(t, tr.Reason, "declined")
}

func TestValidateSwitchesToTheStripeGate(t *testing.T) {
	env, svc := newEnv(t, &fakeStripe{}, durabletest.Options{})
	c := charge("5")
	c.Currency = "EUR"
	tr, err := durabletest.RunStep(env, svc.Workflow(), "validate", c, durabletest.StepOptions{Key: "order:5"})
	require.NoError(t, err)
	assert.Equal(t, transitions.KindNext, tr.Kind)
	assert.Equal(t, "charge", tr.Step)
	require.NotNil(t, tr.KeyChange)
	assert.Equal(t, "stripe:acct_1", tr.KeyChange.Key.String())
	assert.Equal(t, gate.GateIntent, tr.KeyChange.Key.Intent())
	assert.Equal(t, "eur", tr.State.(Charge).Currency)

	c.AmountCents = 0
	tr, err = durabletest.RunStep(env, svc.Workflow(), "validate", c, durabletest.StepOptions{Key: "order:5"})
	require.NoError(t, err)
	assert.Equal(t, transitions.KindStop, tr.Kind)
	assert.Contains(t, tr.Reason, "not positive")
}

func TestInvalidChargeNeverCallsStripe(t *testing.T) {
	stripe := &fakeStripe{}
	env, _ := newEnv(t, stripe, durabletest.Options{})
	c := charge("3")
	c.Currency = "euro"
	id := env.Insert(WorkflowName, c, durable.InsertOptions{Key: OrderKey("3")})
	in := env.RunUntilDone(id)
	assert.Equal(t, store.StatusFailed, in.Status)
	assert.Contains(t, in.LastError, "ISO 4217")
	assert.Zero(t, stripe.calls)
	assert.Equal(t, []string{"validate"}, env.StepNames(id))
}

// Without the stripe limit, the gate key silently runs at K = 1: the engine
// says so.
func TestGateWithoutLimitIsReported(t *testing.T) {
	env, _ := newEnv(t, &fakeStripe{}, durabletest.Options{Limits: []gate.Limit{}, Queues: map[string]int{durable.DefaultQueue: 10}})
	for i := 0; i < 4; i++ {
		insert(env, strconv.Itoa(i))
	}
	env.RunUntilIdle()
	assert.Equal(t, 1, env.MaxConcurrency("stripe:acct_1"), "no limit: K = 1")
	w := env.Engine.Warnings()
	require.Len(t, w, 1)
	assert.Equal(t, gate.GateWithoutLimit, w[0].Kind)
	assert.Equal(t, "stripe", w[0].Name)
}

// TestDemoRun runs the program path: a started engine, parallel executors,
// random 429s, and the in-process recorder.
func TestDemoRun(t *testing.T) {
	st := memory.New(memory.Options{})
	t.Cleanup(func() { _ = st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Run(ctx, Options{Store: st, Orders: 25, Executors: 10, FailRate: 0.3,
		MinLatency: 5 * time.Millisecond, MaxLatency: 15 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)

	assert.Equal(t, 25, rep.Done)
	assert.Zero(t, rep.Failed)
	assert.Equal(t, 25, rep.OrderKeys)
	assert.Equal(t, 1, rep.OrderMax)
	assert.LessOrEqual(t, rep.StripeMax, 5, "the gate never admits more than K")
	assert.LessOrEqual(t, rep.ServerMax, 5, "Stripe never sees more than K")
	assert.Greater(t, rep.StripeMax, 1, "charges do run in parallel under the gate")
	attempts := 0
	for a, n := range rep.Attempts {
		attempts += a * n
	}
	assert.Equal(t, rep.Calls, attempts, "every call is one attempt of some charge")
	assert.Equal(t, rep.Calls-25, rep.RateLimited, "every 429 was retried")
	assert.Equal(t, 25+rep.Calls, rep.Steps, "one validate per order, one charge step per call")
	assert.Zero(t, rep.Violations())
}
