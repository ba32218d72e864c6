package storetest

import (
	"encoding/json"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

var claimLifeTests = []test{
	{"clock/delays and timeouts count from the store's now", func(h *harness) {
		later := inst("")
		later.RunAt, later.Delay, later.Queue = time.Time{}, time.Hour, "elsewhere"
		before := time.Now()
		h.insert(later)
		got := h.get(later.ID).RunAt
		// An insert takes the store's own clock (the database's): the
		// delay counts from it.
		require.True(h.t, !got.Before(before.Add(time.Hour-time.Minute)) && !got.After(time.Now().Add(time.Hour+time.Minute)),
			"an insert delay counts from the store's now: run at %v, inserted at %v", got, before)
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(time.Minute))
		o := next(c, "b")
		o.Delay = 2 * time.Minute
		h.commit("w", at(2*time.Minute), o)
		in := h.get(id)
		require.Equal(h.t, store.StatusReady, in.Status)
		near(h.t, at(4*time.Minute), in.RunAt, "a next delay counts from the outcome's now")
		c = h.claimOne("w", at(4*time.Minute))
		a := await(c, "go", "c")
		a.Timeout = time.Minute
		h.commit("w", at(5*time.Minute), a)
		near(h.t, at(6*time.Minute), h.get(id).TimeoutAt, "an await timeout counts from the outcome's now")
	}},
	{"prefetch/claimed rows hold their slots", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		ids := h.insertKeyed("stripe:a", 3)
		cs := h.claim("w", 2, at(time.Second)) // buffered, not run
		require.Equal(h.t, ids[:2], claimedIDs(cs))
		require.Empty(h.t, h.claim("w2", 10, at(2*time.Second)))
		require.Equal(h.t, 0, h.available("stripe:a"))
	}},
	{"prefetch/release returns claims to ready and credits their slots", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		g := h.insertKeyed("stripe:a", 2)
		k := h.insertKeyed("account:1", 2)
		cs := h.claim("w", 10, at(time.Second))
		require.ElementsMatch(h.t, []string{g[0], g[1], k[0]}, claimedIDs(cs))
		for _, c := range cs {
			if c.ID == g[0] {
				// A release naming the wrong fence does nothing.
				require.NoError(h.t, h.s.Release(h.ctx, "w", []store.ClaimRef{{ID: c.ID, Fence: c.Fence + 1}}, at(2*time.Second)))
				h.requireStatus(store.StatusExecuting, c.ID)
			}
		}
		require.Equal(h.t, 0, h.available("stripe:a"))
		refs := make([]store.ClaimRef, len(cs))
		for i, c := range cs {
			refs[i] = ref(c)
		}
		require.NoError(h.t, h.s.Release(h.ctx, "w", refs, at(2*time.Second)))
		require.Equal(h.t, 2, h.available("stripe:a"))
		for _, c := range cs {
			got := h.get(c.ID)
			require.Equal(h.t, store.StatusReady, got.Status)
			require.Equal(h.t, 0, got.Attempt, "a released claim never ran: same attempt")
			require.Empty(h.t, got.Worker)
		}
		again := h.claim("w2", 10, at(3*time.Second))
		require.Len(h.t, again, 3, "released slots are usable at once")
	}},
	{"fences/each claim has a new fence", func(h *harness) {
		h.insert(inst(""))
		seen := map[int64]bool{}
		var last int64
		for i := range 3 {
			c := h.claimOne("w", at(time.Duration(i)*time.Second))
			require.False(h.t, seen[c.Fence], "fence reused")
			require.Greater(h.t, c.Fence, last, "fences grow")
			seen[c.Fence], last = true, c.Fence
			require.NoError(h.t, h.s.Release(h.ctx, "w", []store.ClaimRef{ref(c)}, at(time.Duration(i)*time.Second)))
		}
	}},
	{"fences/an outcome with a wrong fence or worker is stale", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(time.Second))
		wrong := next(c, "two")
		wrong.Fence = c.Fence + 1
		h.stale("w", at(2*time.Second), wrong)
		h.stale("intruder", at(2*time.Second), next(c, "two"))
		got := h.get(id)
		require.Equal(h.t, store.StatusExecuting, got.Status)
		require.Equal(h.t, "start", got.Step)
		require.JSONEq(h.t, `{"n":0}`, string(got.State))
		h.commit("w", at(3*time.Second), next(c, "two"))
		require.Equal(h.t, "two", h.get(id).Step)
		h.stale("w", at(4*time.Second), done(c)) // the claim is spent
		require.Equal(h.t, store.StatusReady, h.status(id))
	}},
	{"fences/a stale outcome credits no slot", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		ids := h.insertKeyed("stripe:a", 3)
		cs := h.claim("w", 2, at(0))
		require.Equal(h.t, ids[:2], claimedIDs(cs))
		require.Equal(h.t, 0, h.available("stripe:a"))
		// Only the first claim's lease runs out: renew the second.
		hb, err := h.s.Heartbeat(h.ctx, "w", []store.ClaimRef{ref(cs[1])}, time.Hour, at(30*time.Second))
		require.NoError(h.t, err)
		require.Empty(h.t, hb.Lost)
		require.Equal(h.t, 1, h.reap(at(2*lease)))
		require.Equal(h.t, 0, h.available("stripe:a"), "a reap does not credit")

		h.stale("w", at(3*lease), done(cs[0]))
		require.Equal(h.t, 0, h.available("stripe:a"), "a stale outcome does not credit")
		got := h.get(cs[0].ID)
		require.Equal(h.t, store.StatusReady, got.Status)
		require.Equal(h.t, 1, got.Attempt)
		require.Nil(h.t, got.Result)
		require.Empty(h.t, h.claim("w", 10, at(3*lease)), "the gate stays (stricter than) full")
	}},
	{"fences/a stale child outcome leaves the parent's join alone", func(h *harness) {
		parent := h.insert(inst(""))[0]
		c := h.claimOne("w", at(0))
		o, kids := spawnOutcome(c, 1, "")
		h.commit("w", at(time.Second), o)
		child := h.claimOne("w1", at(2*time.Second))
		require.Equal(h.t, kids[0], child.ID)
		require.Equal(h.t, 1, h.reap(at(2*time.Second+2*lease)))
		h.stale("w1", at(3*lease), done(child))
		p := h.get(parent)
		require.Equal(h.t, store.StatusChildren, p.Status)
		require.Equal(h.t, 1, p.PendingChildren)
		require.Equal(h.t, store.StatusReady, h.status(kids[0]))
	}},
	{"fences/a stale spawn inserts no children", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(0))
		require.Equal(h.t, 1, h.reap(at(2*lease)))
		o, kids := spawnOutcome(c, 2, "")
		h.stale("w", at(3*lease), o)
		_, err := h.s.Get(h.ctx, kids[0])
		require.ErrorIs(h.t, err, store.ErrNotFound)
		got, err := h.s.Children(h.ctx, id)
		require.NoError(h.t, err)
		require.Empty(h.t, got)
	}},
	{"fences/heartbeat extends the lease and reports lost and canceled claims", func(h *harness) {
		h.insert(inst(""), inst(""), inst(""))
		cs := h.claim("w", 3, at(0))
		require.Len(h.t, cs, 3)
		refs := []store.ClaimRef{ref(cs[0]), ref(cs[1]), ref(cs[2])}
		hb, err := h.s.Heartbeat(h.ctx, "w", refs, 5*time.Minute, at(30*time.Second))
		require.NoError(h.t, err)
		require.Empty(h.t, hb.Lost)
		require.Empty(h.t, hb.Canceled)
		near(h.t, at(5*time.Minute+30*time.Second), h.get(cs[0].ID).LeaseExpiresAt, "extended lease")
		require.Zero(h.t, h.reap(at(2*time.Minute)), "an extended lease is not reaped")

		require.NoError(h.t, h.s.Cancel(h.ctx, cs[1].ID, at(3*time.Minute)))
		require.NoError(h.t, h.s.Release(h.ctx, "w", refs[2:], at(3*time.Minute)))
		h.claimOne("w", at(3*time.Minute)) // cs[2] again, under a new fence
		hb, err = h.s.Heartbeat(h.ctx, "w", refs, 5*time.Minute, at(3*time.Minute))
		require.NoError(h.t, err)
		require.Equal(h.t, []store.ClaimRef{refs[2]}, hb.Lost, "the old claim is lost, named by its fence")
		require.Equal(h.t, []store.ClaimRef{refs[1]}, hb.Canceled, "a canceled claim is still held")
		hb, err = h.s.Heartbeat(h.ctx, "other", refs[:1], 5*time.Minute, at(3*time.Minute))
		require.NoError(h.t, err)
		require.Equal(h.t, refs[:1], hb.Lost, "another worker does not hold the claim")
		near(h.t, at(8*time.Minute), h.get(cs[0].ID).LeaseExpiresAt, "a foreign heartbeat changes nothing")
	}},
	{"fences/a claim check reports lost and canceled claims and renews no lease", func(h *harness) {
		c, ok := h.s.(store.ClaimChecker)
		require.True(h.t, ok, "the store checks claims (store.ClaimChecker)")
		h.insert(inst(""), inst(""), inst(""))
		cs := h.claim("w", 3, at(0))
		require.Len(h.t, cs, 3)
		refs := []store.ClaimRef{ref(cs[0]), ref(cs[1]), ref(cs[2])}
		expires := h.get(cs[0].ID).LeaseExpiresAt
		res, err := c.CheckClaims(h.ctx, "w", refs)
		require.NoError(h.t, err)
		require.Empty(h.t, res.Lost)
		require.Empty(h.t, res.Canceled)

		require.NoError(h.t, h.s.Cancel(h.ctx, cs[1].ID, at(time.Minute)))
		require.NoError(h.t, h.s.Release(h.ctx, "w", refs[2:], at(time.Minute)))
		h.claimOne("w", at(time.Minute)) // cs[2] again, under a new fence
		res, err = c.CheckClaims(h.ctx, "w", refs)
		require.NoError(h.t, err)
		require.Equal(h.t, []store.ClaimRef{refs[2]}, res.Lost, "the old claim is lost, named by its fence")
		require.Equal(h.t, []store.ClaimRef{refs[1]}, res.Canceled, "a canceled claim is still held")
		res, err = c.CheckClaims(h.ctx, "other", refs[:1])
		require.NoError(h.t, err)
		require.Equal(h.t, refs[:1], res.Lost, "another worker does not hold the claim")
		require.Equal(h.t, expires, h.get(cs[0].ID).LeaseExpiresAt, "no lease is renewed")
		require.Positive(h.t, h.reap(at(lease+time.Second)))
		h.requireStatus(store.StatusReady, cs[0].ID) // its lease ran out as if never checked
	}},
	{"reap/an expired lease returns the row with attempt + 1", func(h *harness) {
		ids := h.insertKeyed("account:1", 2)
		c := h.claimOne("w", at(0))
		require.Equal(h.t, ids[0], c.ID)
		require.Empty(h.t, h.claim("w", 10, at(time.Second)))
		require.Zero(h.t, h.reap(at(lease-time.Second)), "not before expiry")
		h.requireStatus(store.StatusExecuting, ids[0])

		require.Equal(h.t, 1, h.reap(at(lease+time.Second)))
		got := h.get(ids[0])
		require.Equal(h.t, store.StatusReady, got.Status)
		require.Equal(h.t, 1, got.Attempt)
		require.Empty(h.t, got.Worker)
		next := h.claim("w2", 10, at(lease+2*time.Second))
		require.Len(h.t, next, 1, "the K = 1 key is free at once")
		require.Equal(h.t, "account:1", next[0].Key)
	}},
	{"reap/gate slots are not credited until reconcile", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		h.insertKeyed("stripe:a", 2)
		require.Len(h.t, h.claim("w", 2, at(0)), 2)
		require.Equal(h.t, 2, h.reap(at(2*lease)))
		require.Equal(h.t, 0, h.available("stripe:a"), "crash paths under-credit")
		require.Empty(h.t, h.claim("w", 10, at(2*lease)), "stricter than K, never looser")

		rep := h.reconcile(0, at(3*lease))
		require.Equal(h.t, 1, rep.CountersRepaired)
		require.Equal(h.t, 2, rep.Drift)
		require.Equal(h.t, 2, h.available("stripe:a"))
		require.Len(h.t, h.claim("w", 10, at(3*lease)), 2)
	}},
	{"reap/reclaim worker takes back every claim of a worker", func(h *harness) {
		h.insert(inst(""), inst(""), inst(""))
		a := h.claim("dead", 2, at(0))
		b := h.claim("alive", 1, at(0))
		n, err := h.s.ReclaimWorker(h.ctx, "dead", at(time.Second))
		require.NoError(h.t, err)
		require.Equal(h.t, 2, n)
		for _, c := range a {
			got := h.get(c.ID)
			require.Equal(h.t, store.StatusReady, got.Status)
			require.Equal(h.t, 1, got.Attempt)
		}
		h.requireStatus(store.StatusExecuting, b[0].ID)
		for _, c := range a {
			h.stale("dead", at(2*time.Second), done(c))
		}
	}},
	{"cancel/an executing row keeps its slot until its step's outcome, which cancels it", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 1})
		g := h.insertKeyed("stripe:a", 2)
		k := h.insertKeyed("account:1", 2)
		cs := h.claim("w", 10, at(0))
		require.ElementsMatch(h.t, []string{g[0], k[0]}, claimedIDs(cs))
		for _, id := range []string{g[0], k[0]} {
			require.NoError(h.t, h.s.Cancel(h.ctx, id, at(time.Second)))
			require.NoError(h.t, h.s.Cancel(h.ctx, id, at(time.Second)), "a second cancel does nothing")
			got := h.get(id)
			require.Equal(h.t, store.StatusExecuting, got.Status, "the step may still run")
			require.True(h.t, got.CancelRequested)
		}
		require.Equal(h.t, 0, h.available("stripe:a"))
		require.Empty(h.t, h.claim("w", 10, at(2*time.Second)), "both keys are held while their steps run")
		for _, c := range cs {
			h.commit("w", at(3*time.Second), next(c, "after"))
			got := h.get(c.ID)
			require.Equal(h.t, store.StatusCanceled, got.Status)
			require.Equal(h.t, "after", got.Step, "the step's progress is kept")
			require.JSONEq(h.t, `{"step":"after"}`, string(got.State))
		}
		require.Equal(h.t, 1, h.available("stripe:a"))
		require.ElementsMatch(h.t, []string{g[1], k[1]}, claimedIDs(h.claim("w", 10, at(4*time.Second))))
	}},
	{"cancel/a step that finishes its instance wins over a cancel requested meanwhile", func(h *harness) {
		ids := h.insert(inst("account:1"), inst("account:2"))
		cs := h.claim("w", 2, at(0))
		require.Len(h.t, cs, 2)
		for _, id := range ids {
			require.NoError(h.t, h.s.Cancel(h.ctx, id, at(time.Second)))
		}
		byID := map[string]store.Claimed{cs[0].ID: cs[0], cs[1].ID: cs[1]}
		h.commit("w", at(2*time.Second), done(byID[ids[0]]),
			store.Outcome{ID: ids[1], Fence: byID[ids[1]].Fence, Kind: store.OutcomeFailed, Error: "boom"})
		h.requireStatus(store.StatusDone, ids[0])
		h.requireStatus(store.StatusFailed, ids[1])
	}},
	{"cancel/a canceled step neither parks nor spawns", func(h *harness) {
		ids := h.insert(inst(""), inst(""))
		cs := h.claim("w", 2, at(0))
		require.Len(h.t, cs, 2)
		for _, id := range ids {
			require.NoError(h.t, h.s.Cancel(h.ctx, id, at(time.Second)))
		}
		byID := map[string]store.Claimed{cs[0].ID: cs[0], cs[1].ID: cs[1]}
		spawn := store.Outcome{ID: ids[1], Fence: byID[ids[1]].Fence, Kind: store.OutcomeSpawn, Step: "joined",
			Children: []store.NewInstance{inst(""), inst("")}}
		h.commit("w", at(2*time.Second), await(byID[ids[0]], "go", "woken"), spawn)
		h.requireStatus(store.StatusCanceled, ids...)
		require.Empty(h.t, h.list(store.ListFilter{Status: store.StatusReady}), "no child was spawned")
		_, err := h.s.Signal(h.ctx, store.SignalRequest{InstanceID: ids[0], Name: "go", Now: at(3 * time.Second)})
		require.ErrorIs(h.t, err, store.ErrTerminal)
	}},
	{"cancel/a released or reaped claim whose cancel was requested ends canceled", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		ids := h.insertKeyed("stripe:a", 3)
		cs := h.claim("w", 2, at(0))
		require.Equal(h.t, ids[:2], claimedIDs(cs))
		for _, c := range cs {
			require.NoError(h.t, h.s.Cancel(h.ctx, c.ID, at(time.Second)))
		}
		require.NoError(h.t, h.s.Release(h.ctx, "w", []store.ClaimRef{ref(cs[0])}, at(2*time.Second)))
		h.requireStatus(store.StatusCanceled, cs[0].ID)
		require.Equal(h.t, 1, h.reap(at(2*lease)))
		got := h.get(cs[1].ID)
		require.Equal(h.t, store.StatusCanceled, got.Status)
		require.Equal(h.t, 0, got.Attempt, "a canceled row is not retried")
		h.stale("w", at(3*lease), done(cs[1]))
		require.Equal(h.t, []string{ids[2]}, claimedIDs(h.claim("w", 10, at(3*lease))))
	}},
	{"cancel/a child canceled while it runs ends its parent's join when its claim ends", func(h *harness) {
		h.insert(inst(""))
		parent := h.claimOne("w", at(0))
		h.commit("w", at(time.Second), store.Outcome{ID: parent.ID, Fence: parent.Fence, Kind: store.OutcomeSpawn,
			Step: "joined", Children: []store.NewInstance{inst(""), inst("")}})
		kids := h.claim("w", 2, at(2*time.Second))
		require.Len(h.t, kids, 2)
		for _, k := range kids {
			require.NoError(h.t, h.s.Cancel(h.ctx, k.ID, at(3*time.Second)))
		}
		require.Equal(h.t, 2, h.get(parent.ID).PendingChildren, "the children still run")
		h.commit("w", at(4*time.Second), next(kids[0], "more"))
		require.NoError(h.t, h.s.Release(h.ctx, "w", []store.ClaimRef{ref(kids[1])}, at(4*time.Second)))
		p := h.get(parent.ID)
		require.Equal(h.t, store.StatusReady, p.Status)
		require.Equal(h.t, "joined", h.claimOne("w", at(5*time.Second)).Step)
	}},
	{"cancel/retry clears a cancel that was requested", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(0))
		require.NoError(h.t, h.s.Cancel(h.ctx, id, at(time.Second)))
		h.commit("w", at(2*time.Second), next(c, "b"))
		require.NoError(h.t, h.s.Retry(h.ctx, id, at(3*time.Second)))
		c = h.claimOne("w", at(4*time.Second))
		require.False(h.t, c.CancelRequested)
		h.commit("w", at(5*time.Second), next(c, "c"))
		h.requireStatus(store.StatusReady, id)
	}},
	{"cancel/ready, terminal and missing instances", func(h *harness) {
		ids := h.insertKeyed("", 2)
		require.NoError(h.t, h.s.Cancel(h.ctx, ids[0], at(0)))
		h.requireStatus(store.StatusCanceled, ids[0])
		require.Equal(h.t, []string{ids[1]}, claimedIDs(h.claim("w", 10, at(time.Second))))
		require.ErrorIs(h.t, h.s.Cancel(h.ctx, ids[0], at(2*time.Second)), store.ErrTerminal)
		require.ErrorIs(h.t, h.s.Cancel(h.ctx, uuid.NewString(), at(2*time.Second)), store.ErrNotFound)

		// A canceled instance can be retried.
		require.NoError(h.t, h.s.Retry(h.ctx, ids[0], at(3*time.Second)))
		h.requireStatus(store.StatusReady, ids[0])
		require.Equal(h.t, ids[:1], claimedIDs(h.claim("w", 10, at(4*time.Second))))
	}},
	{"cancel/an awaiting instance is canceled and no longer woken", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(0))
		o := await(c, "go", "after")
		o.TimeoutAt = at(time.Minute)
		h.commit("w", at(time.Second), o)
		require.NoError(h.t, h.s.Cancel(h.ctx, id, at(2*time.Second)))
		_, err := h.s.Signal(h.ctx, store.SignalRequest{InstanceID: id, Name: "go", Now: at(3 * time.Second)})
		require.ErrorIs(h.t, err, store.ErrTerminal)
		n, err := h.s.FireTimers(h.ctx, at(time.Hour))
		require.NoError(h.t, err)
		require.Zero(h.t, n, "a canceled await's timer does not fire")
		h.requireStatus(store.StatusCanceled, id)
	}},
	{"cancel/retry makes a failed instance ready at attempt 0", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(0))
		o := next(c, "charge")
		o.Attempt = 2
		h.commit("w", at(time.Second), o)
		c = h.claimOne("w", at(2*time.Second))
		h.commit("w", at(3*time.Second), store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeFailed, Error: "card declined"})
		got := h.get(id)
		require.Equal(h.t, store.StatusFailed, got.Status)
		require.Equal(h.t, "card declined", got.LastError)

		require.NoError(h.t, h.s.Retry(h.ctx, id, at(4*time.Second)))
		got = h.get(id)
		require.Equal(h.t, store.StatusReady, got.Status)
		require.Equal(h.t, 0, got.Attempt)
		require.Equal(h.t, "charge", got.Step)
		c = h.claimOne("w", at(5*time.Second))
		require.Equal(h.t, id, c.ID)
		require.Error(h.t, h.s.Retry(h.ctx, id, at(6*time.Second)), "an executing instance cannot be retried")
		require.ErrorIs(h.t, h.s.Retry(h.ctx, uuid.NewString(), at(6*time.Second)), store.ErrNotFound)
		h.commit("w", at(7*time.Second), store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone, Result: json.RawMessage(`{"paid":1}`)})
		got = h.get(id)
		require.Equal(h.t, store.StatusDone, got.Status)
		require.JSONEq(h.t, `{"paid":1}`, string(got.Result))
	}},
}
