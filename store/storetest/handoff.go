package storetest

import (
	"fmt"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

// handOff completes outcomes through store.HandOffer (the suite requires
// every backend to implement it) and returns the rows handed to worker.
func (h *harness) handOff(worker string, now time.Time, room map[string]int, outs ...store.Outcome) []store.Claimed {
	h.t.Helper()
	ho, ok := h.s.(store.HandOffer)
	require.True(h.t, ok, "the store does not implement store.HandOffer")
	outs = contended(outs)
	res, claimed, err := ho.CompleteHandOff(h.ctx, worker, outs, now, store.HandOff{Room: room, Lease: lease})
	require.NoError(h.t, err)
	require.Len(h.t, res, len(outs))
	for _, c := range claimed {
		require.Equal(h.t, store.StatusExecuting, c.Status)
		require.Equal(h.t, worker, c.Worker)
		near(h.t, now.Add(lease), c.LeaseExpiresAt, "a handed-off row's lease counts from the outcome's now")
	}
	return claimed
}

// contended marks outcomes as ending contended claims (an engine copies
// Claimed.Contended): only their slots may be handed off.
func contended(outs []store.Outcome) []store.Outcome {
	outs = append([]store.Outcome(nil), outs...)
	for i := range outs {
		outs[i].Contended = true
	}
	return outs
}

var handOffTests = []test{
	{"handoff/a freed K = 1 key goes to its next blocked row, claimed by the completing worker", func(h *harness) {
		ids := h.insertKeyed("acct:1", 3)
		c := h.claimOne("w", at(time.Second))
		require.Equal(h.t, ids[0], c.ID)
		require.Empty(h.t, h.claim("w", 10, at(time.Second))) // blocks the key's backlog
		h.requireStatus(store.StatusBlocked, ids[1], ids[2])

		got := h.handOff("w", at(2*time.Second), map[string]int{queue: 5}, done(c))
		require.Equal(h.t, []string{ids[1]}, claimedIDs(got), "one key, one slot: only the next row")
		require.Equal(h.t, -1, got[0].KeyShard)
		require.NotZero(h.t, got[0].Fence, "a hand-off is a claim: it has a fence")
		h.requireStatus(store.StatusBlocked, ids[2])
		require.Empty(h.t, h.claim("w2", 10, at(3*time.Second)), "the key is held by the handed-off row")
		require.Len(h.t, h.executing("acct:1"), 1)

		// Without room, the slot frees as with Complete: the next row is made ready.
		require.Empty(h.t, h.handOff("w", at(4*time.Second), map[string]int{queue: 0}, done(got[0])))
		h.requireStatus(store.StatusReady, ids[2])
		require.Equal(h.t, ids[2], h.claimOne("w2", at(5*time.Second)).ID)
	}},
	{"handoff/a freed gate slot keeps its shard and the counter does not change", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 4, Shards: 2})
		ids := h.insertKeyed("stripe:a", 7)
		cs := h.claim("w", 10, at(time.Second))
		require.Equal(h.t, ids[:4], claimedIDs(cs))
		require.Equal(h.t, 0, h.available("stripe:a"))
		h.requireStatus(store.StatusBlocked, ids[4:]...)

		got := h.handOff("w", at(2*time.Second), map[string]int{queue: 10}, done(cs[0]), done(cs[1]))
		require.Equal(h.t, ids[4:6], claimedIDs(got), "two slots freed, the key's next two rows in line")
		require.ElementsMatch(h.t, []int{cs[0].KeyShard, cs[1].KeyShard}, []int{got[0].KeyShard, got[1].KeyShard},
			"each handed-off row takes a freed slot's shard")
		require.Equal(h.t, 0, h.available("stripe:a"))
		require.Len(h.t, h.executing("stripe:a"), 4)
		h.requireStatus(store.StatusBlocked, ids[6])
		require.Zero(h.t, h.reconcile(0, at(3*time.Second)).Drift, "a hand-off leaves the counters true")

		// The handed-off claims end like any other: their slots credit back.
		h.commit("w", at(4*time.Second), done(got[0]), done(got[1]), done(cs[2]), done(cs[3]))
		require.Equal(h.t, 4, h.available("stripe:a")) // ids[6] was promoted and holds nothing yet
		require.Equal(h.t, ids[6], h.claimOne("w", at(5*time.Second)).ID)
		require.Equal(h.t, 3, h.available("stripe:a"))
	}},
	{"handoff/only the slots of contended outcomes are handed off", func(h *harness) {
		ids := h.insertKeyed("acct:1", 2)
		c := h.claimOne("w", at(time.Second))
		require.Empty(h.t, h.claim("w", 10, at(time.Second)))
		ho := h.s.(store.HandOffer)
		_, got, err := ho.CompleteHandOff(h.ctx, "w", []store.Outcome{done(c)}, at(2*time.Second),
			store.HandOff{Room: map[string]int{queue: 5}, Lease: lease})
		require.NoError(h.t, err)
		require.Empty(h.t, got)
		h.requireStatus(store.StatusReady, ids[1])
	}},
	{"handoff/a stale outcome hands nothing off", func(h *harness) {
		ids := h.insertKeyed("acct:1", 2)
		c := h.claimOne("w", at(time.Second))
		require.Empty(h.t, h.claim("w", 10, at(time.Second)))
		require.Equal(h.t, 1, h.reap(at(time.Second+2*lease)))
		stale := done(c)
		require.Empty(h.t, h.handOff("w", at(3*lease), map[string]int{queue: 5}, stale))
		require.Equal(h.t, store.StatusReady, h.status(ids[0]))
		require.NotEqual(h.t, store.StatusExecuting, h.status(ids[1]))
	}},
	{"handoff/no room, another queue, an unknown workflow or version, a policy or a rate limit: the slot goes the claim's way", func(h *harness) {
		type setup struct {
			name      string
			room      map[string]int
			workflows []store.WorkflowVersion
			prepare   func(h *harness)
		}
		for _, s := range []setup{
			{name: "room in another queue only", room: map[string]int{"elsewhere": 5}},
			{name: "an unknown workflow", room: map[string]int{queue: 5}, workflows: versionOne("other")},
			{name: "an unknown version", room: map[string]int{queue: 5}, workflows: []store.WorkflowVersion{{Workflow: "wf", Version: 2}}},
			{name: "a queue policy", room: map[string]int{queue: 5}, prepare: func(h *harness) {
				h.syncPolicies("ns", store.ConcurrencyPolicy{Queue: queue, MaxActive: 10})
			}},
			{name: "a rate limit", room: map[string]int{queue: 5}, prepare: func(h *harness) {
				h.syncKeyLimits("ns", store.KeyLimits{RateLimits: []gate.RateLimit{
					{Name: "acct", Limit: 100, Period: time.Second, Burst: 100}}}, store.SyncOptions{})
			}},
		} {
			k := "acct:" + s.name
			if s.prepare != nil {
				s.prepare(h)
			}
			// Three rows: a claim that finds the key busy blocks the two in
			// sight (one alone it would leave ready).
			ids := h.insertKeyed(k, 3)
			c := h.claimOne("w", at(time.Second))
			require.Equal(h.t, ids[0], c.ID, s.name)
			require.Empty(h.t, h.claim("w", 10, at(time.Second)), s.name)
			h.requireStatus(store.StatusBlocked, ids[1], ids[2])
			ho, ok := h.s.(store.HandOffer)
			require.True(h.t, ok)
			_, got, err := ho.CompleteHandOff(h.ctx, "w", contended([]store.Outcome{done(c)}), at(2*time.Second),
				store.HandOff{Room: s.room, Workflows: s.workflows, Lease: lease})
			require.NoError(h.t, err, s.name)
			require.Empty(h.t, got, "%s: no hand-off", s.name)
			require.Equal(h.t, store.StatusReady, h.status(ids[1]), "%s: the next row is promoted instead", s.name)
			h.requireStatus(store.StatusBlocked, ids[2])
			for _, id := range ids[1:] {
				next := h.claimOne("w", at(3*time.Second))
				require.Equal(h.t, id, next.ID, s.name)
				h.commit("w", at(3*time.Second), done(next))
			}
			if s.prepare != nil { // back to no policy and no rate limit
				h.syncPolicies("ns")
				h.syncKeyLimits("ns", store.KeyLimits{RateLimits: []gate.RateLimit{}}, store.SyncOptions{})
			}
		}
	}},
	{"handoff/a key's next row never runs ahead of another key's earlier round", func(h *harness) {
		a := h.insertKeyed("acct:a", 3) // rounds 0, 1, 2
		c := h.claimOne("w", at(time.Second))
		require.Empty(h.t, h.claim("w", 10, at(time.Second)))
		h.requireStatus(store.StatusBlocked, a[1], a[2])
		b := inst("acct:b")
		b.RunAt = at(0)
		h.insert(b)
		// A claim of no known workflow makes b ready (with the queue's
		// current round, 0) and claims nothing.
		require.Empty(h.t, h.claimReq(store.ClaimRequest{Worker: "w", Limit: 1, Now: at(time.Second), Workflows: versionOne("none")}).Claimed)
		h.requireStatus(store.StatusReady, b.ID)
		require.Empty(h.t, h.handOff("w", at(2*time.Second), map[string]int{queue: 5}, done(c)),
			"a[1] (round 1) would run before b (round 0)")
		h.requireStatus(store.StatusReady, a[1])
		cs := h.claim("w", 1, at(3*time.Second))
		require.Equal(h.t, []string{b.ID}, claimedIDs(cs), "b's turn comes first")
	}},
	{"handoff/a slot never passes along a key's line while a better-priority row waits", func(h *harness) {
		for _, other := range []string{"", "acct:b"} {
			c, a, x := h.lineBehindABetterRow("acct:a"+other, other, "wf")
			require.Empty(h.t, h.handOff("w", at(2*time.Second), map[string]int{queue: 1}, done(c)),
				"key %q: a[1] (priority 10) would start before x (priority 0)", other)
			h.requireStatus(store.StatusReady, a[1])
			require.Equal(h.t, x.ID, h.claimOne("w", at(3*time.Second)).ID, "key %q: the better priority first", other)
			for _, id := range a[1:] {
				next := h.claimOne("w", at(4*time.Second))
				require.Equal(h.t, id, next.ID)
				h.commit("w", at(4*time.Second), done(next))
			}
		}
	}},
	{"handoff/a better row of a workflow the worker does not run does not hold a slot back", func(h *harness) {
		// As "a slot never passes along a key's line while a better-priority
		// row waits", with the better row x of a workflow the completing
		// worker does not run: a claim of that worker would take a[1]
		// first, so the slot passes; a worker that runs every workflow
		// still waits for x.
		ho, ok := h.s.(store.HandOffer)
		require.True(h.t, ok)
		for i, other := range []string{"", "acct:b"} {
			c, a, x := h.lineBehindABetterRow(fmt.Sprintf("acct:a%d", i), other, "next")
			_, got, err := ho.CompleteHandOff(h.ctx, "w", contended([]store.Outcome{done(c)}), at(2*time.Second),
				store.HandOff{Room: map[string]int{queue: 1}, Workflows: versionOne("wf"), Lease: lease})
			require.NoError(h.t, err)
			require.Equal(h.t, []string{a[1]}, claimedIDs(got), "key %q: x is not the worker's to run", other)
			h.commit("w", at(3*time.Second), done(got[0]))
			h.requireStatus(store.StatusReady, a[2])
			c = h.claimOne("w", at(3*time.Second)) // x, the better priority, for a worker that runs it
			require.Equal(h.t, x.ID, c.ID)
			h.commit("w", at(3*time.Second), done(c))
			h.commit("w", at(4*time.Second), done(h.claimOne("w", at(4*time.Second))))
		}
	}},
	{"handoff/a worse-priority row of another key does not hold a slot back", func(h *harness) {
		a := h.insertKeyed("acct:a", 3)
		c := h.claimOne("w", at(time.Second))
		require.Empty(h.t, h.claim("w", 10, at(time.Second)))
		y := inst("acct:y")
		y.RunAt = at(0)
		y.Priority = 5
		h.insert(y)
		require.Empty(h.t, h.claimReq(store.ClaimRequest{Worker: "w", Limit: 1, Now: at(time.Second), Workflows: versionOne("none")}).Claimed)
		h.requireStatus(store.StatusReady, y.ID)
		got := h.handOff("w", at(2*time.Second), map[string]int{queue: 1}, done(c))
		require.Equal(h.t, []string{a[1]}, claimedIDs(got), "a[1] has the better priority: the slot passes")
	}},
	{"handoff/a key over a lowered limit is credited, not handed off", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		ids := h.insertKeyed("stripe:a", 3)
		cs := h.claim("w", 10, at(time.Second))
		require.Equal(h.t, ids[:2], claimedIDs(cs))
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 1})
		require.Empty(h.t, h.handOff("w", at(2*time.Second), map[string]int{queue: 5}, done(cs[0])),
			"one row still executes: the key is at its new limit")
		require.NotEqual(h.t, store.StatusExecuting, h.status(ids[2]))
		require.Len(h.t, h.executing("stripe:a"), 1)
		h.commit("w", at(3*time.Second), done(cs[1]))
		require.Equal(h.t, ids[2], h.claimOne("w", at(4*time.Second)).ID)
		require.Zero(h.t, h.reconcile(0, at(5*time.Second)).Drift)
	}},
}

// lineBehindABetterRow makes key k's line of three rows of priority 10,
// the first claimed by "w" (holding k) and the others blocked behind it,
// then a ready row x of key other ("" : none) and workflow wf, priority 0,
// due before them. It returns the claim, the line's ids and x.
func (h *harness) lineBehindABetterRow(k, other, wf string) (store.Claimed, []string, store.NewInstance) {
	h.t.Helper()
	var a []string
	for range 3 {
		n := inst(k)
		n.Priority = 10
		h.insert(n)
		a = append(a, n.ID)
	}
	c := h.claimOne("w", at(time.Second))
	require.Equal(h.t, a[0], c.ID)
	require.Empty(h.t, h.claim("w", 10, at(time.Second)))
	h.requireStatus(store.StatusBlocked, a[1], a[2])
	x := inst(other)
	x.RunAt, x.Priority, x.Workflow = at(0), 0, wf
	h.insert(x)
	require.Empty(h.t, h.claimReq(store.ClaimRequest{Worker: "w", Limit: 1, Now: at(time.Second), Workflows: versionOne("none")}).Claimed)
	h.requireStatus(store.StatusReady, x.ID)
	return c, a, x
}
