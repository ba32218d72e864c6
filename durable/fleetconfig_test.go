package durable_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// An engine whose configuration does not mention limits (an inserter, an
// admin tool, a worker of another service) leaves the fleet's stored limits
// alone; an explicit empty set removes them.
func TestEngineWithoutLimitsLeavesTheFleetsGatesAlone(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		worker := newEngine(t, durable.Config{Store: st, WorkerID: "worker",
			Limits:     []gate.Limit{{Name: "api", Limit: 3}},
			RateLimits: []gate.RateLimit{{Name: "api", Limit: 10, Period: 1e9}}}, counterWorkflow())
		start(t, worker)
		inserter := newEngine(t, durable.Config{Store: st, WorkerID: "inserter"}, counterWorkflow())
		start(t, inserter)
		ls, err := st.Limits(ctx)
		require.NoError(t, err)
		require.Equal(t, []gate.Limit{{Name: "api", Limit: 3, Shards: 1}}, ls, "nil Limits synced nothing")
		rs, err := st.RateLimits(ctx)
		require.NoError(t, err)
		require.Len(t, rs, 1, "nil RateLimits synced nothing")

		only := newEngine(t, durable.Config{Store: st, WorkerID: "only-limits", Limits: []gate.Limit{{Name: "api", Limit: 4}}}, counterWorkflow())
		start(t, only)
		rs, err = st.RateLimits(ctx)
		require.NoError(t, err)
		require.Len(t, rs, 1, "a configuration with limits only leaves the rate limits alone")

		admin := newEngine(t, durable.Config{Store: st, WorkerID: "admin", Limits: []gate.Limit{}}, counterWorkflow())
		start(t, admin)
		ls, err = st.Limits(ctx)
		require.NoError(t, err)
		require.Empty(t, ls, "an explicit empty set removes the namespace's limits")
	})
}

// Strict and the warnings judge a key by the K the fleet's stored limits
// give it, not by this engine's configuration.
func TestStrictChecksTheStoredLimits(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		_, err := st.SyncKeyLimits(ctx, store.DefaultNamespace, store.KeyLimits{Limits: []gate.Limit{{Name: "order", Limit: 5}}}, store.SyncOptions{})
		require.NoError(t, err)
		e := newEngine(t, durable.Config{Store: st, Strict: true}, counterWorkflow())
		_, err = e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Identity("order", "42")})
		require.ErrorIs(t, err, gate.ErrPrefixCapture, "the stored order limit of 5 would run this identity 5 at a time")
		_, err = e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Gate("order", "7")})
		require.NoError(t, err, "order is a gate of 5 in the fleet")
		_, err = e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Gate("stripe", "7")})
		require.ErrorIs(t, err, gate.ErrPrefixCapture, "stripe has no stored limit: it would run at K = 1")

		lax := newEngine(t, durable.Config{Store: st, WorkerID: "lax"}, counterWorkflow())
		_, err = lax.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Identity("order", "43")})
		require.NoError(t, err)
		require.Equal(t, []gate.Warning{{Kind: gate.IdentityCaptured, Name: "order", Message: lax.Warnings()[0].Message}}, lax.Warnings())
	})
}

// A limit change that alters live keys is reported with its count, by the
// engine that made it and in every engine's Health.
func TestLiveChangeWarningsKeepTheirCountsFleetWide(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		inserter := newEngine(t, durable.Config{Store: st, WorkerID: "inserter"}, counterWorkflow())
		for _, id := range []string{"1", "2"} {
			_, err := inserter.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Gate("api", id)})
			require.NoError(t, err)
		}
		changer := newEngine(t, durable.Config{Store: st, WorkerID: "changer", Limits: []gate.Limit{{Name: "api", Limit: 3}}}, counterWorkflow())
		start(t, changer)
		find := func(ws []gate.Warning) gate.Warning {
			for _, w := range ws {
				if w.Kind == gate.LiveKeysChanged && w.Name == "api" {
					return w
				}
			}
			return gate.Warning{}
		}
		require.Equal(t, int64(2), find(changer.Warnings()).Live, "the engine that made the change keeps the count")
		for _, e := range []*durable.Engine{changer, inserter} {
			h, err := e.Health(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(2), find(h.Warnings).Live, "%s's Health shows the change, from the store", e.WorkerID())
		}
	})
}

// The reconciler and the retention sweep run on one engine of the fleet at
// a time; when it stops, another takes over.
func TestMaintenanceRunsOnOneEngineAtATime(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		var engines []*durable.Engine
		for _, w := range []string{"m1", "m2", "m3"} {
			e := newEngine(t, durable.Config{Store: st, WorkerID: w, ReconcileInterval: 20 * time.Millisecond}, counterWorkflow())
			start(t, e)
			engines = append(engines, e)
		}
		sweepers := func(es []*durable.Engine) []string {
			var out []string
			for _, e := range es {
				h, err := e.Health(ctx)
				require.NoError(t, err)
				if h.LastReconcile != nil {
					out = append(out, e.WorkerID())
				}
			}
			return out
		}
		require.Eventually(t, func() bool { return len(sweepers(engines)) > 0 }, 5*time.Second, 10*time.Millisecond)
		time.Sleep(200 * time.Millisecond) // ten sweep intervals
		first := sweepers(engines)
		require.Len(t, first, 1, "one engine sweeps")
		var rest []*durable.Engine
		for _, e := range engines {
			if e.WorkerID() == first[0] {
				require.NoError(t, e.Stop(ctx))
			} else {
				rest = append(rest, e)
			}
		}
		require.Eventually(t, func() bool { return len(sweepers(rest)) == 1 }, 5*time.Second, 10*time.Millisecond,
			"another engine takes the sweeps over once the lease expired")
		time.Sleep(200 * time.Millisecond)
		require.Len(t, sweepers(rest), 1, "still one at a time")
	})
}

// limitReads counts the engine's reads of the stored limits: every one
// (Limits) and the names' only (store.NameLimitsReader).
type limitReads struct {
	store.Store
	all, names atomic.Int64
}

func (l *limitReads) Limits(ctx context.Context) ([]gate.Limit, error) {
	l.all.Add(1)
	return l.Store.Limits(ctx)
}

func (l *limitReads) NameLimits(ctx context.Context) ([]gate.Limit, error) {
	l.names.Add(1)
	return l.Store.(store.NameLimitsReader).NameLimits(ctx)
}

// The key checks read the names' limits only, which is all they look up,
// when the store reads them apart: a fleet may store a per-key limit for
// each of many thousand tenants, and every engine reads again every few
// seconds. They judge keys as before, per-key limits stored or not.
func TestKeyChecksReadTheNamesLimits(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		limits := []gate.Limit{{Name: "stripe", Limit: 5}}
		for i := range 300 {
			limits = append(limits, gate.Limit{Name: fmt.Sprintf("stripe:t%d", i), Limit: 50})
		}
		_, err := st.SyncKeyLimits(ctx, "ops", store.KeyLimits{Limits: limits}, store.SyncOptions{})
		require.NoError(t, err)
		reads := &limitReads{Store: st}
		e := newEngine(t, durable.Config{Store: reads, Strict: true}, counterWorkflow())
		_, err = e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Gate("stripe", "t7")})
		require.NoError(t, err, "stripe is a gate in the fleet")
		_, err = e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Identity("stripe", "t8")})
		require.ErrorIs(t, err, gate.ErrPrefixCapture, "the stored stripe limit captures the identity")
		_, err = e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Gate("openai", "x")})
		require.ErrorIs(t, err, gate.ErrPrefixCapture, "openai has no stored limit")
		require.Positive(t, reads.names.Load(), "the checks read the names' limits")
		require.Zero(t, reads.all.Load(), "the checks read every stored limit")
	})
}
