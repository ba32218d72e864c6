package storetest

import (
	"fmt"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

var claimTests = []test{
	{"claim/priority first then FIFO", func(h *harness) {
		mk := func(prio int, runAt time.Time) string {
			ni := inst("")
			ni.Priority, ni.RunAt = prio, runAt
			return h.insert(ni)[0]
		}
		a := mk(5, at(0))
		b := mk(1, at(0))
		c := mk(1, at(0))
		d := mk(5, at(0))
		e := mk(0, at(time.Second))
		x := mk(1, at(-time.Minute)) // inserted last but due earliest in priority 1
		want := []string{e, x, b, c, a, d}
		var got []string
		for range want {
			got = append(got, h.claimOne("w", at(time.Minute)).ID)
		}
		require.Equal(h.t, want, got)
		require.Empty(h.t, h.claim("w", 10, at(time.Minute)))
	}},
	{"claim/a key's rows made ready by one batch take their turns in insertion order", func(h *harness) {
		// Outcomes make rows ready together whatever their order in the
		// batch (a chain's successor comes after its predecessor, not in
		// insertion order): a key's rows take their turns from its fresh
		// round, in run time then insertion order, as many a round as the
		// key's limit, and another key's row made ready with them its
		// fresh round (admission.Rounds).
		h.syncLimits(gate.Limit{Name: "api", Limit: 2})
		x1, x2, y := inst("api:x"), inst("api:x"), inst("api:y")
		h.insertSeq(x1, x2, y)
		cs := h.claim("w", 3, at(time.Second))
		require.ElementsMatch(h.t, []string{x1.ID, x2.ID, y.ID}, claimedIDs(cs))
		// Due at once (the store's clock), ready while x is full: it takes
		// one of x's two turns of the current round.
		x0 := inst("api:x")
		x0.RunAt = time.Time{}
		h.insert(x0)
		by := map[string]store.Claimed{}
		for _, c := range cs {
			by[c.ID] = c
		}
		h.commit("w", at(2*time.Second), next(by[x2.ID], "s2"), next(by[y.ID], "s2"), next(by[x1.ID], "s2"))
		var got []string
		for range 3 {
			got = append(got, h.claimOne("w", at(3*time.Second)).ID)
		}
		require.Equal(h.t, []string{x0.ID, x1.ID, y.ID}, got,
			"x1 takes x's second turn of the round, before y; x2 waits for the next round")
		require.Empty(h.t, h.claim("w", 1, at(3*time.Second)), "x is full: x2 waits")
	}},
	{"claim/a gate key that went idle admits its next rows at once", func(h *harness) {
		// A store may drop an idle key's counters (the reconciler does),
		// and remember that it found them as the limit makes them: the
		// next claim still admits the rows that have room, rather than
		// leave them to a later one.
		h.syncLimits(gate.Limit{Name: "api", Limit: 2})
		for i := range 3 {
			a, b := inst("api:x"), inst("api:x")
			h.insertSeq(a, b)
			now := at(time.Duration(i) * time.Minute)
			cs := h.claim("w", 5, now)
			require.ElementsMatch(h.t, []string{a.ID, b.ID}, claimedIDs(cs), "pass %d", i)
			for _, c := range cs {
				h.commit("w", now.Add(time.Second), done(c))
			}
			h.reconcile(time.Hour, now.Add(2*time.Second)) // may drop the idle key's counters
		}
	}},
	{"claim/limit is respected", func(h *harness) {
		for range 5 {
			h.insert(inst(""))
		}
		var sizes []int
		for range 4 {
			sizes = append(sizes, len(h.claim("w", 2, at(time.Second))))
		}
		require.Equal(h.t, []int{2, 2, 1, 0}, sizes)
	}},
	{"claim/queues are isolated", func(h *harness) {
		one, two := inst(""), inst("")
		one.Queue, two.Queue = "one", "two"
		h.insert(one, two)
		cs := h.claimReq(store.ClaimRequest{Queue: "one", Worker: "w", Limit: 10, Now: at(time.Second)}).Claimed
		require.Equal(h.t, []string{one.ID}, claimedIDs(cs))
		h.requireStatus(store.StatusReady, two.ID)
		cs = h.claimReq(store.ClaimRequest{Queue: "two", Worker: "w", Limit: 10, Now: at(time.Second)}).Claimed
		require.Equal(h.t, []string{two.ID}, claimedIDs(cs))
	}},
	{"claim/workflows filter leaves unknown workflows ready", func(h *harness) {
		a, b, a2 := inst(""), inst("account:1"), inst("account:1")
		a.Workflow, b.Workflow, a2.Workflow = "alpha", "beta", "alpha"
		h.insertSeq(a, b, a2)
		cs := h.claimReq(store.ClaimRequest{Worker: "old", Limit: 10, Now: at(time.Second), Workflows: versionOne("alpha")}).Claimed
		require.ElementsMatch(h.t, []string{a.ID, a2.ID}, claimedIDs(cs), "a row passed over does not take its key")
		h.requireStatus(store.StatusReady, b.ID)
		for _, c := range cs {
			h.commit("old", at(2*time.Second), done(c))
		}
		cs = h.claimReq(store.ClaimRequest{Worker: "new", Limit: 10, Now: at(3 * time.Second), Workflows: versionOne("beta", "gamma")}).Claimed
		require.Equal(h.t, []string{b.ID}, claimedIDs(cs))
	}},
	{"claim/workflows filter leaves versions the worker does not register ready", func(h *harness) {
		// Version 2 rows, keyless and keyed, ahead of version 1 rows of the
		// same workflow: a worker of version 1 takes its rows in claim
		// order and leaves the others ready, keys untaken, for a worker of
		// version 2.
		var v2 []string
		for i := range 4 {
			ni := inst("")
			if i%2 == 0 {
				ni.Key = fmt.Sprintf("account:v-%d", i)
			}
			ni.Version = 2
			v2 = append(v2, h.insert(ni)[0])
		}
		a, b := inst(""), inst("account:v-0")
		h.insertSeq(a, b)
		var got []string
		for range 2 {
			cs := h.claimReq(store.ClaimRequest{Worker: "v1", Limit: 1, Now: at(time.Second), Workflows: versionOne("wf")}).Claimed
			require.Len(h.t, cs, 1)
			require.Equal(h.t, 1, cs[0].Version)
			got = append(got, cs[0].ID)
		}
		require.Equal(h.t, []string{a.ID, b.ID}, got)
		require.Empty(h.t, h.claimReq(store.ClaimRequest{Worker: "v1", Limit: 10, Now: at(time.Second), Workflows: versionOne("wf")}).Claimed)
		h.requireStatus(store.StatusReady, v2...)
		cs := h.claimReq(store.ClaimRequest{Worker: "v2", Limit: 10, Now: at(time.Second),
			Workflows: []store.WorkflowVersion{{Workflow: "wf", Version: 2}}}).Claimed
		require.ElementsMatch(h.t, []string{v2[1], v2[2], v2[3]}, claimedIDs(cs), "account:v-0 is taken by the version 1 row")
	}},
	{"claim/workflows filter keeps claim order across the workflows it names", func(h *harness) {
		// A backlog of a workflow no worker runs, ahead of every runnable
		// row, keyless and keyed, then rows of two workflows the worker
		// runs at two priorities: the claims take these in claim order
		// (priority, then insertion) whatever their workflow.
		var backlog []string
		for i := range 6 {
			ni := inst("")
			if i%2 == 0 {
				ni.Key = fmt.Sprintf("account:next-%d", i)
			}
			ni.Workflow = "next"
			backlog = append(backlog, h.insert(ni)[0])
		}
		mk := func(workflow string, prio int, key string) string {
			ni := inst(key)
			ni.Workflow, ni.Priority = workflow, prio
			return h.insert(ni)[0]
		}
		a1 := mk("alpha", 1, "")
		b0 := mk("beta", 0, "")
		a0 := mk("alpha", 0, "account:a0")
		b1 := mk("beta", 1, "account:b1")
		a2 := mk("alpha", 0, "")
		var got []string
		for range 5 {
			cs := h.claimReq(store.ClaimRequest{Worker: "w", Limit: 1, Now: at(time.Second), Workflows: versionOne("alpha", "beta")}).Claimed
			require.Len(h.t, cs, 1)
			got = append(got, cs[0].ID)
		}
		require.Equal(h.t, []string{b0, a0, a2, a1, b1}, got)
		require.Empty(h.t, h.claimReq(store.ClaimRequest{Worker: "w", Limit: 10, Now: at(time.Second), Workflows: versionOne("alpha", "beta")}).Claimed)
		h.requireStatus(store.StatusReady, backlog...)
	}},
	{"claim/claimed row carries the claim", func(h *harness) {
		id := h.insert(inst(""))[0]
		now := at(time.Second)
		c := h.claimReq(store.ClaimRequest{Worker: "w1", Limit: 1, Lease: 2 * time.Minute, Now: now}).Claimed[0]
		require.Equal(h.t, id, c.ID)
		require.Positive(h.t, c.Fence)
		near(h.t, now.Add(2*time.Minute), c.LeaseExpiresAt, "lease")
		near(h.t, now, c.StartedAt, "started_at")
		require.Nil(h.t, c.Signal)
		require.False(h.t, c.TimedOut)
		got := h.get(id)
		require.Equal(h.t, store.StatusExecuting, got.Status)
		require.Equal(h.t, "w1", got.Worker)
		require.Equal(h.t, c.Fence, got.Fence)
		near(h.t, c.LeaseExpiresAt, got.LeaseExpiresAt, "stored lease")
	}},
}

// insertSeq inserts instances one call each, so their insertion order is the
// argument order.
func (h *harness) insertSeq(nis ...store.NewInstance) {
	h.t.Helper()
	for _, ni := range nis {
		h.insert(ni)
	}
}
