package enginepg

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/transitions"
)

// Every test here feeds PostgreSQL-backed engines bad input and checks two
// things: the caller gets a clear, typed error, and other work is not
// affected (nothing half-inserted, other instances finish).

type num struct {
	N int `json:"n"`
}

// countWorkflow counts to 3 and is done: the "other work" of every test.
func countWorkflow() *durable.Workflow[num] {
	wf := durable.NewWorkflow[num]("count", "inc", durable.WorkflowOptions{Retry: fastRetry(3)})
	wf.Step("inc", func(ctx steps.Context, s num) (transitions.Transition, error) {
		s.N++
		if s.N < 3 {
			return transitions.Next("inc", s), nil
		}
		return transitions.Done(s.N), nil
	})
	return wf
}

// othersFinish inserts a healthy instance and waits for its result.
func othersFinish(t *testing.T, ctx context.Context, e *durable.Engine) {
	t.Helper()
	id, err := e.Insert(ctx, "count", num{}, durable.InsertOptions{Key: gate.Identity("acct", "healthy")})
	require.NoError(t, err)
	n, err := durable.Result[int](ctx, e, id)
	require.NoError(t, err, "other work is unaffected")
	assert.Equal(t, 3, n)
}

func count(t *testing.T, st *postgres.Store) int {
	t.Helper()
	all, err := st.List(context.Background(), store.ListFilter{})
	require.NoError(t, err)
	return len(all)
}

func TestInvalidKeysAreRefused(t *testing.T) {
	st, _ := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	bad := map[string]string{
		"empty name":        ":x",
		"empty id":          "acct:",
		"no colon":          "acct",
		"NUL":               "acct:a\x00b",
		"newline":           "acct:a\nb",
		"DEL":               "acct:a\x7fb",
		"invalid UTF-8":     "acct:\xff\xfe",
		"over 255 bytes":    "acct:" + strings.Repeat("k", gate.MaxKeyLength),
		"control in name":   "ac\tct:1",
		"C1 control (U+85)": "acct:a\u0085b",
	}
	for what, key := range bad {
		t.Run(what, func(t *testing.T) {
			name, id, _ := strings.Cut(key, ":")
			_, err := gate.New(name, id, gate.IdentityIntent)
			require.ErrorIs(t, err, gate.ErrInvalidKey, "the typed constructor refuses it")

			good := store.NewInstance{ID: uuid.NewString(), Workflow: "count", Version: 1, Step: "inc", State: json.RawMessage(`{}`), Key: "acct:ok"}
			evil := store.NewInstance{ID: uuid.NewString(), Workflow: "count", Version: 1, Step: "inc", State: json.RawMessage(`{}`), Key: key}
			_, err = st.Insert(ctx, []store.NewInstance{good, evil})
			require.ErrorIs(t, err, gate.ErrInvalidKey, "the store refuses it too, for callers that bypass the engine")
			require.ErrorIs(t, err, store.ErrInvalid)
			assert.Zero(t, count(t, st), "the valid row of the batch was not inserted either")
		})
	}

	// The longest valid key is stored, indexed and run.
	long, err := gate.New("acct", strings.Repeat("k", gate.MaxKeyLength-5), gate.IdentityIntent)
	require.NoError(t, err)
	e := engine(t, durable.Config{Store: st}, countWorkflow())
	startEngine(t, e)
	id, err := e.Insert(ctx, "count", num{}, durable.InsertOptions{Key: long})
	require.NoError(t, err)
	n, err := durable.Result[int](ctx, e, id)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	othersFinish(t, ctx, e)
}

// A key switch to an invalid key cannot be built (transitions take a
// gate.ConcurrencyKey), but a store caller could send one: Complete refuses
// it with store.ErrInvalid and commits nothing of the batch.
func TestCompleteRefusesAnInvalidKeySwitch(t *testing.T) {
	st, _ := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	_, err := st.Insert(ctx, []store.NewInstance{{ID: uuid.NewString(), Workflow: "w", Queue: "q", Step: "s", State: json.RawMessage(`{}`)}})
	require.NoError(t, err)
	res, err := st.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	c := res.Claimed[0]
	_, err = st.Complete(ctx, "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeReady, Step: "s", SetKey: true, Key: "acct:\x00"}}, time.Time{})
	require.ErrorIs(t, err, store.ErrInvalid)
	require.ErrorIs(t, err, gate.ErrInvalidKey)
	in, err := st.Get(ctx, c.ID)
	require.NoError(t, err)
	assert.Equal(t, store.StatusExecuting, in.Status, "nothing of the refused batch committed")
}

func TestUnstorableStateIsRefusedAtInsert(t *testing.T) {
	st, _ := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	e := engine(t, durable.Config{Store: st}, countWorkflow())
	startEngine(t, e)
	bad := map[string]any{
		"NUL in a string":        map[string]string{"s": "a\x00b"},
		"NUL in a key":           map[string]int{"a\x00": 1},
		"unpaired surrogate":     json.RawMessage(`{"s":"\ud800"}`),
		"lone low surrogate":     json.RawMessage(`["\udc00x"]`),
		"overflowing number":     json.RawMessage(`{"n":1e131073}`),
		"amplifying number":      json.RawMessage(`[1e100000]`),
		"tiny number":            json.RawMessage(`[1E-5000]`),
		"a channel":              map[string]any{"c": make(chan int)},
		"a function":             func() {},
		"invalid raw JSON":       json.RawMessage(`{"n":`),
		"a NaN (not JSON)":       map[string]float64{"x": nan()},
		"cyclic-free but broken": brokenMarshaler{},
	}
	for what, state := range bad {
		t.Run(what, func(t *testing.T) {
			_, err := e.InsertMany(ctx, []durable.InsertRequest{
				{Workflow: "count", State: num{}},
				{Workflow: "count", State: state},
			})
			require.ErrorIs(t, err, durable.ErrEncode)
			assert.Zero(t, count(t, st), "nothing of the batch was inserted")
		})
	}
	// Escapes that are fine stay fine: a valid pair, an escaped backslash
	// before u0000, control characters other than NUL.
	for _, ok := range []string{`{"s":"\ud83d\ude00"}`, `{"s":"\\u0000"}`, `{"s":"\u0001\t"}`, `[1e308, -5e-324, 1E+300]`} {
		_, err := e.Insert(ctx, "count", json.RawMessage(ok), durable.InsertOptions{})
		require.NoError(t, err, "%s", ok)
	}

	// The store itself types what PostgreSQL refuses, for callers that bypass the engine.
	_, err := st.Insert(ctx, []store.NewInstance{{ID: uuid.NewString(), Workflow: "count", Version: 1, Step: "inc", State: json.RawMessage(`{"s":"\u0000"}`)}})
	require.ErrorIs(t, err, store.ErrInvalid)
	othersFinish(t, ctx, e)
}

type brokenMarshaler struct{}

func (brokenMarshaler) MarshalJSON() ([]byte, error) { return nil, errors.New("cannot marshal") }

func nan() float64 {
	var zero float64
	return zero / zero
}

func TestStateIsStoredAsAJSONObject(t *testing.T) {
	st, pool := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	e := engine(t, durable.Config{Store: st}, countWorkflow())
	id, err := e.Insert(ctx, "count", num{N: 1}, durable.InsertOptions{})
	require.NoError(t, err)
	var typ string
	require.NoError(t, pool.QueryRow(ctx, "SELECT jsonb_typeof(state) FROM instances WHERE id = $1", id).Scan(&typ))
	assert.Equal(t, "object", typ, "never a JSON string of JSON")
	// A raw message is stored as the value it is, not re-quoted.
	id, err = e.Insert(ctx, "count", json.RawMessage(`{"n":2}`), durable.InsertOptions{})
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, "SELECT jsonb_typeof(state) FROM instances WHERE id = $1", id).Scan(&typ))
	assert.Equal(t, "object", typ)
}

func TestOversizedPayloads(t *testing.T) {
	st, _ := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	big := strings.Repeat("x", 300)
	wf := durable.NewWorkflow[num]("grow", "grow", durable.WorkflowOptions{Retry: fastRetry(2)})
	wf.Step("grow", func(ctx steps.Context, s num) (transitions.Transition, error) {
		return transitions.Done(big), nil // a result over the limit
	})
	fat := durable.NewWorkflow[num]("fat", "fat", durable.WorkflowOptions{Retry: fastRetry(2)})
	fat.Step("fat", func(ctx steps.Context, s num) (transitions.Transition, error) {
		return transitions.Next("fat", map[string]string{"big": big}), nil // a state over the limit
	})
	e := engine(t, durable.Config{Store: st, MaxPayloadBytes: 256}, wf, fat, countWorkflow())
	startEngine(t, e)

	_, err := e.Insert(ctx, "count", map[string]string{"big": big}, durable.InsertOptions{})
	require.ErrorIs(t, err, durable.ErrPayloadTooLarge)
	assert.Zero(t, count(t, st))

	growID, err := e.Insert(ctx, "grow", num{}, durable.InsertOptions{})
	require.NoError(t, err)
	fatID, err := e.Insert(ctx, "fat", num{}, durable.InsertOptions{})
	require.NoError(t, err)
	err = e.Signal(ctx, growID, "go", map[string]string{"big": big}, durable.SignalOptions{})
	require.ErrorIs(t, err, durable.ErrPayloadTooLarge)

	for _, id := range []string{growID, fatID} {
		in, err := e.Wait(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, store.StatusFailed, in.Status)
		assert.Contains(t, in.LastError, "payload too large")
		assert.Equal(t, 1, in.Attempt, "retried by its policy (2 attempts), then failed")
	}
	othersFinish(t, ctx, e)
}

// Steps return text from anywhere: error messages, panic values and stop
// reasons with NUL bytes or invalid UTF-8, states that cannot be stored.
// Before the engine cleaned them, one such outcome made PostgreSQL refuse
// the whole flush batch, and the flusher retried it forever: every other
// instance of the engine stalled.
func TestStepsReturningUnstorableValuesFailAlone(t *testing.T) {
	st, _ := pgStore(t)
	ctx := waitCtx(t, 60*time.Second)
	wf := durable.NewWorkflow[num]("odd", "odd", durable.WorkflowOptions{Retry: fastRetry(2)})
	wf.Step("odd", func(ctx steps.Context, s num) (transitions.Transition, error) {
		switch s.N {
		case 1:
			return transitions.Transition{}, errors.New("bad\x00byte and \xff invalid UTF-8")
		case 2:
			panic("panic with \x00 inside")
		case 3:
			return transitions.Stop("reason\x00with NUL"), nil
		case 4:
			return transitions.Next("odd", map[string]string{"s": "\x00"}), nil
		case 5:
			return transitions.Await("sig\x00nal", "odd", s), nil
		default:
			return transitions.Transition{}, errors.New(strings.Repeat("long ", 10_000))
		}
	})
	e := engine(t, durable.Config{Store: st}, wf, countWorkflow())
	startEngine(t, e)
	var ids []string
	for n := 1; n <= 6; n++ {
		id, err := e.Insert(ctx, "odd", num{N: n}, durable.InsertOptions{Key: gate.Identity("acct", "odd")})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	othersFinish(t, ctx, e)
	want := []string{"bad\uFFFDbyte and \uFFFD invalid UTF-8", "panic: panic with \uFFFD inside", "reason\uFFFDwith NUL",
		"encode state", "invalid input: await signal name contains the control character U+0000", "…(truncated)"}
	for i, id := range ids {
		in, err := e.Wait(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, store.StatusFailed, in.Status, "instance %d", i+1)
		assert.Contains(t, in.LastError, want[i], "instance %d", i+1)
		assert.LessOrEqual(t, len(in.LastError), durable.MaxErrorLength+20)
		h, err := st.History(ctx, id)
		require.NoError(t, err)
		require.NotEmpty(t, h)
		assert.NotContains(t, h[len(h)-1].Error, "\x00")
	}
}

// refusingStore makes PostgreSQL refuse the outcomes of one instance, as if
// a value the engine did not foresee reached it.
type refusingStore struct {
	*postgres.Store
	victim string
}

func (s *refusingStore) Complete(ctx context.Context, worker string, outs []store.Outcome, now time.Time) ([]store.OutcomeResult, error) {
	return s.Store.Complete(ctx, worker, s.spoil(outs), now)
}

func (s *refusingStore) CompleteHandOff(ctx context.Context, worker string, outs []store.Outcome, now time.Time, h store.HandOff) ([]store.OutcomeResult, []store.Claimed, error) {
	return s.Store.CompleteHandOff(ctx, worker, s.spoil(outs), now, h)
}

func (s *refusingStore) spoil(outs []store.Outcome) []store.Outcome {
	outs = append([]store.Outcome(nil), outs...)
	for i, o := range outs {
		if o.ID == s.victim && o.Kind != store.OutcomeFailed {
			o.Error = "text PostgreSQL refuses: \x00"
			outs[i] = o
		}
	}
	return outs
}

func TestAnOutcomeTheStoreRefusesFailsOnlyItsInstance(t *testing.T) {
	st, _ := pgStore(t)
	ctx := waitCtx(t, 60*time.Second)
	victim := uuid.NewString()
	rs := &refusingStore{Store: st, victim: victim}
	var logs logBuffer
	started := make(chan struct{})
	var once sync.Once
	gateWF := durable.NewWorkflow[num]("slowcount", "inc", durable.WorkflowOptions{})
	gateWF.Step("inc", func(ctx steps.Context, s num) (transitions.Transition, error) {
		once.Do(func() { close(started) })
		time.Sleep(20 * time.Millisecond) // outcomes pile up into shared flush batches
		return transitions.Done(s.N), nil
	})
	e := engine(t, durable.Config{Store: rs, Logger: logs.logger(0), Queues: map[string]int{"default": 8}}, gateWF, countWorkflow())
	var reqs []durable.InsertRequest
	for i := range 20 {
		o := durable.InsertOptions{}
		if i == 7 {
			o.ID = victim
		}
		reqs = append(reqs, durable.InsertRequest{Workflow: "slowcount", State: num{N: i}, Options: o})
	}
	ids, err := e.InsertMany(ctx, reqs)
	require.NoError(t, err)
	startEngine(t, e)
	<-started
	for i, id := range ids {
		in, err := e.Wait(ctx, id)
		require.NoError(t, err)
		if id == victim {
			assert.Equal(t, store.StatusFailed, in.Status)
			assert.Contains(t, in.LastError, "the store refused this step's outcome")
			assert.Contains(t, in.LastError, "invalid request")
			continue
		}
		assert.Equal(t, store.StatusDone, in.Status, "instance %d is not held back by the refused one", i)
	}
	assert.Equal(t, 1, logs.Count("outcome refused by the store"))
	assert.Zero(t, logs.Count("store unavailable"), "a refusal is not an outage")
	othersFinish(t, ctx, e)
}

func TestStateThatDoesNotDecodeFailsOnlyItsInstance(t *testing.T) {
	st, _ := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	e := engine(t, durable.Config{Store: st}, countWorkflow())
	startEngine(t, e)
	wrongType, err := e.Insert(ctx, "count", map[string]string{"n": "three"}, durable.InsertOptions{})
	require.NoError(t, err)
	// A state written by someone else as a JSON string of JSON.
	quoted := uuid.NewString()
	_, err = st.Insert(ctx, []store.NewInstance{{ID: quoted, Workflow: "count", Version: 1, Step: "inc", State: json.RawMessage(`"{\"n\":1}"`)}})
	require.NoError(t, err)
	for _, id := range []string{wrongType, quoted} {
		in, err := e.Wait(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, store.StatusFailed, in.Status)
		assert.Contains(t, in.LastError, "decode state")
		assert.Zero(t, in.Attempt, "not retried: it cannot decode next time either")
	}
	othersFinish(t, ctx, e)
}

func TestSignalBadInput(t *testing.T) {
	st, pool := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	wait := durable.NewWorkflow[num]("wait", "park", durable.WorkflowOptions{})
	wait.Step("park", func(ctx steps.Context, s num) (transitions.Transition, error) {
		return transitions.Await("go", "woke", s), nil
	})
	wait.Step("woke", func(ctx steps.Context, s num) (transitions.Transition, error) {
		sig, _ := ctx.Signal()
		var p num
		if err := sig.Decode(&p); err != nil {
			return transitions.Transition{}, err
		}
		return transitions.Done(p.N), nil
	})
	e := engine(t, durable.Config{Store: st}, wait, countWorkflow())
	startEngine(t, e)
	waiting, err := e.Insert(ctx, "wait", num{}, durable.InsertOptions{})
	require.NoError(t, err)
	done, err := e.Insert(ctx, "count", num{}, durable.InsertOptions{})
	require.NoError(t, err)
	_, err = e.Wait(ctx, done)
	require.NoError(t, err)

	assert.ErrorIs(t, e.Signal(ctx, uuid.NewString(), "go", nil, durable.SignalOptions{}), store.ErrNotFound, "missing instance")
	assert.ErrorIs(t, e.Signal(ctx, "not-a-uuid", "go", nil, durable.SignalOptions{}), store.ErrNotFound, "malformed id")
	assert.ErrorIs(t, e.Signal(ctx, done, "go", nil, durable.SignalOptions{}), store.ErrTerminal, "terminal instance")
	assert.ErrorIs(t, e.Signal(ctx, waiting, "", nil, durable.SignalOptions{}), durable.ErrInvalidInput, "empty name")
	assert.ErrorIs(t, e.Signal(ctx, waiting, "g\x00o", nil, durable.SignalOptions{}), durable.ErrInvalidInput, "NUL in the name")
	assert.ErrorIs(t, e.Signal(ctx, waiting, strings.Repeat("g", durable.MaxNameLength+1), nil, durable.SignalOptions{}), durable.ErrInvalidInput)
	assert.ErrorIs(t, e.Signal(ctx, waiting, "go", nil, durable.SignalOptions{DedupKey: strings.Repeat("d", durable.MaxUniqueKeyLength+1)}), durable.ErrInvalidInput)
	assert.ErrorIs(t, e.Signal(ctx, waiting, "go", map[string]string{"s": "\x00"}, durable.SignalOptions{}), durable.ErrEncode)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM signals").Scan(&n))
	assert.Zero(t, n, "no refused signal was stored")

	// The longest dedup key is stored (and indexed).
	require.NoError(t, e.Signal(ctx, waiting, "go", num{N: 9}, durable.SignalOptions{DedupKey: strings.Repeat("d", durable.MaxUniqueKeyLength)}))
	got, err := durable.Result[int](ctx, e, waiting)
	require.NoError(t, err, "the waiting instance still gets its signal")
	assert.Equal(t, 9, got)
}

func TestNamesAndUniqueKeys(t *testing.T) {
	st, _ := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	_, err := durable.New(durable.Config{Store: st, Queues: map[string]int{"q\x00": 1}})
	assert.ErrorIs(t, err, durable.ErrInvalidInput, "queue name")
	_, err = durable.New(durable.Config{Store: st, WorkerID: "w\n1"})
	assert.ErrorIs(t, err, durable.ErrInvalidInput, "worker id")
	e := engine(t, durable.Config{Store: st}, countWorkflow())
	bad := durable.NewWorkflow[num]("bad\x00name", "s", durable.WorkflowOptions{})
	bad.Step("s", func(ctx steps.Context, s num) (transitions.Transition, error) { return transitions.Done(1), nil })
	assert.ErrorIs(t, e.Register(bad), durable.ErrInvalidInput, "workflow name")
	badStep := durable.NewWorkflow[num]("fine", "s", durable.WorkflowOptions{})
	badStep.Step("s", func(ctx steps.Context, s num) (transitions.Transition, error) { return transitions.Done(1), nil })
	badStep.Step(strings.Repeat("s", durable.MaxNameLength+1), func(ctx steps.Context, s num) (transitions.Transition, error) { return transitions.Done(1), nil })
	assert.ErrorIs(t, e.Register(badStep), durable.ErrInvalidInput, "step name")

	_, err = e.Insert(ctx, "count", num{}, durable.InsertOptions{Queue: "q\x00"})
	assert.ErrorIs(t, err, durable.ErrInvalidInput, "queue override")
	_, err = e.Insert(ctx, "count", num{}, durable.InsertOptions{UniqueKey: strings.Repeat("u", durable.MaxUniqueKeyLength+1)})
	assert.ErrorIs(t, err, durable.ErrInvalidInput, "unique key too long for the index")
	_, err = e.Insert(ctx, "count", num{}, durable.InsertOptions{UniqueKey: "u\x00"})
	assert.ErrorIs(t, err, durable.ErrInvalidInput)
	_, err = e.Insert(ctx, "count", num{}, durable.InsertOptions{ID: "not-a-uuid"})
	assert.ErrorIs(t, err, durable.ErrInvalidInput)
	_, err = e.Insert(ctx, "nope", num{}, durable.InsertOptions{})
	assert.ErrorIs(t, err, durable.ErrUnknownWorkflow)
	assert.Zero(t, count(t, st))

	long := strings.Repeat("u", durable.MaxUniqueKeyLength)
	first, err := e.Insert(ctx, "count", num{}, durable.InsertOptions{UniqueKey: long})
	require.NoError(t, err, "the longest unique key fits PostgreSQL's index")
	again, err := e.Insert(ctx, "count", num{}, durable.InsertOptions{UniqueKey: long})
	require.NoError(t, err)
	assert.Equal(t, first, again, "and is unique")
	startEngine(t, e)
	othersFinish(t, ctx, e)
}

func TestStopTwiceAndCallsAfterStop(t *testing.T) {
	st, _ := pgStore(t)
	ctx := waitCtx(t, 30*time.Second)
	release := make(chan struct{})
	running := make(chan struct{}, 1)
	slow := durable.NewWorkflow[num]("slow", "s", durable.WorkflowOptions{})
	slow.Step("s", func(ctx steps.Context, s num) (transitions.Transition, error) {
		running <- struct{}{}
		<-release
		return transitions.Done(1), nil
	})
	e := engine(t, durable.Config{Store: st}, slow, countWorkflow())
	require.NoError(t, e.Start(ctx))
	id, err := e.Insert(ctx, "slow", num{}, durable.InsertOptions{})
	require.NoError(t, err)
	<-running

	stopped := make(chan error, 2)
	for range 2 {
		go func() { stopped <- e.Stop(ctx) }()
	}
	select {
	case err := <-stopped:
		t.Fatalf("a Stop returned while a step was still running: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-stopped)
	require.NoError(t, <-stopped, "the second, concurrent Stop waited for the first")
	in, err := e.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, store.StatusDone, in.Status, "the running step finished and committed before Stop returned")
	require.NoError(t, e.Stop(ctx), "and a third")

	before := count(t, st)
	_, err = e.Insert(ctx, "count", num{}, durable.InsertOptions{})
	assert.ErrorIs(t, err, durable.ErrStopped)
	assert.ErrorIs(t, e.Signal(ctx, id, "x", nil, durable.SignalOptions{}), durable.ErrStopped)
	assert.ErrorIs(t, e.Cancel(ctx, id, durable.CancelOptions{}), durable.ErrStopped)
	assert.ErrorIs(t, e.Start(ctx), durable.ErrStopped)
	assert.Equal(t, before, count(t, st), "nothing was inserted after Stop")

	// The store is the caller's: another engine goes on with it.
	next := engine(t, durable.Config{Store: st}, countWorkflow())
	startEngine(t, next)
	othersFinish(t, ctx, next)
}
