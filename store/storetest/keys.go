package storetest

import (
	"fmt"
	"sync"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

var keyTests = []test{
	{"keys/K=1 admits one row per key in one batch", func(h *harness) {
		ids := h.insertKeyed("account:1", 2)
		cs := h.claim("w", 10, at(time.Second))
		require.Equal(h.t, []string{ids[0]}, claimedIDs(cs))
		require.NotEqual(h.t, store.StatusExecuting, h.status(ids[1]))
	}},
	{"keys/K=1 admits one row per key across concurrent claims", func(h *harness) {
		const rounds = 20
		for round := range rounds {
			k := fmt.Sprintf("account:%d", round)
			h.insertKeyed(k, 2)
			var wg sync.WaitGroup
			counts := make([]int, 2)
			for w := range 2 {
				wg.Go(func() {
					res, err := h.s.Claim(h.ctx, store.ClaimRequest{Queue: queue, Worker: fmt.Sprintf("w%d", w), Limit: 10, Lease: lease, Now: at(time.Second)})
					if err == nil {
						counts[w] = len(res.Claimed)
					} else {
						h.t.Errorf("claim: %v", err)
					}
				})
			}
			wg.Wait()
			require.Equal(h.t, 1, counts[0]+counts[1], "round %d: rows of one key claimed by two concurrent claims", round)
			require.Len(h.t, h.executing(k), 1)
			// Free the key for the next round.
			ex := h.executing(k)[0]
			h.commit(ex.Worker, at(time.Second), store.Outcome{ID: ex.ID, Fence: ex.Fence, Kind: store.OutcomeDone})
			cs := h.claim("w", 10, at(time.Second))
			require.Len(h.t, cs, 1)
			h.commit("w", at(time.Second), done(cs[0]))
		}
	}},
	{"keys/a claim counts the keyed rows it passed over", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 1})
		free := h.insertKeyed("", 2)
		one := h.insertKeyed("account:1", 2)
		gated := h.insertKeyed("stripe:eu", 2)
		other := h.insertKeyed("account:2", 1)
		res := h.claimReq(store.ClaimRequest{Queue: queue, Worker: "w", Limit: 10, Lease: lease, Now: at(time.Second)})
		require.ElementsMatch(h.t, []string{free[0], free[1], one[0], gated[0], other[0]}, claimedIDs(res.Claimed))
		require.Equal(h.t, 2, res.PassedOver, "the second rows of the K = 1 key and of the full gate")
	}},
	{"keys/a claim of rows with room passes none over, nor counts the rows beyond its limit", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		h.insertKeyed("", 1)
		h.insertKeyed("account:1", 1)
		h.insertKeyed("stripe:eu", 2)
		h.insertKeyed("account:2", 1)
		res := h.claimReq(store.ClaimRequest{Queue: queue, Worker: "w", Limit: 10, Lease: lease, Now: at(time.Second)})
		require.Len(h.t, res.Claimed, 5)
		require.Zero(h.t, res.PassedOver)
		h.insertKeyed("account:3", 3)
		res = h.claimReq(store.ClaimRequest{Queue: queue, Worker: "w", Limit: 1, Lease: lease, Now: at(2 * time.Second)})
		require.Len(h.t, res.Claimed, 1)
		require.Zero(h.t, res.PassedOver, "the key's other rows lie beyond the claim's limit")
	}},
	{"keys/an outcome says whether a row waits for the slot it freed", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 1})
		free := h.insertKeyed("", 1)
		gated := h.insertKeyed("stripe:eu", 2)
		one := h.insertKeyed("account:1", 2)
		unwaited := func(now time.Time, outs ...store.Outcome) map[string]bool {
			h.t.Helper()
			m := map[string]bool{}
			for _, r := range h.complete("w", now, outs...) {
				require.False(h.t, r.Stale)
				m[r.ID] = r.Unwaited
			}
			return m
		}
		cs := h.claim("w", 10, at(time.Second))
		require.ElementsMatch(h.t, []string{free[0], gated[0], one[0]}, claimedIDs(cs))
		got := unwaited(at(2*time.Second), done(cs[0]), done(cs[1]), done(cs[2]))
		require.True(h.t, got[free[0]], "a row without a key frees no slot")
		require.False(h.t, got[gated[0]], "the gate's second row waits for the slot")
		require.False(h.t, got[one[0]], "the K = 1 key's second row waits for it")

		cs = h.claim("w", 10, at(3*time.Second))
		require.ElementsMatch(h.t, []string{gated[1], one[1]}, claimedIDs(cs))
		got = unwaited(at(4*time.Second), done(cs[0]), done(cs[1]))
		require.True(h.t, got[gated[1]], "the gate's last row")
		require.True(h.t, got[one[1]], "the K = 1 key's last row")

		// A row made ready for its next step waits for its key's slot.
		h.insertKeyed("account:2", 1)
		c := h.claimOne("w", at(5*time.Second))
		require.False(h.t, unwaited(at(6*time.Second), next(c, "two"))[c.ID])
		// A stale outcome says nothing.
		res := h.complete("w", at(7*time.Second), done(c))
		require.True(h.t, res[0].Stale)
		require.False(h.t, res[0].Unwaited)
	}},
	{"keys/a slot handed to the next row leaves no row waiting for it", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 1})
		ids := h.insertKeyed("stripe:eu", 3)
		first := h.claimOne("w", at(time.Second))
		require.Equal(h.t, ids[0], first.ID)
		ho, ok := h.s.(store.HandOffer)
		require.True(h.t, ok, "the store does not implement store.HandOffer")
		res, claimed, err := ho.CompleteHandOff(h.ctx, "w", contended([]store.Outcome{done(first)}), at(2*time.Second),
			store.HandOff{Room: map[string]int{queue: 1}, Lease: lease})
		require.NoError(h.t, err)
		require.Equal(h.t, []string{ids[1]}, claimedIDs(claimed))
		require.True(h.t, res[0].Unwaited, "its slot went on: a claim would find the gate full, though a row waits")
		// Without room for a hand-off the slot is credited, and a row waits for it.
		res, claimed, err = ho.CompleteHandOff(h.ctx, "w", contended([]store.Outcome{done(claimed[0])}), at(3*time.Second),
			store.HandOff{Room: map[string]int{}, Lease: lease})
		require.NoError(h.t, err)
		require.Empty(h.t, claimed)
		require.False(h.t, res[0].Unwaited)
	}},
	{"keys/K=1 different keys run in parallel", func(h *harness) {
		var want []string
		for i := range 3 {
			want = append(want, h.insert(inst(fmt.Sprintf("account:%d", i)))...)
		}
		require.ElementsMatch(h.t, want, claimedIDs(h.claim("w", 10, at(time.Second))))
	}},
	{"keys/a NULL key never serializes", func(h *harness) {
		ids := h.insertKeyed("", 5)
		require.ElementsMatch(h.t, ids, claimedIDs(h.claim("w", 10, at(time.Second))))
	}},
	{"keys/a gate takes each slot from the shard with the most free slots, the lowest on ties", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 5, Shards: 2}) // capacities 3 and 2
		h.insertKeyed("stripe:a", 5)
		var shards []int
		for i := range 5 {
			c := h.claimOne("w", at(time.Duration(i)*time.Second))
			shards = append(shards, c.KeyShard)
		}
		// free (3,2) -> 0; (2,2) -> 0 (tie); (1,2) -> 1; (1,1) -> 0 (tie); (0,1) -> 1
		require.Equal(h.t, []int{0, 0, 1, 0, 1}, shards)
		require.Equal(h.t, 0, h.available("stripe:a"))
	}},
	{"keys/gate admits at most its limit per key", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 3})
		ids := h.insertKeyed("stripe:a", 10)
		cs := h.claim("w", 10, at(time.Second))
		require.Equal(h.t, ids[:3], claimedIDs(cs), "the first three in FIFO order")
		require.Empty(h.t, h.claim("w", 10, at(time.Second)))
		info := h.keyInfo("stripe:a")
		require.Equal(h.t, 3, info.K)
		require.Equal(h.t, 0, info.Available)
		require.Len(h.t, info.Holders, 3)

		h.commit("w", at(2*time.Second), done(cs[0]))
		require.Equal(h.t, 1, h.available("stripe:a"), "one outcome credits one slot")
		more := h.claim("w", 10, at(2*time.Second))
		require.Equal(h.t, []string{ids[3]}, claimedIDs(more))
		require.Len(h.t, h.executing("stripe:a"), 3)
		require.Equal(h.t, 0, h.available("stripe:a"))
	}},
	{"keys/promotion follows priority then FIFO", func(h *harness) {
		holder := inst("account:1")
		holder.RunAt = at(-time.Hour)
		h.insert(holder)
		require.Equal(h.t, holder.ID, h.claimOne("w", at(0)).ID)
		late, early, urgent, urgentLater := inst("account:1"), inst("account:1"), inst("account:1"), inst("account:1")
		late.Priority, late.RunAt = 5, at(-3*time.Second)
		early.Priority, early.RunAt = 5, at(-4*time.Second)
		urgent.Priority, urgent.RunAt = 1, at(-time.Second)
		urgentLater.Priority, urgentLater.RunAt = 1, at(-time.Second)
		h.insertSeq(late, early, urgent, urgentLater)
		require.Empty(h.t, h.claim("w", 10, at(time.Second)))
		h.requireStatus(store.StatusBlocked, late.ID, early.ID, urgent.ID, urgentLater.ID)

		var order []string
		for i := range 4 {
			ex := h.executing("account:1")
			require.Len(h.t, ex, 1)
			h.commit(ex[0].Worker, at(time.Duration(2+i)*time.Second), store.Outcome{ID: ex[0].ID, Fence: ex[0].Fence, Kind: store.OutcomeDone})
			order = append(order, h.claimOne("w", at(time.Duration(2+i)*time.Second)).ID)
		}
		require.Equal(h.t, []string{urgent.ID, urgentLater.ID, early.ID, late.ID}, order)
	}},
	{"keys/gate shards never exceed the limit and credit the shard debited", func(h *harness) {
		lim := gate.Limit{Name: "stripe", Limit: 10, Shards: 4}
		h.syncLimits(lim)
		caps := lim.ShardCapacities()
		h.insertKeyed("stripe:s", 30)
		cs := h.claim("w", 30, at(time.Second))
		require.Len(h.t, cs, 10)
		requireShards(h, "stripe:s", caps)
		info := h.keyInfo("stripe:s")
		require.Equal(h.t, 10, info.K)
		require.Equal(h.t, 4, info.Shards)
		require.Equal(h.t, 0, info.Available)

		// Free the slots of shards 2 and 3 only: new claims must land there.
		var freed []store.Outcome
		for _, c := range cs {
			if c.KeyShard >= 2 {
				freed = append(freed, done(c))
			}
		}
		h.commit("w", at(2*time.Second), freed...)
		require.Equal(h.t, len(freed), h.available("stripe:s"))
		again := h.claim("w", 30, at(2*time.Second))
		require.Len(h.t, again, len(freed))
		for _, c := range again {
			require.GreaterOrEqual(h.t, c.KeyShard, 2, "a claim took a slot of a full shard")
		}
		requireShards(h, "stripe:s", caps)

		// Everything completes: every shard is full again.
		var outs []store.Outcome
		for _, in := range h.executing("stripe:s") {
			outs = append(outs, store.Outcome{ID: in.ID, Fence: in.Fence, Kind: store.OutcomeDone})
		}
		h.commit("w", at(3*time.Second), outs...)
		require.Equal(h.t, 10, h.available("stripe:s"))
	}},
	{"keys/gate limits each key separately", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		a := h.insertKeyed("stripe:a", 3)
		b := h.insertKeyed("stripe:b", 2)
		cs := h.claim("w", 10, at(time.Second))
		require.ElementsMatch(h.t, []string{a[0], a[1], b[0], b[1]}, claimedIDs(cs))
	}},
	{"keys/a saturated key does not block other keys", func(h *harness) {
		k := make([]store.NewInstance, 200)
		for i := range k {
			k[i] = inst("hot:k")
			k[i].RunAt = at(time.Duration(i) * time.Millisecond)
		}
		h.insert(k...)
		j := inst("cold:j")
		j.RunAt = at(time.Second)
		h.insert(j)

		var claimed []string
		for range 2 {
			claimed = append(claimed, claimedIDs(h.claim("w", 5, at(time.Minute)))...)
		}
		require.Contains(h.t, claimed, j.ID, "a row of another key waits behind a saturated key")
		require.Contains(h.t, claimed, k[0].ID)
		// Claims go on finding nothing, and leave every row of k that they
		// passed over blocked.
		for i := 0; i < 100 && len(h.list(store.ListFilter{Key: "hot:k", Status: store.StatusReady})) > 0; i++ {
			require.Empty(h.t, h.claim("w", 5, at(time.Minute)))
		}
		require.Len(h.t, h.executing("hot:k"), 1)
		require.Len(h.t, h.list(store.ListFilter{Key: "hot:k", Status: store.StatusBlocked}), 199,
			"rows of a full key leave the pick path")
		require.Empty(h.t, h.list(store.ListFilter{Key: "hot:k", Status: store.StatusReady}))

		// The holder completes: exactly the next blocked row becomes ready.
		holder := h.executing("hot:k")[0]
		h.commit("w", at(2*time.Minute), store.Outcome{ID: holder.ID, Fence: holder.Fence, Kind: store.OutcomeDone})
		ready := h.list(store.ListFilter{Key: "hot:k", Status: store.StatusReady})
		require.Len(h.t, ready, 1)
		require.Equal(h.t, k[1].ID, ready[0].ID, "promotion follows admission order")
		require.Len(h.t, h.list(store.ListFilter{Key: "hot:k", Status: store.StatusBlocked}), 198)
		require.Equal(h.t, []string{k[1].ID}, claimedIDs(h.claim("w", 5, at(2*time.Minute))))
	}},
	{"keys/a key persists across steps", func(h *harness) {
		ids := h.insertKeyed("account:1", 2)
		c := h.claimOne("w", at(time.Second))
		require.Equal(h.t, ids[0], c.ID)
		h.commit("w", at(2*time.Second), next(c, "two"))
		require.Equal(h.t, "account:1", h.get(ids[0]).Key)
		cs := h.claim("w", 10, at(3*time.Second))
		require.Len(h.t, cs, 1, "both rows still share the key")
		require.Equal(h.t, ids[1], cs[0].ID, "the waiting row ran first in FIFO order")
		h.commit("w", at(4*time.Second), done(cs[0]))
		c = h.claimOne("w", at(5*time.Second))
		require.Equal(h.t, ids[0], c.ID)
		require.Equal(h.t, "two", c.Step)
		require.Equal(h.t, "account:1", c.Key)
	}},
	{"keys/SetKey empty releases the key", func(h *harness) {
		ids := h.insertKeyed("account:1", 2)
		c := h.claimOne("w", at(time.Second))
		o := next(c, "wrap_up")
		o.SetKey = true
		h.commit("w", at(2*time.Second), o)
		require.Empty(h.t, h.get(ids[0]).Key)
		cs := h.claim("w", 10, at(3*time.Second))
		require.ElementsMatch(h.t, ids, claimedIDs(cs), "the released row runs beside the key's next holder")
	}},
	{"keys/SetKey switches to a gate key", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 1})
		a := inst("account:1")
		g := inst("stripe:x")
		b := inst("account:1")
		h.insertSeq(a, g, b)
		cs := h.claim("w", 2, at(time.Second))
		require.ElementsMatch(h.t, []string{a.ID, g.ID}, claimedIDs(cs))
		ca := cs[0]
		if ca.ID != a.ID {
			ca = cs[1]
		}
		o := next(ca, "call_api")
		o.SetKey, o.Key, o.KeyIntent = true, "stripe:x", gate.GateIntent
		h.commit("w", at(2*time.Second), o)
		got := h.get(a.ID)
		require.Equal(h.t, "stripe:x", got.Key)
		require.Equal(h.t, gate.GateIntent, got.KeyIntent)

		// account:1 is free (b runs); stripe:x is full (a waits for g).
		cs = h.claim("w", 10, at(3*time.Second))
		require.Equal(h.t, []string{b.ID}, claimedIDs(cs))
		require.NotEqual(h.t, store.StatusExecuting, h.status(a.ID))
		holder := h.executing("stripe:x")[0]
		require.Equal(h.t, g.ID, holder.ID)
		h.commit("w", at(4*time.Second), store.Outcome{ID: holder.ID, Fence: holder.Fence, Kind: store.OutcomeDone})
		c := h.claimOne("w", at(5*time.Second))
		require.Equal(h.t, a.ID, c.ID)
		require.Equal(h.t, "stripe:x", c.Key)
		require.Equal(h.t, 0, c.KeyShard)
		require.Equal(h.t, 0, h.available("stripe:x"))
	}},
}

// requireShards checks that no shard of gate key k has more executing rows
// than its capacity, and that every executing row names a valid shard.
func requireShards(h *harness, k string, caps []int) {
	h.t.Helper()
	per := make([]int, len(caps))
	for _, in := range h.executing(k) {
		require.GreaterOrEqual(h.t, in.KeyShard, 0, "executing gate row without a shard")
		require.Less(h.t, in.KeyShard, len(caps))
		per[in.KeyShard]++
	}
	for i, n := range per {
		require.LessOrEqual(h.t, n, caps[i], "shard %d over capacity", i)
	}
}
