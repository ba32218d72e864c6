package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/store/postgres"
)

// testHost finishes every step it is given.
type testHost struct {
	flushed int
}

func (h *testHost) Execute(_ context.Context, c store.Claimed) store.Outcome {
	return store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone, Step: c.Step, State: c.State,
		Result: json.RawMessage(`"ok"`)}
}
func (h *testHost) Workflows() []store.WorkflowVersion {
	return []store.WorkflowVersion{{Workflow: "w", Version: 1}}
}
func (h *testHost) StoreNow() time.Time                         { return time.Time{} }
func (h *testHost) FireSchedules(context.Context) ScheduleRound { return ScheduleRound{} }
func (h *testHost) Reconcile(context.Context) (store.ReconcileReport, error) {
	return store.ReconcileReport{}, nil
}
func (h *testHost) Flushed() { h.flushed++ }

// refusingStore refuses, as invalid data, every Complete batch that holds an
// outcome of instance id (bare failures too when all is set).
type refusingStore struct {
	store.Store
	id  string
	all bool
}

func (r *refusingStore) Complete(ctx context.Context, w string, outs []store.Outcome, now time.Time) ([]store.OutcomeResult, error) {
	for _, o := range outs {
		if o.ID == r.id && (r.all || o.Kind != store.OutcomeFailed) {
			return nil, fmt.Errorf("%w: the test refuses %s", store.ErrInvalid, o.ID)
		}
	}
	return r.Store.Complete(ctx, w, outs, now)
}

func newTestRuntime(t *testing.T, st store.Store, n int) (*Runtime, []string) {
	t.Helper()
	ctx := context.Background()
	var rows []store.NewInstance
	for range n {
		rows = append(rows, store.NewInstance{ID: store.NewInstanceID(), Workflow: "w", Version: 1, Queue: "q", Step: "s",
			State: json.RawMessage(`{}`)})
	}
	_, err := st.Insert(ctx, rows)
	require.NoError(t, err)
	ids := make([]string, n)
	for i, r := range rows {
		ids[i] = r.ID
	}
	c := metricnoop.Int64Counter{}
	rt := New(Config{Store: st, Logger: slog.New(slog.DiscardHandler), Clock: wallClock{}, WorkerID: "test",
		Queues: map[string]int{"q": 10}, Lease: time.Minute, MaxErrorLength: 1 << 10,
		StaleCounter: c, ReapedCounter: c}, &testHost{})
	return rt, ids
}

// newPGStore is a PostgreSQL store in a fresh schema of the test database.
func newPGStore(t *testing.T) *postgres.Store {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaOf(pool)
	_, err := postgres.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	pg, err := postgres.New(ctx, pool, postgres.Options{Schema: schema})
	require.NoError(t, err)
	return pg
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Tick commits through commitOutcomes, as the flusher does: a batch the
// store refuses is split, the other outcomes commit, and the refused one
// fails its instance with the store's reason.
func TestTickSplitsARefusedBatch(t *testing.T) {
	rs := &refusingStore{Store: memory.New(memory.Options{})}
	rt, ids := newTestRuntime(t, rs, 5)
	rs.id = ids[2]
	ctx := context.Background()
	round, err := rt.Tick(ctx)
	require.NoError(t, err)
	require.Len(t, round.Claimed, 5)
	require.Len(t, round.Outcomes, 5)
	for _, id := range ids {
		in, err := rs.Get(ctx, id)
		require.NoError(t, err)
		if id == rs.id {
			require.Equal(t, store.StatusFailed, in.Status)
			require.Contains(t, in.LastError, "the store refused this step's outcome")
			continue
		}
		require.Equal(t, store.StatusDone, in.Status)
	}
}

// An outcome refused even as a bare failure is left out, its claim left to
// the reaper; the others commit.
func TestTickAbandonsAnOutcomeRefusedAsAFailure(t *testing.T) {
	rs := &refusingStore{Store: memory.New(memory.Options{}), all: true}
	rt, ids := newTestRuntime(t, rs, 3)
	rs.id = ids[0]
	ctx := context.Background()
	round, err := rt.Tick(ctx)
	require.NoError(t, err)
	require.Len(t, round.Outcomes, 2)
	for _, o := range round.Outcomes {
		require.NotEqual(t, rs.id, o.ID)
	}
	in, err := rs.Get(ctx, rs.id)
	require.NoError(t, err)
	require.Equal(t, store.StatusExecuting, in.Status, "the claim is left to the reaper")
}

type sqlErr string

func (e sqlErr) Error() string    { return "sqlstate " + string(e) }
func (e sqlErr) SQLState() string { return string(e) }

func TestRejected(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{store.ErrInvalid, true},
		{fmt.Errorf("wrapped: %w", store.ErrInvalid), true},
		{sqlErr("22P02"), true},
		{fmt.Errorf("wrapped: %w", sqlErr("23505")), true},
		{sqlErr("40001"), false},
		{sqlErr("08006"), false},
		{errors.New("connection refused"), false},
		{context.DeadlineExceeded, false},
	} {
		require.Equal(t, c.want, rejected(c.err), "%v", c.err)
	}
}

func TestRefusedOutcomeIsABareFailure(t *testing.T) {
	rt := New(Config{MaxErrorLength: 64}, &testHost{})
	o := store.Outcome{ID: "i", Fence: 3, Kind: store.OutcomeDone, Step: "s", State: json.RawMessage(`{}`),
		Result: json.RawMessage(`1`), SetKey: true, Key: "k",
		History: &store.HistoryEntry{InstanceID: "i", Step: "s", Attempt: 2, Outcome: "done"}}
	f := rt.refusedOutcome(o, errors.New(strings.Repeat("x", 100)+"\x00"))
	require.Equal(t, store.OutcomeFailed, f.Kind)
	require.Equal(t, "i", f.ID)
	require.EqualValues(t, 3, f.Fence)
	require.Nil(t, f.State)
	require.Nil(t, f.Result)
	require.False(t, f.SetKey)
	require.LessOrEqual(t, len(f.Error), 64+len("…(truncated)"))
	require.Equal(t, "refused", f.History.Outcome)
	require.Equal(t, 2, f.Attempt)
	require.Equal(t, "done", o.History.Outcome, "the original history is not changed")
}

// ambiguousStore commits the first Complete it is given and then answers
// with a connection error, as when the server goes down between a COMMIT
// and its answer; commitFirst false fails it without committing.
type ambiguousStore struct {
	store.Store
	calls       int
	commitFirst bool
}

func (a *ambiguousStore) Complete(ctx context.Context, w string, outs []store.Outcome, now time.Time) ([]store.OutcomeResult, error) {
	res, _, err := a.complete(func() ([]store.OutcomeResult, []store.Claimed, error) {
		res, err := a.Store.Complete(ctx, w, outs, now)
		return res, nil, err
	})
	return res, err
}

// CompleteHandOff is Complete's hand-off form, likewise (the wrapped store
// must be a store.HandOffer).
func (a *ambiguousStore) CompleteHandOff(ctx context.Context, w string, outs []store.Outcome, now time.Time, h store.HandOff) ([]store.OutcomeResult, []store.Claimed, error) {
	return a.complete(func() ([]store.OutcomeResult, []store.Claimed, error) {
		return a.Store.(store.HandOffer).CompleteHandOff(ctx, w, outs, now, h)
	})
}

// complete runs call: the first time, only if commitFirst, and then fails
// as a broken connection would; every later time, as it is.
func (a *ambiguousStore) complete(call func() ([]store.OutcomeResult, []store.Claimed, error)) ([]store.OutcomeResult, []store.Claimed, error) {
	a.calls++
	if a.calls == 1 {
		if a.commitFirst {
			if _, _, err := call(); err != nil {
				return nil, nil, err
			}
		}
		return nil, nil, sqlErr("57P01") // terminating connection due to administrator command
	}
	return call()
}

// A batch sent again after an error that left its commit unknown: its
// outcomes found stale but whose runs are in the step history, or, without
// a history, whose rows are as the outcome leaves them, were committed by
// the first attempt, and are neither stale nor counted; an outcome whose
// claim was really lost stays stale.
func TestCommitAfterAnUnknownCommitTellsLandedFromStale(t *testing.T) {
	for _, tc := range []struct {
		name        string
		commitFirst bool
		noHistory   bool
		kind        store.OutcomeKind
		wantStale   int
	}{
		{"the first attempt committed", true, false, store.OutcomeDone, 0},
		{"the first attempt did not commit, and the claim is lost", false, false, store.OutcomeDone, 1},
		{"no history: the first attempt committed a done", true, true, store.OutcomeDone, 0},
		{"no history: the first attempt committed a next step", true, true, store.OutcomeReady, 0},
		{"no history: the claim is lost before a done", false, true, store.OutcomeDone, 1},
		{"no history: the claim is lost before a next step", false, true, store.OutcomeReady, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			as := &ambiguousStore{Store: memory.New(memory.Options{}), commitFirst: tc.commitFirst}
			rt, _ := newTestRuntime(t, as, 1)
			res, err := as.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "test", Limit: 1, Lease: time.Minute})
			require.NoError(t, err)
			require.Len(t, res.Claimed, 1)
			c := res.Claimed[0]
			if !tc.commitFirst {
				// The claim is lost meanwhile: released, as a reaper would.
				require.NoError(t, as.Release(ctx, "test", []store.ClaimRef{{ID: c.ID, Fence: c.Fence}}, time.Time{}))
			}
			out := store.Outcome{ID: c.ID, Fence: c.Fence, Kind: tc.kind, Result: json.RawMessage(`"ok"`),
				History: &store.HistoryEntry{InstanceID: c.ID, Step: c.Step, Attempt: c.Attempt, Worker: "test",
					StartedAt: time.Now(), FinishedAt: time.Now(), Outcome: "done"}}
			if tc.kind == store.OutcomeReady {
				// The next step, due at once, as transitions.Next makes it.
				out.Step, out.Result, out.State, out.History.Outcome = "next", nil, json.RawMessage(`{}`), "next"
			}
			if tc.noHistory {
				out.History = nil // the PostgreSQL store keeps none by default
			}
			var got []store.OutcomeResult
			retries := 0
			err = rt.commitOutcomes(ctx, []store.Outcome{out}, commitHooks{
				committed: func(_ []store.Outcome, r []store.OutcomeResult) { got = r; rt.countStale(r) },
				abandoned: func(store.Outcome) {},
				unreachable: func(error) bool {
					retries++
					return true
				},
			})
			require.NoError(t, err)
			require.Equal(t, 1, retries)
			require.Len(t, got, 1)
			require.Equal(t, tc.wantStale == 1, got[0].Stale)
			require.EqualValues(t, tc.wantStale, rt.StaleOutcomes())
		})
	}
}

// A hand-off flush sent again after an unknown commit that had landed: the
// successor its outcome named, running already, was passed the slot by
// that commit, and the flush hands it on as passed (handed) rather than
// leaving it to be taken for refused and stopped. On the PostgreSQL store:
// the memory store reserves no successors.
func TestCommitAfterAnUnknownCommitHandsOnTheSuccessorItPassed(t *testing.T) {
	ctx := context.Background()
	pg := newPGStore(t)
	var rows []store.NewInstance
	for range 3 {
		rows = append(rows, store.NewInstance{ID: store.NewInstanceID(), Workflow: "w", Version: 1, Queue: "q", Step: "s",
			State: json.RawMessage(`{}`), Key: "acct:1"})
	}
	_, err := pg.Insert(ctx, rows)
	require.NoError(t, err)
	res, err := pg.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "test", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	first := res.Claimed[0]
	// Its outcome hands the key's slot to the second row, and reserves the
	// third after it.
	_, got, err := pg.CompleteHandOff(ctx, "test", []store.Outcome{{ID: first.ID, Fence: first.Fence,
		Kind: store.OutcomeDone, Step: first.Step, Contended: true, Ahead: 1}}, time.Time{},
		store.HandOff{Room: map[string]int{"q": 1}, Lease: time.Minute, Reserve: true})
	require.NoError(t, err)
	var second, third store.Claimed
	for _, c := range got {
		if c.After == "" {
			second = c
		} else {
			third = c
		}
	}
	require.NotEmpty(t, second.ID, "the second row was handed the slot")
	require.Equal(t, second.ID, third.After, "the third row is reserved after it")
	next := store.ClaimRef{ID: third.ID, Fence: third.Fence}

	rt, _ := newTestRuntime(t, &ambiguousStore{Store: pg, commitFirst: true}, 0)
	var handed []store.Claimed
	var results []store.OutcomeResult
	err = rt.commitOutcomes(ctx, []store.Outcome{{ID: second.ID, Fence: second.Fence, Kind: store.OutcomeDone,
		Step: second.Step, Contended: true, Successor: next}}, commitHooks{
		handOff:     &store.HandOff{Room: map[string]int{"q": 0}, Lease: time.Minute, Reserve: true},
		handed:      func(cs []store.Claimed, _ time.Time) { handed = append(handed, cs...) },
		committed:   func(_ []store.Outcome, r []store.OutcomeResult) { results = r },
		abandoned:   func(store.Outcome) {},
		unreachable: func(error) bool { return true },
	})
	require.NoError(t, err)
	require.Len(t, results, 1)
	require.False(t, results[0].Stale, "the retry found the outcome applied")
	require.Len(t, handed, 1, "the successor the landed commit passed the slot to is handed on")
	require.Equal(t, next, store.ClaimRef{ID: handed[0].ID, Fence: handed[0].Fence})
	require.Equal(t, store.StatusExecuting, handed[0].Status)
	require.Equal(t, "test", handed[0].Worker)
}
