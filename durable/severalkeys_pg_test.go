package durable_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/transitions"
)

// keyRecorder counts, outside the SDK, the step bodies running under each
// key at every moment, and keeps each key's most.
type keyRecorder struct {
	mu        sync.Mutex
	now, most map[string]int
}

func (r *keyRecorder) enter(keys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		r.now[k]++
		r.most[k] = max(r.most[k], r.now[k])
	}
}

func (r *keyRecorder) leave(keys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		r.now[k]--
	}
}

// hold runs a step body of d under the keys the step holds, recorded.
func (r *keyRecorder) hold(ctx steps.Context, d time.Duration) {
	keys := ctx.Keys()
	r.enter(keys)
	defer r.leave(keys)
	time.Sleep(d)
}

// acctSync is one sync of an account.
type acctSync struct {
	Account string
	N       int
}

type transfer struct {
	From, To int
}

// TestSeveralKeysOnAFleet runs account syncs whose charge step holds the
// account's identity and a slot of a stripe gate of 3, beside transfers
// that hold two accounts' identities (given in either order), on three
// engines, each with its own store, against one PostgreSQL schema. A
// recorder outside the SDK counts the step bodies running under each key:
// no account ever has two at once, the gate never more than three.
func TestSeveralKeysOnAFleet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaOf(pool)
	_, err := postgres.Migrate(ctx, pool, schema)
	require.NoError(t, err)

	const accounts, nSyncs, transfers = 12, 120, 60
	rec := &keyRecorder{now: map[string]int{}, most: map[string]int{}}
	stripe := gate.Gate("stripe", "global")
	acct := func(n int) gate.ConcurrencyKey { return gate.Identity("acct", fmt.Sprint(n)) }
	syncs := durable.NewWorkflow[acctSync]("sync", "fetch", durable.WorkflowOptions{Retry: fastRetry(3)}).
		Step("fetch", func(ctx steps.Context, j acctSync) (transitions.Transition, error) {
			rec.hold(ctx, time.Millisecond)
			return transitions.Next("charge", j, transitions.AddKey(stripe)), nil
		}).
		Step("charge", func(ctx steps.Context, j acctSync) (transitions.Transition, error) {
			rec.hold(ctx, 3*time.Millisecond)
			return transitions.Next("settle", j, transitions.DropKey(stripe)), nil
		}).
		Step("settle", func(ctx steps.Context, j acctSync) (transitions.Transition, error) {
			rec.hold(ctx, time.Millisecond)
			return transitions.Done(j.N), nil
		})
	move := durable.NewWorkflow[transfer]("transfer", "move", durable.WorkflowOptions{Retry: fastRetry(3)}).
		Step("move", func(ctx steps.Context, tr transfer) (transitions.Transition, error) {
			rec.hold(ctx, 2*time.Millisecond)
			return transitions.Done(tr.From), nil
		})

	var engines []*durable.Engine
	for range 3 {
		st, err := postgres.New(ctx, pool, postgres.Options{Schema: schema})
		require.NoError(t, err)
		t.Cleanup(func() { _ = st.Close() })
		e := newEngine(t, durable.Config{Store: st, Queues: map[string]int{durable.DefaultQueue: 8},
			Limits: []gate.Limit{{Name: "stripe", Limit: 3}}}, syncs, move)
		start(t, e)
		engines = append(engines, e)
	}

	var ids []string
	rnd := rand.New(rand.NewPCG(39, 1))
	for n := range nSyncs {
		id, err := engines[n%3].Insert(ctx, "sync", acctSync{Account: fmt.Sprint(n % accounts), N: n},
			durable.InsertOptions{Key: acct(n % accounts)})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	for n := range transfers {
		from, to := rnd.IntN(accounts), rnd.IntN(accounts-1)
		if to >= from {
			to++
		}
		id, err := engines[n%3].Insert(ctx, "transfer", transfer{From: from, To: to},
			durable.InsertOptions{Keys: []gate.ConcurrencyKey{acct(from), acct(to)}})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	for _, id := range ids {
		in, err := engines[0].Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, store.StatusDone, in.Status, "instance %s: %s", id, in.LastError)
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	for n := range accounts {
		k := acct(n).String()
		require.Equal(t, 1, rec.most[k], "%s: steps at once", k)
	}
	require.LessOrEqual(t, rec.most["stripe:global"], 3, "stripe:global: steps at once")
	require.Positive(t, rec.most["stripe:global"])
	t.Logf("stripe:global: at most %d at once", rec.most["stripe:global"])
}
