package storetest

import (
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

// perKeyTests are the rules of per-key limits: a gate.Limit named by a
// full key sets that key's K (and shards) over its name's limit.
var perKeyTests = []test{
	{"perkey/a key with its own limit admits up to it while the other keys of its name keep the name's", func(h *harness) {
		big := gate.Limit{Name: "stripe:big", Limit: 4, Shards: 2}
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2}, big)
		h.insertKeyed("stripe:big", 6)
		h.insertKeyed("stripe:small", 6)
		cs := h.claim("w", 20, at(time.Second))
		require.Len(h.t, cs, 6)
		require.Len(h.t, h.executing("stripe:big"), 4, "the key's own limit")
		require.Len(h.t, h.executing("stripe:small"), 2, "the name's limit")
		requireShards(h, "stripe:big", big.ShardCapacities())
		require.Empty(h.t, h.claim("w", 20, at(2*time.Second)), "both keys are full")

		info := h.keyInfo("stripe:big")
		require.Equal(h.t, 4, info.K)
		require.Equal(h.t, 2, info.Shards, "shards follow the per-key limit")
		require.Equal(h.t, "stripe:big", info.LimitName)
		info = h.keyInfo("stripe:small")
		require.Equal(h.t, 2, info.K)
		require.Equal(h.t, "stripe", info.LimitName)
		require.Empty(h.t, h.keyInfo("account:1").LimitName, "K = 1: no limit")

		for _, c := range cs {
			h.commit("w", at(3*time.Second), done(c))
		}
		rep := h.reconcile(0, at(time.Minute))
		require.Zero(h.t, rep.Drift)
		require.Zero(h.t, rep.CountersRepaired)
		require.Equal(h.t, 4, h.available("stripe:big"))

		hl := h.health(at(time.Minute))
		require.Len(h.t, hl.Gates, 1, "health reports gates by name; a per-key limit is not one")
		require.Equal(h.t, "stripe", hl.Gates[0].Name)
	}},
	{"perkey/raising a saturated key's own limit admits its blocked rows at once", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		ids := h.insertKeyed("stripe:big", 6)
		require.Len(h.t, h.claim("w", 10, at(time.Second)), 2)
		h.requireStatus(store.StatusBlocked, ids[2:]...)

		res := h.syncLimits(gate.Limit{Name: "stripe", Limit: 2}, gate.Limit{Name: "stripe:big", Limit: 5})
		require.Equal(h.t, []gate.Change{{Name: "stripe:big", OldK: 2, NewK: 5, NewSet: true}}, res.Changes)
		require.Equal(h.t, map[string]int64{"stripe:big": 6}, res.Live, "live counts the key's rows")
		h.requireStatus(store.StatusReady, ids[2:5]...)
		h.requireStatus(store.StatusBlocked, ids[5])

		require.Equal(h.t, ids[2:5], claimedIDs(h.claim("w", 10, at(2*time.Second))), "no reconcile needed")
		require.Len(h.t, h.executing("stripe:big"), 5)
		require.Empty(h.t, h.claim("w", 10, at(3*time.Second)))
		require.Zero(h.t, h.reconcile(0, at(4*time.Second)).Drift)
	}},
	{"perkey/lowering a key's own limit binds the next claim and leaves counters equal to the truth", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2}, gate.Limit{Name: "stripe:big", Limit: 6, Shards: 2})
		h.insertKeyed("stripe:big", 10)
		cs := h.claim("w", 10, at(0))
		require.Len(h.t, cs, 6)
		lowered := gate.Limit{Name: "stripe:big", Limit: 3}
		res := h.syncLimits(gate.Limit{Name: "stripe", Limit: 2}, lowered)
		require.Equal(h.t, []gate.Change{{Name: "stripe:big", OldK: 6, NewK: 3, OldSet: true, NewSet: true}}, res.Changes)
		require.Empty(h.t, h.claim("w", 10, at(time.Second)), "six execute under the new limit 3")
		require.Zero(h.t, h.available("stripe:big"))

		for i, c := range cs {
			now := at(time.Duration(2+i) * time.Second)
			h.commit("w", now, done(c))
			got := h.claim("w", 10, now)
			if i < 3 {
				require.Empty(h.t, got, "after %d of 6 finished, %d still execute under limit 3", i+1, 5-i)
			} else {
				require.Len(h.t, got, 1, "under the limit: one slot per row that ends")
			}
		}
		require.Len(h.t, h.executing("stripe:big"), 3)
		rep := h.reconcile(0, at(time.Minute))
		require.Zero(h.t, rep.Drift, "no crash happened: the counters match the executing rows")
		require.Zero(h.t, rep.CountersRepaired)
		requireShards(h, "stripe:big", lowered.ShardCapacities())
		info := h.keyInfo("stripe:big")
		require.Equal(h.t, 3, info.K)
		require.Equal(h.t, 1, info.Shards)
		require.Zero(h.t, info.Available)
	}},
	{"perkey/unsetting a key's own limit falls back to its name's", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2}, gate.Limit{Name: "stripe:big", Limit: 4})
		h.insertKeyed("stripe:big", 6)
		cs := h.claim("w", 10, at(0))
		require.Len(h.t, cs, 4)

		res := h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		require.Equal(h.t, []gate.Change{{Name: "stripe:big", OldK: 4, NewK: 2, OldSet: true}}, res.Changes)
		require.Empty(h.t, h.claim("w", 10, at(time.Second)))
		info := h.keyInfo("stripe:big")
		require.Equal(h.t, 2, info.K)
		require.Equal(h.t, "stripe", info.LimitName)

		h.commit("w", at(2*time.Second), done(cs[0]), done(cs[1]))
		require.Empty(h.t, h.claim("w", 10, at(2*time.Second)), "two still execute under the name's limit 2")
		h.commit("w", at(3*time.Second), done(cs[2]))
		require.Len(h.t, h.claim("w", 10, at(3*time.Second)), 1)
		require.Len(h.t, h.executing("stripe:big"), 2)
		require.Zero(h.t, h.reconcile(0, at(time.Minute)).Drift)
	}},
	{"perkey/a per-key limit needs its name's limit", func(h *harness) {
		_, err := h.s.SyncLimits(h.ctx, []gate.Limit{{Name: "account:1", Limit: 3}})
		require.ErrorIs(h.t, err, gate.ErrPerKeyWithoutGate, "a K = 1 name stays K = 1 for every key")
		require.Empty(h.t, h.limits(), "a refused sync stores nothing")
		ids := h.insertKeyed("account:1", 2)
		require.Equal(h.t, ids[:1], claimedIDs(h.claim("w", 10, at(time.Second))))

		// Owners may differ: the name's limit is one namespace's, the key's another's.
		h.syncKeyLimits("app", store.KeyLimits{Limits: []gate.Limit{{Name: "stripe", Limit: 2}}}, store.SyncOptions{})
		h.syncKeyLimits("ops", store.KeyLimits{Limits: []gate.Limit{{Name: "stripe:big", Limit: 4}}}, store.SyncOptions{})
		_, err = h.s.SyncKeyLimits(h.ctx, "app", store.KeyLimits{Limits: []gate.Limit{}}, store.SyncOptions{})
		require.ErrorIs(h.t, err, gate.ErrPerKeyWithoutGate, "the name's limit stays while a key of it has its own")
		_, err = h.s.SyncKeyLimits(h.ctx, "app", store.KeyLimits{Limits: []gate.Limit{}}, store.SyncOptions{DryRun: true})
		require.ErrorIs(h.t, err, gate.ErrPerKeyWithoutGate, "a dry run reports it too")
		require.Equal(h.t, []string{"stripe", "stripe:big"}, limitNames(h.limits()))
		_, err = h.s.SyncKeyLimits(h.ctx, "app", store.KeyLimits{Limits: []gate.Limit{{Name: "stripe:big", Limit: 9}}}, store.SyncOptions{})
		require.ErrorIs(h.t, err, store.ErrNamespaceConflict)

		h.syncKeyLimits("ops", store.KeyLimits{Limits: []gate.Limit{}}, store.SyncOptions{})
		h.syncKeyLimits("app", store.KeyLimits{Limits: []gate.Limit{}}, store.SyncOptions{})
		require.Empty(h.t, h.limits(), "removed key first, then name")
	}},
	{"limits/the names' limits are the stored limits without the per-key ones", func(h *harness) {
		n, ok := h.s.(store.NameLimitsReader)
		require.True(h.t, ok, "the store reads the names' limits apart (store.NameLimitsReader)")
		got, err := n.NameLimits(h.ctx)
		require.NoError(h.t, err)
		require.Empty(h.t, got)
		h.syncKeyLimits("ops", store.KeyLimits{Limits: []gate.Limit{{Name: "stripe", Limit: 2}, {Name: "stripe:big", Limit: 4},
			{Name: "stripe:big:eu", Limit: 3}, {Name: "openai", Limit: 3, Shards: 3}}}, store.SyncOptions{})
		h.syncKeyLimits("app", store.KeyLimits{Limits: []gate.Limit{{Name: "api", Limit: 5}, {Name: "api:t1", Limit: 50}}}, store.SyncOptions{})
		got, err = n.NameLimits(h.ctx)
		require.NoError(h.t, err)
		require.Equal(h.t, []gate.Limit{{Name: "api", Limit: 5, Shards: 1}, {Name: "openai", Limit: 3, Shards: 3}, {Name: "stripe", Limit: 2, Shards: 1}}, got)
		require.Equal(h.t, []string{"api", "api:t1", "openai", "stripe", "stripe:big", "stripe:big:eu"}, limitNames(h.limits()))
	}},
	{"limits/a sync's RemoveLimits deletes the named entries of its namespace and keeps the rest", func(h *harness) {
		h.syncKeyLimits("ops", store.KeyLimits{Limits: []gate.Limit{{Name: "stripe", Limit: 2}, {Name: "stripe:big", Limit: 4}, {Name: "openai", Limit: 3}}}, store.SyncOptions{})
		h.syncKeyLimits("app", store.KeyLimits{Limits: []gate.Limit{{Name: "api", Limit: 5}}}, store.SyncOptions{})
		_, err := h.s.SyncKeyLimits(h.ctx, "app", store.KeyLimits{Limits: []gate.Limit{}},
			store.SyncOptions{KeepOmitted: true, RemoveLimits: []string{"stripe:big"}})
		require.ErrorIs(h.t, err, store.ErrNamespaceConflict, "another namespace's entry")
		res := h.syncKeyLimits("ops", store.KeyLimits{Limits: []gate.Limit{}},
			store.SyncOptions{KeepOmitted: true, RemoveLimits: []string{"stripe:big", "missing"}})
		require.Equal(h.t, []gate.Change{{Name: "stripe:big", OldK: 4, NewK: 2, OldSet: true}}, res.Changes)
		require.Equal(h.t, []string{"api", "openai", "stripe"}, limitNames(h.limits()))
	}},
}
