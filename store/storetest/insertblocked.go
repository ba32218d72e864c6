package storetest

import (
	"slices"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

// dueNow is inst(k) due at the store's clock (a zero RunAt), so that Insert
// puts it on the pick path (or, behind a busy K = 1 key, in blocked) at
// once rather than scheduling it for base.
func dueNow(k string) store.NewInstance {
	ni := inst(k)
	ni.RunAt = time.Time{}
	return ni
}

// holdKey inserts a row of key k and claims it: the key's holder.
func (h *harness) holdKey(k string) store.Claimed {
	h.t.Helper()
	return h.hold(dueNow(k))
}

// hold inserts ni, due now, and claims it for worker "w" at base: the
// holder of its keys.
func (h *harness) hold(ni store.NewInstance) store.Claimed {
	h.t.Helper()
	id := h.insert(ni)[0]
	c := h.claimOne("w", at(0))
	require.Equal(h.t, id, c.ID)
	return c
}

// runsNext drains the queue (claims, and completes every row claimed) until
// id is claimed, without a Reconcile, and fails if it is not within a few
// rounds: the rows ahead of it (a released or reaped holder) run first.
func (h *harness) runsNext(id string, from time.Duration) {
	h.t.Helper()
	for i := range 4 {
		now := at(from + time.Duration(i)*time.Second)
		for _, c := range h.claim("w", 10, now) {
			if c.ID == id {
				return
			}
			h.commit("w", now, done(c))
		}
	}
	h.t.Fatalf("%s never ran (status %s)", id, h.status(id))
}

var insertBlockedTests = []test{
	{"keys/a row inserted behind a busy K = 1 key is blocked at once", func(h *harness) {
		h.holdKey("acct:1")
		b := h.insert(dueNow("acct:1"))[0]
		h.requireStatus(store.StatusBlocked, b)
		// Behind blocked rows, the key's next row waits too.
		c := h.insert(dueNow("acct:1"))[0]
		h.requireStatus(store.StatusBlocked, c)
		info := h.keyInfo("acct:1")
		require.Equal(h.t, 2, info.Blocked)
		require.Equal(h.t, 2, info.Waiting)
		require.Equal(h.t, int64(2), h.queueHealth(h.health(at(0)), queue).Blocked)

		// A row of a free key, and a delayed row of the busy key, go in as before.
		free := h.insert(dueNow("acct:2"))[0]
		h.requireStatus(store.StatusReady, free)
		later := inst("acct:1")
		later.RunAt = time.Now().Add(time.Hour)
		h.insert(later)
		require.NotEqual(h.t, store.StatusBlocked, h.status(later.ID))
		// A batch of a free key's rows goes in ready, up to the cap: the
		// claim admits the first.
		batch := []store.NewInstance{dueNow("acct:3"), dueNow("acct:3")}
		h.insert(batch...)
		h.requireStatus(store.StatusReady, batch[0].ID, batch[1].ID)
	}},
	{"keys/rows of a K = 1 key past its cap of ready rows go in blocked and run in order", func(h *harness) {
		// Rows already ready count toward the cap.
		var ids []string
		for range admission.ReadyCap - 2 {
			ids = append(ids, h.insert(dueNow("acct:1"))...)
		}
		h.requireStatus(store.StatusReady, ids...)
		// A batch whose input order is not promotion order: priority,
		// then run_at, then input order decide which rows stay ready. The
		// rows are due at the store's clock (the wall clock's past), as
		// dueNow's are.
		t0 := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
		mk := func(prio int, ago time.Duration) store.NewInstance {
			ni := dueNow("acct:1")
			ni.Priority, ni.RunAt = prio, t0.Add(-ago)
			return ni
		}
		batch := h.insert(mk(1, 3*time.Second), mk(0, time.Second), mk(0, 2*time.Second), mk(0, time.Second),
			dueNow("acct:2"))
		h.requireStatus(store.StatusReady, batch[2], batch[1], batch[4])
		h.requireStatus(store.StatusBlocked, batch[3], batch[0])
		// A key at its cap takes no more ready rows.
		last := h.insert(dueNow("acct:1"))[0]
		h.requireStatus(store.StatusBlocked, last)
		info := h.keyInfo("acct:1")
		require.Equal(h.t, admission.ReadyCap, info.Waiting-info.Blocked)
		require.Equal(h.t, 3, info.Blocked)
		// The reconciler leaves them: the key has no room beside its ready rows.
		require.Zero(h.t, h.reconcile(0, at(time.Second)).Promoted)
		h.requireStatus(store.StatusBlocked, batch[3], batch[0], last)

		// Every row runs once, one at a time (the claims block and promote
		// the key's rows in turn), the priority 1 row last.
		var order []string
		for i := range admission.ReadyCap + 6 {
			now := at(time.Duration(1+i) * time.Second)
			cs := h.claim("w", 10, now)
			n := 0
			for _, c := range cs {
				if c.Key == "acct:1" {
					order = append(order, c.ID)
					n++
				}
			}
			require.LessOrEqual(h.t, n, 1, "K = 1: one row of the key at a time")
			for _, c := range cs {
				h.commit("w", now, done(c))
			}
		}
		all := append(append(slices.Clone(ids), batch[:4]...), last)
		require.ElementsMatch(h.t, all, order)
		require.Equal(h.t, batch[0], order[len(order)-1])
	}},
	{"keys/a row inserted blocked runs after its holder completes", func(h *harness) {
		holder := h.holdKey("acct:1")
		b := h.insert(dueNow("acct:1"))[0]
		h.requireStatus(store.StatusBlocked, b)
		require.Empty(h.t, h.claim("w", 10, at(time.Second)), "a blocked row is off the pick path")
		h.commit("w", at(2*time.Second), done(holder))
		require.Equal(h.t, b, h.claimOne("w", at(2*time.Second)).ID)
	}},
	{"keys/a row inserted blocked is handed the slot its holder frees", func(h *harness) {
		holder := h.holdKey("acct:1")
		b := h.insert(dueNow("acct:1"))[0]
		got := h.handOff("w", at(time.Second), map[string]int{queue: 5}, done(holder))
		require.Equal(h.t, []string{b}, claimedIDs(got))
	}},
	{"keys/a row inserted blocked runs after its holder is released", func(h *harness) {
		holder := h.holdKey("acct:1")
		b := h.insert(dueNow("acct:1"))[0]
		require.NoError(h.t, h.s.Release(h.ctx, "w", []store.ClaimRef{ref(holder)}, at(time.Second)))
		h.runsNext(b, 2*time.Second)
	}},
	{"keys/a row inserted blocked runs after its holder is reaped", func(h *harness) {
		h.holdKey("acct:1")
		b := h.insert(dueNow("acct:1"))[0]
		require.Equal(h.t, 1, h.reap(at(2*lease)))
		h.runsNext(b, 2*lease+time.Second)
	}},
	{"keys/a row inserted blocked runs when the ready row ahead of it is canceled", func(h *harness) {
		holder := h.holdKey("acct:1")
		b1 := h.insert(dueNow("acct:1"))[0]
		b2 := h.insert(dueNow("acct:1"))[0]
		h.commit("w", at(time.Second), done(holder))
		h.requireStatus(store.StatusReady, b1)
		h.requireStatus(store.StatusBlocked, b2)
		require.NoError(h.t, h.s.Cancel(h.ctx, b1, at(2*time.Second)))
		h.requireStatus(store.StatusReady, b2)
		require.Equal(h.t, b2, h.claimOne("w", at(2*time.Second)).ID)
	}},
	{"keys/a gate key's rows are inserted ready whatever its slots", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 1})
		h.holdKey("stripe:a")
		b := h.insert(dueNow("stripe:a"))[0]
		h.requireStatus(store.StatusReady, b)
	}},
	{"keys/rows inserted blocked run in insertion order behind the rows blocked before them", func(h *harness) {
		// A holder and two rows that its claim blocks (the key was free
		// when they were inserted), then two rows inserted blocked.
		var ids []string
		for range 3 {
			ids = append(ids, h.insert(dueNow("acct:1"))...)
		}
		cs := h.claim("w", 10, at(0))
		require.Equal(h.t, ids[:1], claimedIDs(cs))
		h.requireStatus(store.StatusBlocked, ids[1:]...)
		for range 2 {
			ids = append(ids, h.insert(dueNow("acct:1"))...)
		}
		h.requireStatus(store.StatusBlocked, ids[3:]...)
		require.Equal(h.t, 4, h.keyInfo("acct:1").Blocked)

		order := []string{cs[0].ID}
		for i := range 4 {
			now := at(time.Duration(1+i) * time.Second)
			ex := h.executing("acct:1")
			require.Len(h.t, ex, 1)
			h.commit(ex[0].Worker, now, store.Outcome{ID: ex[0].ID, Fence: ex[0].Fence, Kind: store.OutcomeDone})
			order = append(order, h.claimOne("w", now).ID)
		}
		require.Equal(h.t, ids, order)
	}},
	{"keys/a schedule's tick behind a busy K = 1 key is blocked and runs after the holder", func(h *harness) {
		holder := h.holdKey("acct:1")
		sc := h.syncSchedules("workers", every5("tick"))[0]
		tick := sc.Anchor.Add(5 * time.Minute)
		ni := tickInstance("tick", tick)
		ni.Key, ni.RunAt = "acct:1", time.Time{}
		res := h.fire(store.FireRequest{Name: "tick", Epoch: sc.Epoch, Tick: tick, Instance: ni})
		require.NotEmpty(h.t, res.Inserted)
		h.requireStatus(store.StatusBlocked, res.Inserted)
		h.commit("w", at(time.Second), done(holder))
		require.Equal(h.t, res.Inserted, h.claimOne("w", at(time.Second)).ID)
	}},
	{"keys/a child spawned behind a busy K = 1 key is blocked and runs after the holder", func(h *harness) {
		holder := h.holdKey("acct:1")
		h.insert(dueNow(""))
		parent := h.claimOne("w", at(time.Second))
		o, kids := spawnOutcome(parent, 2, "acct:1")
		h.commit("w", at(2*time.Second), o)
		h.requireStatus(store.StatusBlocked, kids[1])
		require.Equal(h.t, kids[0], h.claimOne("w", at(3*time.Second)).ID, "the keyless child runs")
		h.commit("w", at(4*time.Second), done(holder))
		require.Equal(h.t, kids[1], h.claimOne("w", at(4*time.Second)).ID)
	}},
}
