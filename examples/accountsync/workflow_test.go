package main

import (
	"context"
	"errors"
	"log/slog"
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

// fakeLedger records submissions; the test plays the webhook itself.
type fakeLedger struct {
	submitted []string
	failNext  int
}

func (f *fakeLedger) Submit(_ context.Context, id, _ string, _ int) error {
	if f.failNext > 0 {
		f.failNext--
		return errors.New("ledger unavailable")
	}
	f.submitted = append(f.submitted, id)
	return nil
}

const confirmTimeout = 10 * time.Minute

func newEnv(t *testing.T, opts durabletest.Options) (*durabletest.Env, *fakeLedger, *Service) {
	t.Helper()
	ledger := &fakeLedger{}
	svc := &Service{Ledger: ledger, ConfirmTimeout: confirmTimeout}
	return durabletest.New(t, opts, svc.Workflow()), ledger, svc
}

func insertSync(env *durabletest.Env, account string, seq int) string {
	return env.Insert(WorkflowName, SyncState{Account: account, Seq: seq}, durable.InsertOptions{Key: AccountKey(account)})
}

func TestSyncsOfOneAccountNeverOverlap(t *testing.T) {
	env, ledger, _ := newEnv(t, durabletest.Options{Strict: true})
	var seven, nine []string
	for i := 1; i <= 3; i++ {
		seven = append(seven, insertSync(env, "7", i))
	}
	for i := 1; i <= 2; i++ {
		nine = append(nine, insertSync(env, "9", i))
	}
	require.Equal(t, 3, env.Key("account:7").Waiting, "three syncs compete for account:7")

	// One round: executors are plentiful, yet only one sync per account is
	// claimed; the two accounts run side by side.
	rep, err := env.Engine.Tick(context.Background())
	require.NoError(t, err)
	perKey := map[string]int{}
	for _, c := range rep.Claimed {
		perKey[c.Key]++
	}
	assert.Equal(t, map[string]int{"account:7": 1, "account:9": 1}, perKey)

	env.RunUntilIdle()
	assert.Equal(t, 1, env.MaxConcurrency("account:7"), env.String())
	assert.Equal(t, 1, env.MaxConcurrency("account:9"), env.String())

	// Every sync now waits for its webhook at the same time: the await gave
	// the account's slot back, or the second sync could not have started.
	for _, id := range append(append([]string{}, seven...), nine...) {
		in := env.Get(id)
		assert.Equal(t, store.StatusAwaiting, in.Status, id)
		assert.Equal(t, SignalConfirmed, in.AwaitSignal)
	}
	assert.Empty(t, env.Key("account:7").Holders, "parked syncs hold no slot")
	assert.Len(t, ledger.submitted, 5)

	for _, id := range ledger.submitted {
		env.Signal(id, SignalConfirmed, Confirmation{Ref: "L-" + id[:8]})
	}
	env.RunUntilIdle()
	for _, id := range seven {
		res := durabletest.Result[SyncResult](env, id)
		assert.Equal(t, "webhook", res.ConfirmedBy)
		assert.Equal(t, "L-"+id[:8], res.LedgerRef)
	}
	assert.Equal(t, 1, env.MaxConcurrency("account:7"), "settle steps re-admit through K = 1 too")
	assert.Empty(t, env.Engine.Warnings(), "identity keys with no limit raise no warning")
}

func TestWrapUpRunsWithoutTheKey(t *testing.T) {
	env, _, _ := newEnv(t, durabletest.Options{})
	id := insertSync(env, "7", 1)
	env.SignalAfter(time.Second, id, SignalConfirmed, Confirmation{Ref: "L-1"})
	in := env.RunUntilDone(id)
	require.Equal(t, store.StatusDone, in.Status)

	assert.Equal(t, []string{"fetch", "apply", "settle", "wrap_up"}, env.StepNames(id))
	for _, h := range env.History(id) {
		if h.Step == "wrap_up" {
			assert.Equal(t, "", h.Key, "wrap_up runs after ReleaseKey()")
		} else {
			assert.Equal(t, "account:7", h.Key, "%s runs under the account key", h.Step)
		}
	}
	assert.Equal(t, "", in.Key, "the released key stays released")
}

func TestWrapUpDoesNotBlockTheNextSync(t *testing.T) {
	env, ledger, _ := newEnv(t, durabletest.Options{})
	first := insertSync(env, "7", 1)
	env.RunUntilIdle() // first is parked on its webhook
	env.Signal(first, SignalConfirmed, Confirmation{Ref: "L-1"})
	second := insertSync(env, "7", 2)

	// Round 1: first's settle and second's fetch both want account:7; one wins.
	// Once first has released the key, its wrap_up shares a round with
	// second's account:7 steps.
	sawOverlap := false
	for i := 0; i < 10; i++ {
		rep, err := env.Engine.Tick(context.Background())
		require.NoError(t, err)
		ids := map[string]string{}
		for _, c := range rep.Claimed {
			ids[c.ID] = c.Step + "@" + c.Key
		}
		if ids[first] == "wrap_up@" && ids[second] != "" {
			sawOverlap = true
		}
		if len(rep.Claimed) == 0 {
			break
		}
	}
	assert.True(t, sawOverlap, "the keyless wrap_up ran in the same round as the next sync of the account")
	assert.Equal(t, store.StatusDone, env.Get(first).Status)
	assert.Equal(t, []string{first, second}, ledger.submitted)
}

func TestConfirmTimesOutWithoutWebhook(t *testing.T) {
	env, _, _ := newEnv(t, durabletest.Options{})
	id := insertSync(env, "3", 1)
	env.RunUntilIdle()
	require.Equal(t, store.StatusAwaiting, env.Get(id).Status)

	env.Advance(confirmTimeout - time.Second)
	require.Equal(t, store.StatusAwaiting, env.Get(id).Status, "no timeout before %s", confirmTimeout)

	env.Advance(time.Second)
	res := durabletest.Result[SyncResult](env, id)
	assert.Equal(t, "timeout", res.ConfirmedBy)
	assert.Empty(t, res.LedgerRef)

	// A webhook that turns up after the sync finished is refused clearly.
	err := env.Engine.Signal(context.Background(), id, SignalConfirmed, Confirmation{Ref: "late"}, durable.SignalOptions{})
	assert.ErrorIs(t, err, store.ErrTerminal)
}

func TestWebhookBeforeTheAwaitIsNotLost(t *testing.T) {
	env, _, _ := newEnv(t, durabletest.Options{})
	id := insertSync(env, "4", 1)
	// The ledger answers faster than the sync parks: the signal waits in
	// the instance's inbox.
	env.Signal(id, SignalConfirmed, Confirmation{Ref: "L-early"})
	env.RunUntilIdle() // no clock movement needed
	res := durabletest.Result[SyncResult](env, id)
	assert.Equal(t, "webhook", res.ConfirmedBy)
	assert.Equal(t, "L-early", res.LedgerRef)
}

func TestLedgerOutageIsRetried(t *testing.T) {
	env, ledger, _ := newEnv(t, durabletest.Options{})
	ledger.failNext = 2
	id := insertSync(env, "5", 1)
	env.SignalAfter(time.Minute, id, SignalConfirmed, Confirmation{Ref: "L-5"})
	env.RunUntilDone(id)
	var applies []string
	for _, h := range env.History(id) {
		if h.Step == "apply" {
			applies = append(applies, h.Outcome)
			assert.Equal(t, "account:5", h.Key, "a retry keeps the key")
		}
	}
	assert.Equal(t, []string{"error", "error", "await"}, applies)
	assert.Equal(t, "webhook", durabletest.Result[SyncResult](env, id).ConfirmedBy)
}

func TestSettleStep(t *testing.T) {
	env, _, svc := newEnv(t, durabletest.Options{})
	wf := svc.Workflow()
	s := SyncState{Account: "7", Seq: 1, Records: 12, Applied: 12}

	tr, err := durabletest.RunStep(env, wf, "settle", s, durabletest.StepOptions{Key: "account:7",
		Signal: &steps.Signal{Name: SignalConfirmed, Payload: []byte(`{"ref":"L-9"}`)}})
	require.NoError(t, err)
	assert.Equal(t, transitions.KindNext, tr.Kind)
	assert.Equal(t, "wrap_up", tr.Step)
	require.NotNil(t, tr.KeyChange, "settle changes the key")
	assert.True(t, tr.KeyChange.Key.IsZero(), "to none: ReleaseKey()")
	next := tr.State.(SyncState)
	assert.Equal(t, "L-9", next.LedgerRef)
	assert.Equal(t, "webhook", next.ConfirmedBy)

	tr, err = durabletest.RunStep(env, wf, "settle", s, durabletest.StepOptions{Key: "account:7", TimedOut: true})
	require.NoError(t, err)
	assert.Equal(t, "timeout", tr.State.(SyncState).ConfirmedBy)

	tr, err = durabletest.RunStep(env, wf, "settle", s, durabletest.StepOptions{
		Signal: &steps.Signal{Name: SignalConfirmed, Payload: []byte(`"not an object"`)}})
	require.NoError(t, err)
	assert.Equal(t, transitions.KindStop, tr.Kind, "a malformed webhook fails the sync instead of retrying forever")
}

func TestApplyStepAwaitsWithTimeout(t *testing.T) {
	env, ledger, svc := newEnv(t, durabletest.Options{})
	tr, err := durabletest.RunStep(env, svc.Workflow(), "apply", SyncState{Account: "2", Records: 7},
		durabletest.StepOptions{InstanceID: "11111111-1111-1111-1111-111111111111"})
	require.NoError(t, err)
	assert.Equal(t, transitions.KindAwait, tr.Kind)
	assert.Equal(t, SignalConfirmed, tr.Signal)
	assert.Equal(t, "settle", tr.Step)
	assert.Equal(t, confirmTimeout, tr.Timeout)
	assert.Nil(t, tr.KeyChange, "the await keeps the key for settle")
	assert.Equal(t, []string{"11111111-1111-1111-1111-111111111111"}, ledger.submitted)
}

// The prefix-capture hazard, shown: a limit named "account" silently turns
// the identity into a gate of 3, and strict mode refuses the insert.
func TestAccountLimitWouldBreakExclusion(t *testing.T) {
	capture := []gate.Limit{{Name: "account", Limit: 3}}

	env, _, _ := newEnv(t, durabletest.Options{Limits: capture})
	for i := 1; i <= 3; i++ {
		insertSync(env, "7", i)
	}
	env.RunUntilIdle()
	assert.Equal(t, 3, env.MaxConcurrency("account:7"), "captured: three syncs of one account overlapped")
	warnings := env.Engine.Warnings()
	require.Len(t, warnings, 1)
	assert.Equal(t, gate.IdentityCaptured, warnings[0].Kind)
	assert.Equal(t, "account", warnings[0].Name)

	strict, _, _ := newEnv(t, durabletest.Options{Limits: capture, Strict: true})
	_, err := strict.Engine.Insert(context.Background(), WorkflowName, SyncState{Account: "7"}, durable.InsertOptions{Key: AccountKey("7")})
	assert.ErrorIs(t, err, gate.ErrPrefixCapture)
}

// TestDemoRun runs the real program path: a started engine with executors
// in parallel, the simulated ledger, and the in-process recorder.
func TestDemoRun(t *testing.T) {
	st := memory.New(memory.Options{})
	t.Cleanup(func() { _ = st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Run(ctx, Options{Store: st, Syncs: 12, Accounts: 3, Executors: 8, Work: time.Millisecond,
		ConfirmTimeout: 150 * time.Millisecond, MaxWebhookDelay: 20 * time.Millisecond, DropRate: 0.25,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)

	assert.Equal(t, 12, rep.Done)
	assert.Zero(t, rep.Failed)
	assert.Equal(t, 12, rep.ByWebhook+rep.TimedOut)
	assert.Equal(t, 48, rep.Steps, "four steps per sync")
	assert.Equal(t, 12, rep.NoKeySteps, "one keyless wrap_up per sync")
	require.Len(t, rep.Keys, 3)
	for _, k := range rep.Keys {
		assert.Equal(t, 1, k.Max, "%s: measured concurrency", k.Key)
		assert.Equal(t, 4, k.Syncs, k.Key)
		assert.Equal(t, 12, k.Steps, "%s: fetch, apply and settle of 4 syncs", k.Key)
	}
	assert.Zero(t, rep.Violations())
}
