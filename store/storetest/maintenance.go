package storetest

import (
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

var maintenanceTests = []test{
	{"lease/one holder at a time; its holder renews it; another takes it once expired", func(h *harness) {
		got := func(holder string, ttl time.Duration, now time.Time) bool {
			ok, err := h.s.AcquireLease(h.ctx, store.MaintenanceLease, holder, ttl, now)
			require.NoError(h.t, err)
			return ok
		}
		require.True(h.t, got("a", time.Minute, at(0)), "a free lease is taken")
		require.False(h.t, got("b", time.Minute, at(30*time.Second)), "a held lease is refused")
		require.True(h.t, got("a", time.Minute, at(50*time.Second)), "its holder renews it")
		require.False(h.t, got("b", time.Minute, at(100*time.Second)), "renewed: still held until 110 s")
		require.True(h.t, got("b", time.Minute, at(111*time.Second)), "expired: another engine takes it")
		require.False(h.t, got("a", time.Minute, at(112*time.Second)), "the old holder does not get it back")
		ok, err := h.s.AcquireLease(h.ctx, "other", "a", time.Minute, at(112*time.Second))
		require.NoError(h.t, err)
		require.True(h.t, ok, "leases are independent by name")
		_, err = h.s.AcquireLease(h.ctx, "", "a", time.Minute, at(0))
		require.ErrorIs(h.t, err, store.ErrInvalid)
	}},
	{"reconcile/counters equal capacity minus executing rows", func(h *harness) {
		lim := gate.Limit{Name: "stripe", Limit: 5, Shards: 2}
		h.syncLimits(lim)
		h.insertKeyed("stripe:a", 4)
		cs := h.claim("w", 4, at(0))
		require.Len(h.t, cs, 4)
		// Keep two claims alive; the other two are reaped without credit.
		hb, err := h.s.Heartbeat(h.ctx, "w", []store.ClaimRef{ref(cs[0]), ref(cs[1])}, time.Hour, at(time.Second))
		require.NoError(h.t, err)
		require.Empty(h.t, hb.Lost)
		require.Equal(h.t, 2, h.reap(at(2*lease)))
		require.Equal(h.t, 1, h.available("stripe:a"))

		rep := h.reconcile(0, at(3*lease))
		require.Positive(h.t, rep.CountersRepaired)
		require.Equal(h.t, 2, rep.Drift)
		require.Equal(h.t, 3, h.available("stripe:a"), "capacity 5 − 2 executing")
		requireShards(h, "stripe:a", lim.ShardCapacities())

		rep = h.reconcile(0, at(4*lease))
		require.Zero(h.t, rep.CountersRepaired, "a second sweep finds nothing to repair")
		require.Zero(h.t, rep.Drift)
	}},
	{"reconcile/promotes blocked rows whose key has room", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 1})
		ids := h.insertKeyed("stripe:a", 2)
		cs := h.claim("w", 10, at(0))
		require.Equal(h.t, ids[:1], claimedIDs(cs))
		h.requireStatus(store.StatusBlocked, ids[1])
		require.Equal(h.t, 1, h.reap(at(2*lease)))
		require.NoError(h.t, h.s.Cancel(h.ctx, ids[0], at(2*lease)))
		h.requireStatus(store.StatusBlocked, ids[1])

		rep := h.reconcile(0, at(3*lease))
		require.Equal(h.t, 1, rep.CountersRepaired)
		require.Equal(h.t, 1, rep.Promoted)
		h.requireStatus(store.StatusReady, ids[1])
		require.Equal(h.t, ids[1:], claimedIDs(h.claim("w", 10, at(3*lease))))
	}},
	{"reconcile/retention deletes old terminal rows", func(h *harness) {
		old := h.insert(inst(""))[0]
		h.commit("w", at(time.Second), done(h.claimOne("w", at(0))))
		recent := h.insert(inst(""))[0]
		c := h.claimOne("w", at(2*time.Hour))
		h.commit("w", at(2*time.Hour), store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeFailed, Error: "x"})
		live := h.insert(inst(""))[0]

		require.Zero(h.t, h.reconcile(0, at(100*time.Hour)).InstancesDeleted, "retention 0 keeps everything")
		rep := h.reconcile(time.Hour, at(2*time.Hour+30*time.Minute))
		require.Equal(h.t, 1, rep.InstancesDeleted)
		_, err := h.s.Get(h.ctx, old)
		require.ErrorIs(h.t, err, store.ErrNotFound)
		h.requireStatus(store.StatusFailed, recent)
		h.requireStatus(store.StatusReady, live)
	}},
	{"retention/a workflow's own retention deletes its oldest terminal rows, a chunk a call", func(h *harness) {
		var ids []string
		for _, wf := range []string{"a", "a", "a", "b", "a"} {
			ni := inst("")
			ni.Workflow = wf
			ids = append(ids, h.insert(ni)[0])
		}
		for i, sec := range []int{1, 2, 3, 1} { // the last "a" stays ready
			c := h.claimOne("w", at(0))
			require.Equal(h.t, ids[i], c.ID)
			h.commit("w", at(time.Duration(sec)*time.Second), done(c))
		}
		n, last, err := h.s.DeleteTerminal(h.ctx, "a", time.Time{}, at(10*time.Second), 2)
		require.NoError(h.t, err)
		require.Equal(h.t, 2, n, "the chunk")
		require.True(h.t, last.Equal(at(2*time.Second)), "the chunk's last row changed at 2 s, not %v", last)
		for _, id := range ids[:2] {
			_, err := h.s.Get(h.ctx, id)
			require.ErrorIs(h.t, err, store.ErrNotFound, "the oldest go first")
		}
		n, _, err = h.s.DeleteTerminal(h.ctx, "a", last, at(3*time.Second), 10)
		require.NoError(h.t, err)
		require.Zero(h.t, n, "changed at the cutoff, not before")
		n, same, err := h.s.DeleteTerminal(h.ctx, "a", at(4*time.Second), at(10*time.Second), 10)
		require.NoError(h.t, err)
		require.Zero(h.t, n, "changed before from")
		require.True(h.t, same.Equal(at(4*time.Second)), "a call that deletes nothing returns from, not %v", same)
		n, last, err = h.s.DeleteTerminal(h.ctx, "a", last, at(10*time.Second), 10)
		require.NoError(h.t, err)
		require.Equal(h.t, 1, n)
		require.True(h.t, last.Equal(at(3*time.Second)), "not %v", last)
		h.requireStatus(store.StatusDone, ids[3])
		h.requireStatus(store.StatusReady, ids[4])
	}},
	{"reconcile/deletes idle counters", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2, Shards: 2})
		h.insertKeyed("stripe:a", 1)
		h.insertKeyed("stripe:b", 1)
		cs := h.claim("w", 2, at(0))
		require.Len(h.t, cs, 2)
		for _, c := range cs {
			if c.Key == "stripe:a" {
				h.commit("w", at(time.Second), done(c))
			}
		}
		rep := h.reconcile(0, at(time.Minute))
		require.Equal(h.t, 2, rep.CountersDeleted, "stripe:a's two shards are idle; stripe:b is in use")
		require.Zero(h.t, h.reconcile(0, at(2*time.Minute)).CountersDeleted)
		require.Equal(h.t, 2, h.available("stripe:a"))
		require.Equal(h.t, 1, h.available("stripe:b"))
	}},
	{"limits/sync reports changes and live instances; limits round-trip", func(h *harness) {
		res := h.syncLimits(gate.Limit{Name: "stripe", Limit: 3})
		require.Equal(h.t, []gate.Change{{Name: "stripe", OldK: 1, NewK: 3, NewSet: true}}, res.Changes)
		require.Zero(h.t, res.Live["stripe"])

		finished := h.insertKeyed("account:2", 1)[0]
		c := h.claimOne("w", at(0))
		require.Equal(h.t, finished, c.ID)
		h.commit("w", at(time.Second), done(c))
		h.insertKeyed("stripe:a", 2)
		h.insertKeyed("account:1", 1)
		h.insertKeyed("other:1", 1)

		res = h.syncLimits(gate.Limit{Name: "stripe", Limit: 5, Shards: 2}, gate.Limit{Name: "account", Limit: 2})
		require.Equal(h.t, []gate.Change{
			{Name: "account", OldK: 1, NewK: 2, NewSet: true},
			{Name: "stripe", OldK: 3, NewK: 5, OldSet: true, NewSet: true},
		}, res.Changes)
		require.Equal(h.t, map[string]int64{"account": 1, "stripe": 2}, res.Live,
			"live counts non-terminal instances of changed names only")

		got, err := h.s.Limits(h.ctx)
		require.NoError(h.t, err)
		require.Equal(h.t, []gate.Limit{{Name: "account", Limit: 2, Shards: 1}, {Name: "stripe", Limit: 5, Shards: 2}}, got)

		res = h.syncLimits(gate.Limit{Name: "account", Limit: 2}, gate.Limit{Name: "stripe", Limit: 5, Shards: 2})
		require.Empty(h.t, res.Changes, "the same limits again change nothing")

		_, err = h.s.SyncLimits(h.ctx, []gate.Limit{{Name: "bad", Limit: 0}})
		require.Error(h.t, err)
		got, err = h.s.Limits(h.ctx)
		require.NoError(h.t, err)
		require.Len(h.t, got, 2, "an invalid sync stores nothing")
	}},
	{"limits/a lowered limit applies to the next claim", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 4})
		ids := h.insertKeyed("stripe:a", 6)
		require.Len(h.t, h.claim("w", 2, at(0)), 2)
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		require.Empty(h.t, h.claim("w", 10, at(time.Second)), "two already execute under the new limit 2")
		require.Equal(h.t, 2, h.keyInfo("stripe:a").K)
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 3})
		h.reconcile(0, at(2*time.Second))
		require.Equal(h.t, []string{ids[2]}, claimedIDs(h.claim("w", 10, at(3*time.Second))))
	}},
	{"limits/a lowered limit holds while earlier rows finish", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 4, Shards: 2})
		h.insertKeyed("stripe:a", 8)
		cs := h.claim("w", 4, at(0))
		require.Len(h.t, cs, 4)
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 1})
		for i, c := range cs {
			now := at(time.Duration(i+1) * time.Second)
			h.commit("w", now, done(c))
			got := h.claim("w", 10, now)
			if i < 3 {
				require.Empty(h.t, got, "after %d of 4 finished, %d still execute under limit 1", i+1, 3-i)
				require.Zero(h.t, h.available("stripe:a"))
			} else {
				require.Len(h.t, got, 1, "the last earlier row finished: one slot")
			}
		}
		require.Len(h.t, h.executing("stripe:a"), 1)
	}},
	{"limits/a new shard count never over-admits", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 4})
		h.insertKeyed("stripe:a", 8)
		cs := h.claim("w", 4, at(0))
		require.Len(h.t, cs, 4)
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 4, Shards: 4})
		require.Empty(h.t, h.claim("w", 10, at(time.Second)), "four execute: the resharded key is full")
		require.Zero(h.t, h.available("stripe:a"))
		h.commit("w", at(2*time.Second), done(cs[0]))
		require.Len(h.t, h.claim("w", 10, at(2*time.Second)), 1)
		require.Len(h.t, h.executing("stripe:a"), 4)
	}},
	{"limits/lowering a limit and its shards under executing rows leaves no drift", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 10, Shards: 4})
		h.insertKeyed("stripe:a", 20)
		cs := h.claim("w", 10, at(0))
		require.Len(h.t, cs, 10)
		lowered := gate.Limit{Name: "stripe", Limit: 6, Shards: 3}
		h.syncLimits(lowered)
		require.Empty(h.t, h.claim("w", 10, at(time.Second)), "ten execute under the new limit 6")
		require.Zero(h.t, h.available("stripe:a"))

		// Four finish: six still execute, the key is exactly full.
		for i, c := range cs[:4] {
			h.commit("w", at(time.Duration(2+i)*time.Second), done(c))
		}
		require.Empty(h.t, h.claim("w", 10, at(10*time.Second)), "six execute under limit 6")
		require.Zero(h.t, h.available("stripe:a"))
		rep := h.reconcile(0, at(11*time.Second))
		require.Zero(h.t, rep.Drift, "no crash happened: nothing to repair while rows finish")
		require.Zero(h.t, rep.CountersRepaired)

		// The rest finish: the key's counters are the new limit's, all free.
		for i, c := range cs[4:] {
			h.commit("w", at(time.Duration(12+i)*time.Second), done(c))
		}
		info := h.keyInfo("stripe:a")
		require.Equal(h.t, 6, info.K)
		require.Equal(h.t, 3, info.Shards)
		require.Equal(h.t, 6, info.Available, "the new limit, no more: no phantom slot of the old shape")
		rep = h.reconcile(0, at(time.Minute))
		require.Zero(h.t, rep.Drift, "no crash happened: the counters match the executing rows")
		require.Zero(h.t, rep.CountersRepaired)

		more := h.claim("w", 20, at(2*time.Minute))
		require.Len(h.t, more, 6, "the lowered limit, fully usable")
		requireShards(h, "stripe:a", lowered.ShardCapacities())
		require.Zero(h.t, h.available("stripe:a"))
	}},
}
