package enginetest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

// countingStore counts the claims of a store that hands slots off, as
// both backends do, and records for each batch of outcomes whether the
// engine said it would claim again anyway (store.HandOff.Claiming). It
// keeps the hand-off interface visible to the engine (a plain embedding of
// store.Store would hide it) and hides the store's notifications
// (store.Notifier): an engine then claims only when it wakes itself, and
// each of its claims is one the engine chose to make (with notifications,
// an insert wakes its engine twice, at once and when the notification
// comes back, and either may cost a claim).
type countingStore struct {
	store.Store
	claims   atomic.Int64
	mu       sync.Mutex
	claiming []bool // one per Complete or CompleteHandOff, in call order
}

func (c *countingStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, req)
}

func (c *countingStore) Complete(ctx context.Context, worker string, outcomes []store.Outcome, now time.Time) ([]store.OutcomeResult, error) {
	c.recordFlush(false)
	return c.Store.Complete(ctx, worker, outcomes, now)
}

func (c *countingStore) CompleteHandOff(ctx context.Context, worker string, outcomes []store.Outcome, now time.Time, h store.HandOff) ([]store.OutcomeResult, []store.Claimed, error) {
	c.recordFlush(h.Claiming)
	return c.Store.(store.HandOffer).CompleteHandOff(ctx, worker, outcomes, now, h)
}

func (c *countingStore) recordFlush(claiming bool) {
	c.mu.Lock()
	c.claiming = append(c.claiming, claiming)
	c.mu.Unlock()
}

// flushes returns, per batch of outcomes so far, whether it said Claiming.
func (c *countingStore) flushes() []bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.claiming)
}

// wakeEngine is an engine that never polls (an hour between polls):
// whatever it runs, it runs because something woke it.
func wakeEngine(t *testing.T, st store.Store, executors int, cfg durable.Config) *durable.Engine {
	t.Helper()
	cfg.Store = st
	cfg.Queues = map[string]int{"mail": executors}
	cfg.PollInterval = time.Hour
	cfg.ReconcileInterval = time.Hour
	cfg.Logger = slog.New(slog.DiscardHandler)
	e, err := durable.New(cfg)
	require.NoError(t, err)
	wf := durable.NewWorkflow[sleepState]("work", "one", durable.WorkflowOptions{Queue: "mail"})
	wf.Step("one", func(ctx steps.Context, s sleepState) (transitions.Transition, error) {
		time.Sleep(time.Millisecond)
		if s.N < 0 { // a two-step row: its first outcome leaves it ready
			return transitions.Next("one", sleepState{N: 0}), nil
		}
		return transitions.Done(s.N), nil
	})
	require.NoError(t, e.Register(wf))
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Stop(ctx)
	})
	return e
}

// WakesWithoutPolling runs, on engines that never poll, work that each
// way of freeing room or slots must wake a pick loop for: more rows than
// executors, a gate of one, a K = 1 key, a queue's budget of one, rows
// with a second step, and many K = 1 keys with rows waiting behind each
// (where claims race the outcomes that free their keys, as in the peers'
// keyed run). Every row finishes within seconds: none waited for a poll
// that never comes.
func WakesWithoutPolling(t *testing.T, newStore func() store.Store) {
	one := func(k gate.ConcurrencyKey) func(int) gate.ConcurrencyKey {
		return func(int) gate.ConcurrencyKey { return k }
	}
	cases := []struct {
		name      string
		executors int
		rows      int
		key       func(i int) gate.ConcurrencyKey
		policy    bool
		n         int // state: -1 for two steps
	}{
		{name: "more rows than executors", executors: 1, rows: 8, key: one(gate.ConcurrencyKey{})},
		{name: "a gate of one", executors: 4, rows: 8, key: one(gate.Gate("tenant", "a"))},
		{name: "a K = 1 key", executors: 4, rows: 8, key: one(gate.Identity("account", "a"))},
		{name: "a queue budget of one", executors: 4, rows: 8, key: one(gate.ConcurrencyKey{}), policy: true},
		{name: "two steps", executors: 2, rows: 8, key: one(gate.ConcurrencyKey{}), n: -1},
		{name: "many K = 1 keys", executors: 100, rows: 3000, key: func(i int) gate.ConcurrencyKey {
			return gate.Identity("account", fmt.Sprint(i%300))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := newStore()
			e := wakeEngine(t, st, c.executors, durable.Config{Namespace: "wake", Limits: []gate.Limit{{Name: "tenant", Limit: 1}}})
			if c.policy {
				_, err := e.SyncConcurrencyPolicies(context.Background(), []store.ConcurrencyPolicy{{Queue: "mail", MaxActive: 1}}, store.SyncOptions{})
				require.NoError(t, err)
			}
			reqs := make([]durable.InsertRequest, c.rows)
			for i := range reqs {
				reqs[i] = durable.InsertRequest{Workflow: "work", State: sleepState{N: c.n}, Options: durable.InsertOptions{Key: c.key(i)}}
			}
			ids, err := e.InsertMany(context.Background(), reqs)
			require.NoError(t, err)
			waitDoneOrTellWhy(t, e, ids, 30*time.Second)
		})
	}
}

// waitDoneOrTellWhy waits for the instances ids to be done, as waitDone,
// and when one is not by timeout, tells a lost wakeup from a row that no
// claim would start: it wakes the engine (an insert of a keyless row wakes
// its queue's pick loop) and says whether the late rows then finish.
func waitDoneOrTellWhy(t *testing.T, e *durable.Engine, ids []string, timeout time.Duration) {
	t.Helper()
	late := waitEnded(t, e, ids, timeout)
	if len(late) == 0 {
		return
	}
	_, err := e.Insert(context.Background(), "work", sleepState{}, durable.InsertOptions{})
	require.NoError(t, err)
	woken, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	ranAfterWake := 0
	for _, in := range late {
		if done, err := e.Wait(woken, in.ID); err == nil && done.Status == store.StatusDone {
			ranAfterWake++
		}
	}
	statuses := map[store.Status]int{}
	for _, in := range late {
		statuses[in.Status]++
	}
	why := "a lost wakeup, if they waited ready"
	if ranAfterWake < len(late) {
		why = "rows that a claim did not start either"
	}
	t.Fatalf("%d instances not done after %s (by status %v; the first %+v); %d of them finished within 5 s of a wake: %s",
		len(late), timeout, statuses, late[0], ranAfterWake, why)
}

// ClaimsOncePerRow inserts rows one at a time into an engine that never
// polls and is not notified (see countingStore), each once the one before
// it is done: each costs the claim its insert wakes, and no claim after
// its outcome (an idle queue's freed executor, or a terminal outcome that
// leaves no row waiting for its slot, admits nothing: see
// store.OutcomeResult.Unwaited). Keyless rows, a gate's and a K = 1 key's alike.
func ClaimsOncePerRow(t *testing.T, newStore func() store.Store) {
	for _, key := range []gate.ConcurrencyKey{{}, gate.Gate("tenant", "a"), gate.Identity("account", "a")} {
		t.Run(fmt.Sprintf("key %q", key.String()), func(t *testing.T) {
			st := &countingStore{Store: newStore()}
			e := wakeEngine(t, st, 4, durable.Config{Namespace: "wake", Limits: []gate.Limit{{Name: "tenant", Limit: 2}}})
			settle := func() int64 { // the claims so far, once none has come for a while
				n := st.claims.Load()
				for {
					time.Sleep(50 * time.Millisecond)
					m := st.claims.Load()
					if m == n {
						return n
					}
					n = m
				}
			}
			before := settle() // Start's
			const rows = 20
			for i := range rows {
				id, err := e.Insert(context.Background(), "work", sleepState{N: i}, durable.InsertOptions{Key: key})
				require.NoError(t, err)
				waitDone(t, e, []string{id}, 20*time.Second)
			}
			claims := settle() - before
			t.Logf("%d claims for %d rows", claims, rows)
			require.GreaterOrEqual(t, claims, int64(rows), "every row is claimed")
			require.LessOrEqual(t, claims, int64(rows+rows/10), "about one claim per row, none after its outcome")
		})
	}
}

// ClaimingOnlyWhileClaimsComeBackFull runs a backlog of K = 1 rows, one
// per key, through an engine of four executors that never polls: while
// its claims take all they ask for, its flushes tell the store that it
// claims again anyway (store.HandOff.Claiming), so that the store need not
// read whether rows wait for the freed slots. Once idle, a row inserted
// alone is claimed by a claim that comes back short, and its outcome's
// flush asks (the answer spares the claim after it: ClaimsOncePerRow).
func ClaimingOnlyWhileClaimsComeBackFull(t *testing.T, newStore func() store.Store) {
	st := &countingStore{Store: newStore()}
	e := wakeEngine(t, st, 4, durable.Config{Namespace: "wake"})
	const rows = 300
	reqs := make([]durable.InsertRequest, rows)
	for i := range reqs {
		reqs[i] = durable.InsertRequest{Workflow: "work", State: sleepState{N: i}, Options: durable.InsertOptions{Key: gate.Identity("account", fmt.Sprint(i))}}
	}
	ids, err := e.InsertMany(context.Background(), reqs)
	require.NoError(t, err)
	waitDone(t, e, ids, 60*time.Second)
	busy := st.flushes()
	require.Contains(t, busy, true, "some flush of the backlog said the engine claims anyway (%d flushes)", len(busy))

	for i := range 5 {
		id, err := e.Insert(context.Background(), "work", sleepState{N: i}, durable.InsertOptions{Key: gate.Identity("account", "alone")})
		require.NoError(t, err)
		waitDone(t, e, []string{id}, 20*time.Second)
	}
	// Each call is recorded before it commits: the alone rows' flushes
	// are the last five.
	calls := st.flushes()
	require.GreaterOrEqual(t, len(calls), len(busy)+5)
	require.Equal(t, []bool{false, false, false, false, false}, calls[len(calls)-5:], "an idle engine's flushes ask whether rows wait")
}
