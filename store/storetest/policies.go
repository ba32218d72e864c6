package storetest

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

func (h *harness) syncPolicies(ns string, defs ...store.ConcurrencyPolicy) []store.ConcurrencyPolicy {
	h.t.Helper()
	got, err := h.s.SyncConcurrencyPolicies(h.ctx, ns, defs, store.SyncOptions{})
	require.NoError(h.t, err)
	return got
}

func (h *harness) policies() []store.ConcurrencyPolicy {
	h.t.Helper()
	got, err := h.s.ListConcurrencyPolicies(h.ctx)
	require.NoError(h.t, err)
	return got
}

func (h *harness) syncKeyLimits(ns string, want store.KeyLimits, opts store.SyncOptions) store.LimitsResult {
	h.t.Helper()
	res, err := h.s.SyncKeyLimits(h.ctx, ns, want, opts)
	require.NoError(h.t, err)
	return res
}

var policyTests = []test{
	{"policies/sync stores, lists and prunes what a namespace owns", func(h *harness) {
		require.Empty(h.t, h.policies())
		got := h.syncPolicies("workers",
			store.ConcurrencyPolicy{Queue: "mail", MaxActive: 20, MaxActivePerKey: 3},
			store.ConcurrencyPolicy{Queue: "sms", MaxActive: 5})
		want := []store.ConcurrencyPolicy{
			{Queue: "mail", Namespace: "workers", MaxActive: 20, MaxActivePerKey: 3},
			{Queue: "sms", Namespace: "workers", MaxActive: 5},
		}
		require.Equal(h.t, want, got)
		require.Equal(h.t, want, h.policies())
		h.syncPolicies("billing", store.ConcurrencyPolicy{Queue: "invoices", MaxActive: 1})

		// Omitted policies of the namespace are pruned; other namespaces keep theirs.
		got = h.syncPolicies("workers", store.ConcurrencyPolicy{Queue: "mail", MaxActive: 10})
		require.Equal(h.t, []store.ConcurrencyPolicy{{Queue: "mail", Namespace: "workers", MaxActive: 10}}, got)
		require.Equal(h.t, []store.ConcurrencyPolicy{
			{Queue: "invoices", Namespace: "billing", MaxActive: 1},
			{Queue: "mail", Namespace: "workers", MaxActive: 10},
		}, h.policies())

		// KeepOmitted adds without pruning.
		got, err := h.s.SyncConcurrencyPolicies(h.ctx, "workers",
			[]store.ConcurrencyPolicy{{Queue: "push", MaxActive: 2}}, store.SyncOptions{KeepOmitted: true})
		require.NoError(h.t, err)
		require.Equal(h.t, []string{"mail", "push"}, policyQueues(got))

		// Invalid definitions store nothing.
		for _, bad := range [][]store.ConcurrencyPolicy{
			{{Queue: "x", MaxActive: 0}},
			{{Queue: "", MaxActive: 1}},
			{{Queue: "x", MaxActive: 1, MaxActivePerKey: -1}},
			{{Queue: "x", MaxActive: 1}, {Queue: "x", MaxActive: 2}},
		} {
			_, err := h.s.SyncConcurrencyPolicies(h.ctx, "workers", bad, store.SyncOptions{})
			require.Error(h.t, err, "%+v", bad)
		}
		_, err = h.s.SyncConcurrencyPolicies(h.ctx, "", []store.ConcurrencyPolicy{{Queue: "x", MaxActive: 1}}, store.SyncOptions{})
		require.Error(h.t, err, "a namespace is required")
		require.Equal(h.t, []string{"invoices", "mail", "push"}, policyQueues(h.policies()))

		// An empty sync prunes everything the namespace owns.
		require.Empty(h.t, h.syncPolicies("workers"))
		require.Equal(h.t, []string{"invoices"}, policyQueues(h.policies()))
	}},
	{"policies/a namespace cannot take over a queue another owns", func(h *harness) {
		h.syncPolicies("a", store.ConcurrencyPolicy{Queue: "mail", MaxActive: 2})
		_, err := h.s.SyncConcurrencyPolicies(h.ctx, "b", []store.ConcurrencyPolicy{
			{Queue: "sms", MaxActive: 1}, {Queue: "mail", MaxActive: 100}}, store.SyncOptions{})
		require.ErrorIs(h.t, err, store.ErrNamespaceConflict)
		require.Contains(h.t, err.Error(), `"mail"`)
		require.Contains(h.t, err.Error(), `"a"`, "the error names the owner")
		require.Equal(h.t, []store.ConcurrencyPolicy{{Queue: "mail", Namespace: "a", MaxActive: 2}}, h.policies(),
			"a refused sync stores nothing, not even its other queues")
		// Once the owner lets go, the queue is free to take.
		h.syncPolicies("a")
		h.syncPolicies("b", store.ConcurrencyPolicy{Queue: "mail", MaxActive: 100})
		require.Equal(h.t, []store.ConcurrencyPolicy{{Queue: "mail", Namespace: "b", MaxActive: 100}}, h.policies())
	}},
	{"policies/MaxActive caps the queue across concurrent claimers", func(h *harness) {
		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 3})
		for range 10 {
			h.insert(inst(""))
		}
		other := inst("")
		other.Queue = "other"
		h.insert(other)
		var mu sync.Mutex
		var claimed []store.Claimed
		var wg sync.WaitGroup
		for w := range 3 {
			wg.Go(func() {
				res, err := h.s.Claim(h.ctx, store.ClaimRequest{Queue: queue, Worker: fmt.Sprintf("w%d", w), Limit: 10, Lease: lease, Now: at(time.Second)})
				if err != nil {
					h.t.Errorf("claim: %v", err)
					return
				}
				mu.Lock()
				claimed = append(claimed, res.Claimed...)
				mu.Unlock()
			})
		}
		wg.Wait()
		require.Len(h.t, claimed, 3, "three claimers together admit MaxActive rows")
		require.Len(h.t, h.list(store.ListFilter{Queue: queue, Status: store.StatusReady}), 7, "rows over the budget stay ready")
		require.Empty(h.t, h.claim("w9", 10, at(time.Second)))
		require.Len(h.t, h.claimReq(store.ClaimRequest{Queue: "other", Worker: "w", Limit: 10, Now: at(time.Second)}).Claimed, 1,
			"another queue has its own budget")

		c := claimed[0]
		h.commit(c.Worker, at(2*time.Second), done(c))
		require.Len(h.t, h.claim("w9", 10, at(2*time.Second)), 1, "one row finished: one more starts")
		require.Empty(h.t, h.claim("w9", 10, at(2*time.Second)))

		// A reaped claim no longer counts.
		require.Equal(h.t, 4, h.reap(at(time.Hour)), "three of the queue, one of the other queue")
		require.Len(h.t, h.claim("w9", 10, at(time.Hour)), 3)
	}},
	{"policies/MaxActivePerKey caps each key of the queue", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "tenant", Limit: 10})
		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 10, MaxActivePerKey: 2})
		a := h.insertKeyed("tenant:a", 4)
		b := h.insertKeyed("tenant:b", 3)
		free := h.insertKeyed("", 3)
		cs := h.claim("w", 10, at(time.Second))
		require.ElementsMatch(h.t, append([]string{a[0], a[1], b[0], b[1]}, free...), claimedIDs(cs),
			"two rows per key, and keyless rows use queue capacity only")
		h.requireStatus(store.StatusBlocked, a[2], a[3], b[2])
		require.Equal(h.t, 8, h.keyInfo("tenant:a").Available, "the gate itself has room: the per-key budget blocks")

		// The same key in another queue is independent.
		x := inst("tenant:a")
		x.Queue = "other"
		h.insert(x)
		require.Len(h.t, h.claimReq(store.ClaimRequest{Queue: "other", Worker: "w", Limit: 10, Now: at(time.Second)}).Claimed, 1)

		// A row of a finishes: the next row of a is promoted and admitted.
		for _, c := range cs {
			if c.ID == a[0] {
				h.commit("w", at(2*time.Second), done(c))
			}
		}
		require.Equal(h.t, []string{a[2]}, claimedIDs(h.claim("w", 10, at(2*time.Second))))
		require.Len(h.t, h.list(store.ListFilter{Key: "tenant:a", Queue: queue, Status: store.StatusExecuting}), 2)
	}},
	{"policies/a changed policy applies to the next claim", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "tenant", Limit: 10})
		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 1})
		h.insertKeyed("tenant:a", 6)
		require.Len(h.t, h.claim("w", 10, at(time.Second)), 1)
		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 3})
		require.Len(h.t, h.claim("w", 10, at(time.Second)), 2, "a raised MaxActive admits at once")

		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 10, MaxActivePerKey: 3})
		require.Empty(h.t, h.claim("w", 10, at(time.Second)), "three of tenant:a already execute")
		require.NotEmpty(h.t, h.list(store.ListFilter{Key: "tenant:a", Status: store.StatusBlocked}))
		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 10, MaxActivePerKey: 4})
		require.Len(h.t, h.claim("w", 10, at(time.Second)), 1, "a raised per-key budget admits a blocked row at the next claim")
		h.syncPolicies("ns")
		require.Len(h.t, h.claim("w", 10, at(time.Second)), 2, "without a policy only the key's gate applies")
	}},
	{"health/a queue policy shows its budget, its active rows, even on an empty queue", func(h *harness) {
		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 2, MaxActivePerKey: 1},
			store.ConcurrencyPolicy{Queue: "idle", MaxActive: 7})
		h.insertKeyed("", 3)
		h.claim("w", 10, at(time.Second))
		hl := h.health(at(time.Second))
		q := h.queueHealth(hl, queue)
		require.Equal(h.t, 2, q.MaxActive)
		require.Equal(h.t, 1, q.MaxActivePerKey)
		require.Equal(h.t, int64(2), q.Active)
		require.Equal(h.t, int64(1), q.Ready, "the row over the budget waits ready")
		require.Equal(h.t, store.QueueHealth{Queue: "idle", MaxActive: 7}, h.queueHealth(hl, "idle"))
	}},
	{"health/a full MaxActive reports its ready rows as blocked ready, bounded", func(h *harness) {
		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 2})
		h.insertKeyed("", 5)
		h.insert(onQueue("free", ""))
		q := h.queueHealth(h.health(at(0)), queue)
		require.Equal(h.t, int64(5), q.Ready)
		require.Zero(h.t, q.BlockedReady, "under MaxActive a claim takes ready rows: nothing is held back")

		require.Len(h.t, h.claim("w", 10, at(0)), 2)
		later := inst("")
		later.RunAt = at(time.Hour)
		h.insert(later)
		hl := h.health(at(0))
		q = h.queueHealth(hl, queue)
		require.Equal(h.t, int64(2), q.Active)
		require.Equal(h.t, int64(3), q.Ready)
		require.Equal(h.t, int64(3), q.BlockedReady, "the ready rows wait for MaxActive, not a delayed one")
		require.Zero(h.t, h.queueHealth(hl, "free").BlockedReady, "a queue without a policy holds nothing back")

		more := make([]store.NewInstance, 2*store.BlockedReadyLimit)
		for i := range more {
			more[i] = inst("")
			more[i].RunAt = at(-time.Minute)
		}
		h.insert(more...)
		q = h.queueHealth(h.health(at(0)), queue)
		require.Equal(h.t, int64(3+len(more)), q.Ready)
		require.Equal(h.t, int64(store.BlockedReadyLimit), q.BlockedReady, "counted over at most the first BlockedReadyLimit rows")

		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 3})
		q = h.queueHealth(h.health(at(0)), queue)
		require.Zero(h.t, q.BlockedReady, "a raised MaxActive has room: nothing is held back")
	}},
	{"health/a per-key budget reports its saturated keys, never their ids", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "tenant", Limit: 10})
		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 100, MaxActivePerKey: 2})
		h.insertKeyed("tenant:a", 3)
		h.insertKeyed("tenant:b", 2)
		h.insertKeyed("tenant:c", 1)
		h.insertKeyed("", 1)
		cs := h.claim("w", 20, at(0))
		require.Len(h.t, cs, 6, "two of a, two of b, one of c, the keyless row")
		hl := h.health(at(0))
		q := h.queueHealth(hl, queue)
		require.Equal(h.t, 1, q.SaturatedKeys, "tenant:a is at its budget with a row waiting; tenant:b has none waiting")
		require.False(h.t, q.SaturatedKeysCapped)
		require.Equal(h.t, int64(1), q.Blocked)
		require.Zero(h.t, q.BlockedReady)
		b, err := json.Marshal(hl)
		require.NoError(h.t, err)
		require.NotContains(h.t, string(b), "tenant:", "no key id in health")

		// A new row of tenant:b waits (ready, not yet claimed); a delayed
		// row of tenant:c does not count, nor would it: c is under budget.
		h.insert(inst("tenant:b"))
		later := inst("tenant:c")
		later.RunAt = at(time.Hour)
		h.insert(later)
		require.Equal(h.t, 2, h.queueHealth(h.health(at(0)), queue).SaturatedKeys)

		// The same key in a queue with no per-key budget is not saturated.
		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 100, MaxActivePerKey: 2},
			store.ConcurrencyPolicy{Queue: "other", MaxActive: 5})
		h.insert(onQueue("other", "tenant:a"))
		require.Zero(h.t, h.queueHealth(h.health(at(0)), "other").SaturatedKeys)

		// A holder of tenant:a finishes: under budget, no longer saturated.
		for _, c := range cs {
			if c.Key == "tenant:a" {
				h.commit("w", at(time.Second), done(c))
				break
			}
		}
		require.Equal(h.t, 1, h.queueHealth(h.health(at(time.Second)), queue).SaturatedKeys, "only tenant:b")
	}},
	{"health/saturated policy keys are counted up to the scan limit", func(h *harness) {
		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 10 * store.HealthScanLimit, MaxActivePerKey: 1})
		n := store.HealthScanLimit + 1
		nis := make([]store.NewInstance, 2*n)
		for i := range nis {
			// Two rows per key, due at insert (the store's clock, before
			// base), so no claim has to move thousands of delayed rows.
			nis[i] = inst(fmt.Sprintf("t:%d", i/2))
			nis[i].RunAt = time.Time{}
		}
		h.insert(nis...)
		claimed := 0
		for range 3 { // a backend may cap one claim's size
			claimed += len(h.claim("w", n, at(time.Second)))
		}
		require.Equal(h.t, n, claimed, "one row of each key")
		q := h.queueHealth(h.health(at(time.Second)), queue)
		require.Equal(h.t, store.HealthScanLimit, q.SaturatedKeys)
		require.True(h.t, q.SaturatedKeysCapped)
	}},
	{"health/rate limits report their buckets and the empty ones", func(h *harness) {
		h.syncKeyLimits("ns", store.KeyLimits{
			Limits: []gate.Limit{{Name: "api", Limit: 100}},
			RateLimits: []gate.RateLimit{
				{Name: "api", Limit: 1, Period: time.Minute, Burst: 1, PerKey: true},
				{Name: "mail", Limit: 5},
			}}, store.SyncOptions{})
		require.Equal(h.t, []store.RateHealth{
			{Limit: gate.RateLimit{Name: "api", Limit: 1, Period: time.Minute, Burst: 1, PerKey: true}},
			{Limit: gate.RateLimit{Name: "mail", Limit: 5, Period: time.Second, Burst: 5}},
		}, h.health(at(0)).RateLimits, "no bucket before any claim")
		h.insertKeyed("api:a", 2)
		h.insertKeyed("api:b", 1)
		require.Len(h.t, h.claim("w", 10, at(0)), 2)
		rh := h.health(at(30 * time.Second)).RateLimits[0]
		require.Equal(h.t, 2, rh.Buckets)
		require.Equal(h.t, 2, rh.EmptyBuckets, "both keys spent their token")
		require.False(h.t, rh.BucketsCapped)
		rh = h.health(at(time.Minute)).RateLimits[0]
		require.Zero(h.t, rh.EmptyBuckets, "a minute later each holds a token again")
	}},
	{"limits/namespaces own their key limits", func(h *harness) {
		res := h.syncKeyLimits("a", store.KeyLimits{
			Limits:     []gate.Limit{{Name: "stripe", Limit: 3}},
			RateLimits: []gate.RateLimit{{Name: "stripe", Limit: 10}}}, store.SyncOptions{})
		require.Len(h.t, res.Changes, 1)
		require.Len(h.t, res.RateChanges, 1)
		_, err := h.s.SyncKeyLimits(h.ctx, "b", store.KeyLimits{Limits: []gate.Limit{{Name: "openai", Limit: 2}, {Name: "stripe", Limit: 9}}}, store.SyncOptions{})
		require.ErrorIs(h.t, err, store.ErrNamespaceConflict)
		_, err = h.s.SyncKeyLimits(h.ctx, "b", store.KeyLimits{RateLimits: []gate.RateLimit{{Name: "stripe", Limit: 1}}}, store.SyncOptions{})
		require.ErrorIs(h.t, err, store.ErrNamespaceConflict)
		_, err = h.s.SyncLimits(h.ctx, []gate.Limit{{Name: "stripe", Limit: 1}})
		require.ErrorIs(h.t, err, store.ErrNamespaceConflict, "SyncLimits is the default namespace")
		h.syncKeyLimits("b", store.KeyLimits{Limits: []gate.Limit{{Name: "openai", Limit: 2}}}, store.SyncOptions{})
		h.syncLimits(gate.Limit{Name: "account", Limit: 4})

		got, err := h.s.Limits(h.ctx)
		require.NoError(h.t, err)
		require.Equal(h.t, []gate.Limit{{Name: "account", Limit: 4, Shards: 1}, {Name: "openai", Limit: 2, Shards: 1}, {Name: "stripe", Limit: 3, Shards: 1}}, got)
		rates, err := h.s.RateLimits(h.ctx)
		require.NoError(h.t, err)
		require.Equal(h.t, []gate.RateLimit{{Name: "stripe", Limit: 10, Period: time.Second, Burst: 10}}, rates)

		// KeepOmitted keeps; a plain sync prunes the namespace's own only.
		h.syncKeyLimits("a", store.KeyLimits{Limits: []gate.Limit{{Name: "twilio", Limit: 1}}}, store.SyncOptions{KeepOmitted: true})
		require.Len(h.t, h.limits(), 4)
		h.syncKeyLimits("a", store.KeyLimits{Limits: []gate.Limit{}, RateLimits: []gate.RateLimit{}}, store.SyncOptions{})
		require.Equal(h.t, []string{"account", "openai"}, limitNames(h.limits()))
		rates, err = h.s.RateLimits(h.ctx)
		require.NoError(h.t, err)
		require.Empty(h.t, rates)
		// SyncLimits leaves the default namespace's rate limits alone.
		h.syncKeyLimits(store.DefaultNamespace, store.KeyLimits{
			Limits: []gate.Limit{{Name: "account", Limit: 4}}, RateLimits: []gate.RateLimit{{Name: "account", Limit: 1}}}, store.SyncOptions{})
		h.syncLimits()
		rates, err = h.s.RateLimits(h.ctx)
		require.NoError(h.t, err)
		require.Len(h.t, rates, 1)
		require.Equal(h.t, []string{"openai"}, limitNames(h.limits()))
	}},
	{"sync/a dry run reports and stores nothing", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		h.insertKeyed("stripe:a", 1)
		dry := store.SyncOptions{DryRun: true}
		res := h.syncKeyLimits(store.DefaultNamespace, store.KeyLimits{
			Limits: []gate.Limit{{Name: "stripe", Limit: 5}}, RateLimits: []gate.RateLimit{{Name: "stripe", Limit: 1}}}, dry)
		require.Equal(h.t, []gate.Change{{Name: "stripe", OldK: 2, NewK: 5, OldSet: true, NewSet: true}}, res.Changes)
		require.Len(h.t, res.RateChanges, 1)
		require.Equal(h.t, map[string]int64{"stripe": 1}, res.Live)
		require.Equal(h.t, []gate.Limit{{Name: "stripe", Limit: 2, Shards: 1}}, h.limits())
		rates, err := h.s.RateLimits(h.ctx)
		require.NoError(h.t, err)
		require.Empty(h.t, rates)
		_, err = h.s.SyncKeyLimits(h.ctx, "other", store.KeyLimits{Limits: []gate.Limit{{Name: "stripe", Limit: 1}}}, dry)
		require.ErrorIs(h.t, err, store.ErrNamespaceConflict, "a dry run reports conflicts too")

		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: "a", MaxActive: 1})
		got, err := h.s.SyncConcurrencyPolicies(h.ctx, "ns", []store.ConcurrencyPolicy{{Queue: "b", MaxActive: 2}}, dry)
		require.NoError(h.t, err)
		require.Equal(h.t, []store.ConcurrencyPolicy{{Queue: "b", Namespace: "ns", MaxActive: 2}}, got, "what the sync would store")
		require.Equal(h.t, []string{"a"}, policyQueues(h.policies()))
	}},
	{"sync/a nil kind of limits is left as stored, an empty one is removed", func(h *harness) {
		h.syncKeyLimits("ns", store.KeyLimits{Limits: []gate.Limit{{Name: "api", Limit: 3}},
			RateLimits: []gate.RateLimit{{Name: "api", Limit: 5, Period: time.Minute}}}, store.SyncOptions{})
		res := h.syncKeyLimits("ns", store.KeyLimits{}, store.SyncOptions{})
		require.Empty(h.t, res.Changes)
		require.Empty(h.t, res.RateChanges)
		require.Equal(h.t, []string{"api"}, limitNames(h.limits()), "nil limits: left alone")
		h.syncKeyLimits("ns", store.KeyLimits{Limits: []gate.Limit{}}, store.SyncOptions{})
		require.Empty(h.t, h.limits(), "an empty set removes the namespace's limits")
		rates, err := h.s.RateLimits(h.ctx)
		require.NoError(h.t, err)
		require.Len(h.t, rates, 1, "nil rate limits: left alone")
		h.syncKeyLimits("ns", store.KeyLimits{RateLimits: []gate.RateLimit{}}, store.SyncOptions{})
		rates, err = h.s.RateLimits(h.ctx)
		require.NoError(h.t, err)
		require.Empty(h.t, rates)
	}},
	{"health/a sync that changed live keys is reported with its count, to everyone", func(h *harness) {
		h.insertKeyed("order:1", 2)
		h.insertKeyed("order:2", 1)
		h.insertKeyed("idle:1", 1)
		res := h.syncKeyLimits("ns", store.KeyLimits{Limits: []gate.Limit{{Name: "order", Limit: 5}, {Name: "spare", Limit: 2}},
			RateLimits: []gate.RateLimit{{Name: "order", Limit: 10, Period: time.Second}}}, store.SyncOptions{})
		require.Equal(h.t, int64(3), res.Live["order"])
		var live []gate.Warning
		for _, w := range h.health(time.Time{}).Warnings {
			if w.Kind == gate.LiveKeysChanged {
				live = append(live, w)
			}
		}
		require.Len(h.t, live, 1, "one warning per name, for the change that altered live keys")
		require.Contains(h.t, live[0].Message, "rate limit", "both of the name's changes are named")
		require.Equal(h.t, "order", live[0].Name)
		require.Equal(h.t, int64(3), live[0].Live)
		require.Contains(h.t, live[0].Message, "from 1 to 5")
		h.syncKeyLimits("ns", store.KeyLimits{Limits: []gate.Limit{{Name: "spare", Limit: 2}}}, store.SyncOptions{DryRun: true})
		for _, w := range h.health(time.Time{}).Warnings {
			if w.Kind == gate.LiveKeysChanged {
				require.Equal(h.t, int64(3), w.Live, "a dry run records nothing")
			}
		}
	}},
	{"limits/a change counts the live instances of a name or key up to the cap", func(h *harness) {
		// Each count stops at gate.LiveCountCap, in either position: half
		// the rows hold a stripe key in the key column, half beside an
		// account; stripe:hot alone has one more than the cap, and
		// stripe:cold a few.
		half := gate.LiveCountCap / 2
		var nis []store.NewInstance
		for i := range half + 1 {
			nis = append(nis, inst("stripe:hot"))
			ni := inst(fmt.Sprintf("acct:%d", i))
			ni.Also = []store.KeyRef{{Key: "stripe:hot", Intent: gate.GateIntent}}
			nis = append(nis, ni)
		}
		nis = append(nis, inst("stripe:cold"), inst("stripe:cold"))
		for len(nis) > 0 {
			n := min(len(nis), 1000)
			h.insert(nis[:n]...)
			nis = nis[n:]
		}
		res := h.syncLimits(gate.Limit{Name: "stripe", Limit: 3}, gate.Limit{Name: "stripe:cold", Limit: 2})
		require.Equal(h.t, map[string]int64{"stripe": gate.LiveCountCap, "stripe:cold": 2}, res.Live)
		res = h.syncLimits(gate.Limit{Name: "stripe", Limit: 3}, gate.Limit{Name: "stripe:hot", Limit: 5})
		require.Equal(h.t, map[string]int64{"stripe:hot": gate.LiveCountCap, "stripe:cold": 2}, res.Live,
			"stripe:cold's own limit is gone: it runs under its name's again")
		var msgs []string
		for _, w := range h.health(time.Time{}).Warnings {
			if w.Kind == gate.LiveKeysChanged {
				msgs = append(msgs, w.Message)
			}
		}
		require.Contains(h.t, strings.Join(msgs, "\n"), fmt.Sprintf("for at least %d live instance(s)", gate.LiveCountCap))
	}},
	{"rate/sync reports changes and the live instances they affect", func(h *harness) {
		h.insertKeyed("api:1", 2)
		h.insertKeyed("other:1", 1)
		res := h.syncKeyLimits("ns", store.KeyLimits{RateLimits: []gate.RateLimit{{Name: "api", Limit: 5, Period: time.Minute}}}, store.SyncOptions{})
		require.Empty(h.t, res.Changes)
		require.Equal(h.t, []gate.RateChange{{Name: "api", New: gate.RateLimit{Name: "api", Limit: 5, Period: time.Minute, Burst: 5}, NewSet: true}}, res.RateChanges)
		require.Equal(h.t, map[string]int64{"api": 2}, res.Live, "a new rate limit captures a name in use")
		res = h.syncKeyLimits("ns", store.KeyLimits{RateLimits: []gate.RateLimit{{Name: "api", Limit: 5, Period: time.Minute}}}, store.SyncOptions{})
		require.Empty(h.t, res.RateChanges, "the same limits again change nothing")
		_, err := h.s.SyncKeyLimits(h.ctx, "ns", store.KeyLimits{RateLimits: []gate.RateLimit{{Name: "api", Limit: 0}}}, store.SyncOptions{})
		require.Error(h.t, err)
		rates, err := h.s.RateLimits(h.ctx)
		require.NoError(h.t, err)
		require.Len(h.t, rates, 1, "an invalid sync stores nothing")
	}},
	{"rate/a bucket per name admits its burst, then one token per interval", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "api", Limit: 100})
		h.syncKeyLimits("ns", store.KeyLimits{RateLimits: []gate.RateLimit{{Name: "api", Limit: 2, Period: time.Second, Burst: 3}}}, store.SyncOptions{})
		var ids []string
		for i := range 6 {
			ids = append(ids, h.insertKeyed(fmt.Sprintf("api:%d", i), 1)...)
		}
		t0 := at(time.Minute)
		res := h.claimReq(store.ClaimRequest{Worker: "w", Limit: 10, Now: t0})
		require.Equal(h.t, ids[:3], claimedIDs(res.Claimed), "the burst, across keys: one bucket for the name")
		require.WithinDuration(h.t, t0.Add(500*time.Millisecond), res.NextDue, 0, "the next token is due in half a second")
		for i, id := range ids[3:] {
			in := h.get(id)
			require.Equal(h.t, store.StatusReady, in.Status, "a row without a token stays ready")
			require.WithinDuration(h.t, t0.Add(time.Duration(i+1)*500*time.Millisecond), in.RunAt, 0, "rescheduled to when its token is due")
		}
		require.Empty(h.t, h.claim("w", 10, t0.Add(499*time.Millisecond)))
		require.Equal(h.t, []string{ids[3]}, claimedIDs(h.claim("w", 10, t0.Add(500*time.Millisecond))))
		require.Equal(h.t, ids[4:], claimedIDs(h.claim("w", 10, t0.Add(1500*time.Millisecond))), "tokens earned while idle")
	}},
	{"rate/a bucket per key limits each key separately", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "api", Limit: 100})
		h.syncKeyLimits("ns", store.KeyLimits{RateLimits: []gate.RateLimit{{Name: "api", Limit: 1, Period: time.Minute, Burst: 2, PerKey: true}}}, store.SyncOptions{})
		a := h.insertKeyed("api:a", 3)
		b := h.insertKeyed("api:b", 3)
		cs := h.claim("w", 10, at(time.Second))
		require.ElementsMatch(h.t, []string{a[0], a[1], b[0], b[1]}, claimedIDs(cs), "each key has its own burst of 2")
		require.Empty(h.t, h.claim("w", 10, at(30*time.Second)))
		require.ElementsMatch(h.t, []string{a[2], b[2]}, claimedIDs(h.claim("w", 10, at(time.Minute+time.Second))))
	}},
	{"rate/limits compose: no debit for a row another limit refused", func(h *harness) {
		h.syncKeyLimits(store.DefaultNamespace, store.KeyLimits{
			Limits:     []gate.Limit{{Name: "stripe", Limit: 1}},
			RateLimits: []gate.RateLimit{{Name: "stripe", Limit: 1, Period: time.Hour, Burst: 2}}}, store.SyncOptions{})
		a := h.insertKeyed("stripe:a", 2)
		b := h.insertKeyed("stripe:b", 1)
		cs := h.claim("w", 10, at(time.Second))
		require.ElementsMatch(h.t, []string{a[0], b[0]}, claimedIDs(cs),
			"the row the gate refused took no token, or stripe:b would have found the bucket empty")
		h.requireStatus(store.StatusBlocked, a[1])

		c := h.insertKeyed("stripe:c", 1)
		require.Empty(h.t, h.claim("w", 10, at(2*time.Second)), "the bucket is empty")
		require.Equal(h.t, 1, h.available("stripe:c"), "the row the rate limit refused took no gate slot")
		h.requireStatus(store.StatusReady, c[0])

		// stripe:a's holder finishes: its next row is promoted, refused a
		// token, and leaves the key's slot free.
		for _, cl := range cs {
			if cl.ID == a[0] {
				h.commit("w", at(3*time.Second), done(cl))
			}
		}
		require.Empty(h.t, h.claim("w", 10, at(3*time.Second)))
		require.Equal(h.t, 1, h.available("stripe:a"))
		require.Equal(h.t, store.StatusReady, h.status(a[1]))
	}},
	{"rate/a queue at MaxActive takes no token", func(h *harness) {
		h.syncKeyLimits(store.DefaultNamespace, store.KeyLimits{
			Limits:     []gate.Limit{{Name: "api", Limit: 100}},
			RateLimits: []gate.RateLimit{{Name: "api", Limit: 1, Period: time.Hour, Burst: 2}}}, store.SyncOptions{})
		h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 1})
		h.insertKeyed("api:x", 3)
		for i := range 2 {
			now := at(time.Duration(i+1) * time.Second)
			cs := h.claim("w", 10, now)
			require.Len(h.t, cs, 1, "claim %d: rows refused by MaxActive took no token", i)
			h.commit("w", now, done(cs[0]))
		}
		require.Empty(h.t, h.claim("w", 10, at(3*time.Second)), "the burst of 2 is spent")
	}},
	{"rate/idle buckets are collected without an unearned burst", func(h *harness) {
		h.syncKeyLimits(store.DefaultNamespace, store.KeyLimits{
			Limits:     []gate.Limit{{Name: "api", Limit: 100}},
			RateLimits: []gate.RateLimit{{Name: "api", Limit: 1, Period: 10 * time.Second, Burst: 2}}}, store.SyncOptions{})
		h.insertKeyed("api:x", 6)
		require.Len(h.t, h.claim("w", 10, at(0)), 2)
		require.Zero(h.t, h.reconcile(0, at(5*time.Second)).BucketsDeleted, "a bucket that is not full is kept")
		require.Len(h.t, h.claim("w", 10, at(10*time.Second)), 1, "one token earned in 10s, not a fresh burst")
		require.Equal(h.t, 1, h.reconcile(0, at(30*time.Second)).BucketsDeleted, "full again: collected")
		require.Len(h.t, h.claim("w", 10, at(30*time.Second)), 2, "a new bucket starts full: the burst was earned")
	}},
	{"rate/a removed rate limit stops throttling and its buckets are collected", func(h *harness) {
		h.syncKeyLimits(store.DefaultNamespace, store.KeyLimits{
			Limits:     []gate.Limit{{Name: "api", Limit: 100}},
			RateLimits: []gate.RateLimit{{Name: "api", Limit: 1, Period: time.Hour, Burst: 1, PerKey: true}}}, store.SyncOptions{})
		h.insertKeyed("api:x", 3)
		require.Len(h.t, h.claim("w", 10, at(0)), 1)
		h.syncKeyLimits(store.DefaultNamespace, store.KeyLimits{Limits: []gate.Limit{{Name: "api", Limit: 100}}, RateLimits: []gate.RateLimit{}}, store.SyncOptions{})
		require.Len(h.t, h.claim("w", 10, at(2*time.Hour)), 2, "rescheduled rows run once due, unthrottled")
		require.Zero(h.t, h.reconcile(0, at(time.Hour)).BucketsDeleted, "the sync already dropped the name's buckets")
	}},
	{"rate/concurrent claimers admit at most R×T + burst", func(h *harness) {
		const (
			rate  = 20
			burst = 5
			span  = 10 * time.Second
			step  = 50 * time.Millisecond
		)
		h.syncKeyLimits(store.DefaultNamespace, store.KeyLimits{
			Limits:     []gate.Limit{{Name: "api", Limit: 1000}},
			RateLimits: []gate.RateLimit{{Name: "api", Limit: rate, Burst: burst}}}, store.SyncOptions{})
		nis := make([]store.NewInstance, 400)
		for i := range nis {
			nis[i] = inst(fmt.Sprintf("api:%d", i%7))
			nis[i].RunAt = at(0)
		}
		h.insert(nis...)
		var mu sync.Mutex
		admitted := 0
		for t := time.Duration(0); t <= span; t += step {
			var wg sync.WaitGroup
			for w := range 3 {
				wg.Go(func() {
					worker := fmt.Sprintf("w%d", w)
					res, err := h.s.Claim(h.ctx, store.ClaimRequest{Queue: queue, Worker: worker, Limit: 4, Lease: lease, Now: at(t)})
					if err != nil {
						h.t.Errorf("claim: %v", err)
						return
					}
					outs := make([]store.Outcome, len(res.Claimed))
					for i, c := range res.Claimed {
						outs[i] = done(c)
					}
					if len(outs) > 0 {
						if _, err := h.s.Complete(h.ctx, worker, outs, at(t)); err != nil {
							h.t.Errorf("complete: %v", err)
						}
					}
					mu.Lock()
					admitted += len(res.Claimed)
					mu.Unlock()
				})
			}
			wg.Wait()
		}
		limit := rate*int(span/time.Second) + burst
		require.LessOrEqual(h.t, admitted, limit)
		require.GreaterOrEqual(h.t, admitted, limit-rate/2, "the limit is reached, not just respected")
	}},
	{"fairness/keys take turns within a priority, a gate key as many a round as its limit", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "tenant", Limit: 3})
		nis := make([]store.NewInstance, 9)
		for i := range nis {
			nis[i] = inst("tenant:a")
			nis[i].RunAt = at(0)
		}
		a := h.insert(nis...)
		b := inst("tenant:b")
		b.RunAt = at(time.Second)
		h.insert(b)
		c := inst("")
		c.RunAt = at(2 * time.Second)
		h.insert(c)
		urgent := inst("tenant:a")
		urgent.Priority, urgent.RunAt = -1, at(3*time.Second)
		h.insert(urgent)

		// Each row runs to its end before the next claim, so the gate
		// never binds: the order is the claim order alone.
		run := func(n int) []string {
			var ids []string
			for range n {
				cl := h.claimOne("w", at(time.Minute))
				h.commit("w", at(time.Minute), done(cl))
				ids = append(ids, cl.ID)
			}
			return ids
		}
		require.Equal(h.t, []string{urgent.ID, a[0], a[1], a[2], b.ID, c.ID}, run(6),
			"priority first; then tenant:a's three turns of the first round (its limit), tenant:b's only row and the keyless row")
		require.Equal(h.t, []string{a[3]}, run(1), "tenant:a's backlog, three rows a round, in FIFO order")

		// A late arrival of a key with no row waiting takes the open round,
		// ahead of the backlog's turns.
		d := inst("tenant:d")
		d.RunAt = at(30 * time.Second)
		h.insert(d)
		require.Equal(h.t, []string{d.ID, a[4], a[5], a[6]}, run(4))
	}},
	{"fairness/a new row goes ahead of a turn round of many keys", func(h *harness) {
		// Five K = 1 keys with a row running and one waiting, each in the
		// same turn round: behind thousands of keys with a backlog, such a
		// round holds a row of each. A keyless row and a row of a new key
		// made ready then take the open round, before it, rather than wait
		// for every key's turn.
		var waiting []string
		for k := range 5 {
			ids := h.insertKeyed(fmt.Sprintf("acct:%d", k), 2)
			waiting = append(waiting, ids[1])
		}
		running := h.claim("w", 10, at(time.Second))
		require.Len(h.t, running, 5, "the first row of each key")
		for _, c := range running {
			h.commit("w", at(2*time.Second), done(c))
		}
		plain, fresh := inst(""), inst("acct:new")
		plain.RunAt, fresh.RunAt = at(5*time.Second), at(5*time.Second) // after the waiting rows' run_at
		h.insertSeq(plain, fresh)
		var got []string
		for range 7 {
			cl := h.claimOne("w", at(time.Minute))
			h.commit("w", at(time.Minute), done(cl))
			got = append(got, cl.ID)
		}
		require.Equal(h.t, append([]string{plain.ID, fresh.ID}, waiting...), got)
	}},
	{"fairness/a K = 1 key takes one turn a round", func(h *harness) {
		a := h.insertKeyed("acct:a", 3)
		b := inst("acct:b")
		b.RunAt = at(time.Second)
		h.insert(b)
		var got []string
		for range 4 {
			cl := h.claimOne("w", at(time.Minute))
			h.commit("w", at(time.Minute), done(cl))
			got = append(got, cl.ID)
		}
		require.Equal(h.t, []string{a[0], b.ID, a[1], a[2]}, got, "acct:b's row comes in the first round, after acct:a's first")
	}},
	{"fairness/rows of one key stay FIFO when they become ready again", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "tenant", Limit: 10})
		ids := h.insertKeyed("tenant:a", 3)
		first := h.claimOne("w", at(time.Second))
		require.Equal(h.t, ids[0], first.ID)
		h.commit("w", at(2*time.Second), next(first, "two"))
		require.Equal(h.t, []string{ids[1], ids[2], ids[0]}, claimedIDs(h.claim("w", 3, at(3*time.Second))),
			"a row ready again runs after the key's earlier rows")
	}},
}

func policyQueues(ps []store.ConcurrencyPolicy) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Queue
	}
	return out
}

func (h *harness) limits() []gate.Limit {
	h.t.Helper()
	got, err := h.s.Limits(h.ctx)
	require.NoError(h.t, err)
	return got
}

func limitNames(ls []gate.Limit) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Name
	}
	return out
}
