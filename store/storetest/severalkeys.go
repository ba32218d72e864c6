package storetest

import (
	"fmt"
	"slices"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

// severalKeys skips a rule of several keys per instance on a store that
// does not hold them (store.SeveralKeys); severalKeysRefused checks what
// such a store does instead.
func (h *harness) severalKeys() {
	h.t.Helper()
	if sk, ok := h.s.(store.SeveralKeys); !ok || !sk.HoldsSeveralKeys() {
		h.t.Skip("the store does not hold several keys per instance (store.SeveralKeys); severalKeys/a store that does not hold several keys refuses them checks it")
	}
}

// multi is inst(key) with the other keys also (K = 1 unless their name has
// a limit), due at once.
func multi(key string, also ...string) store.NewInstance {
	ni := dueNow(key)
	for _, k := range also {
		ni.Also = append(ni.Also, store.KeyRef{Key: k})
	}
	return ni
}

// insertHoldingGate inserts n rows, due now, each of an identity of its
// own (acct:i) and gate key k as its other key, one insert each (in
// order), and returns their ids.
func (h *harness) insertHoldingGate(k string, n int) []string {
	h.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ni := multi(fmt.Sprintf("acct:%d", i), k)
		ni.Also[0].Intent = gate.GateIntent
		ids[i] = h.insert(ni)[0]
	}
	return ids
}

// fillGate makes gate key stripe:big, of limit slots, full: it inserts n
// rows holding it as another key (insertHoldingGate), claims them at 1 s,
// and checks that the first limit of them run and the rest are blocked.
// It returns the rows' ids and the claimed rows.
func (h *harness) fillGate(limit, n int) ([]string, []store.Claimed) {
	h.t.Helper()
	h.syncLimits(gate.Limit{Name: "stripe", Limit: limit})
	ids := h.insertHoldingGate("stripe:big", n)
	cs := h.claim("w", 10, at(time.Second))
	require.Equal(h.t, ids[:limit], claimedIDs(cs))
	h.requireStatus(store.StatusBlocked, ids[limit:]...)
	return ids, cs
}

// claimIDs claims up to 10 rows for worker w at now and returns their ids.
func (h *harness) claimIDs(now time.Time) []string {
	h.t.Helper()
	return claimedIDs(h.claim("w", 10, now))
}

// byID is the claimed row with id, failing when it is not there.
func (h *harness) byID(cs []store.Claimed, id string) store.Claimed {
	h.t.Helper()
	for _, c := range cs {
		if c.ID == id {
			return c
		}
	}
	h.t.Fatalf("%s not claimed (status %s)", id, h.status(id))
	return store.Claimed{}
}

var severalKeysTests = []test{
	{"severalKeys/more than four keys, a key twice or other keys without a key is ErrInvalid, and nothing is stored", func(h *harness) {
		for name, ni := range map[string]store.NewInstance{
			"five keys":         multi("a:1", "a:2", "a:3", "a:4", "a:5"),
			"a key twice":       multi("a:1", "b:1", "a:1"),
			"no key":            multi("", "a:1"),
			"an invalid key":    multi("a:1", "not a key"),
			"an empty also key": multi("a:1", ""),
		} {
			_, err := h.s.Insert(h.ctx, []store.NewInstance{ni})
			require.ErrorIs(h.t, err, store.ErrInvalid, name)
			_, err = h.s.Get(h.ctx, ni.ID)
			require.ErrorIs(h.t, err, store.ErrNotFound, "%s: nothing stored", name)
		}
	}},
	{"severalKeys/a store that does not hold several keys refuses them and stores nothing", func(h *harness) {
		if sk, ok := h.s.(store.SeveralKeys); ok && sk.HoldsSeveralKeys() {
			h.t.Skip("the store holds several keys: the severalKeys/ rules check them")
		}
		ni := multi("acct:1", "api:x")
		_, err := h.s.Insert(h.ctx, []store.NewInstance{ni})
		require.ErrorIs(h.t, err, store.ErrInvalid)
		require.ErrorIs(h.t, err, store.ErrSeveralKeys)
		_, err = h.s.Get(h.ctx, ni.ID)
		require.ErrorIs(h.t, err, store.ErrNotFound)

		c := h.holdKey("acct:1")
		o := next(c, "two")
		o.SetKey, o.Key, o.Also = true, "acct:1", []store.KeyRef{{Key: "api:x"}}
		_, err = h.s.Complete(h.ctx, "w", []store.Outcome{o}, at(time.Second))
		require.ErrorIs(h.t, err, store.ErrSeveralKeys)
		h.requireStatus(store.StatusExecuting, c.ID)
	}},
	{"severalKeys/the first key is chosen the same way whatever order the keys come in", func(h *harness) {
		h.severalKeys()
		gateFirst := multi("api:x", "acct:1", "acct:0")
		gateFirst.KeyIntent = gate.GateIntent
		identityFirst := multi("acct:1", "acct:0", "api:x")
		identityFirst.Also[1].Intent = gate.GateIntent
		allGates := multi("b:2", "b:1")
		allGates.KeyIntent, allGates.Also[0].Intent = gate.GateIntent, gate.GateIntent
		ids := h.insert(gateFirst, identityFirst, allGates)
		for _, id := range ids[:2] {
			in := h.get(id)
			require.Equal(h.t, "acct:0", in.Key, "the first key of no intent or an identity, in key order")
			require.Equal(h.t, []store.KeyRef{{Key: "acct:1"}, {Key: "api:x", Intent: gate.GateIntent}}, in.Also)
		}
		in := h.get(ids[2])
		require.Equal(h.t, "b:1", in.Key, "every key a gate: the first")
		require.Equal(h.t, []store.KeyRef{{Key: "b:2", Intent: gate.GateIntent}}, in.Also)
	}},
	{"severalKeys/a row runs only when each of its keys has room, and a key that refuses it takes nothing of the others", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 1})
		holder := h.holdKey("api:x")
		m := h.insert(multi("acct:1", "api:x"))[0]
		require.Empty(h.t, h.claimIDs(at(time.Second)))
		h.requireStatus(store.StatusBlocked, m)
		require.Equal(h.t, "api:x", h.get(m).BlockedOn, "blocked on the key that refused it")

		// acct:1 is free: a row of it alone runs.
		one := h.insert(dueNow("acct:1"))[0]
		require.Equal(h.t, []string{one}, h.claimIDs(at(2*time.Second)))

		// api:x frees; acct:1 is held now: the row is blocked on acct:1.
		h.commit("w", at(3*time.Second), done(holder))
		require.Empty(h.t, h.claimIDs(at(4*time.Second)))
		h.requireStatus(store.StatusBlocked, m)
		require.Equal(h.t, "acct:1", h.get(m).BlockedOn)
		require.Equal(h.t, 1, h.available("api:x"), "the row blocked on acct:1 took no slot of api:x")

		// acct:1 frees: the row runs, holding both.
		h.commit("w", at(5*time.Second), done(store.Claimed{Instance: h.get(one)}))
		cs := h.claim("w", 10, at(6*time.Second))
		c := h.byID(cs, m)
		require.Equal(h.t, "acct:1", c.Key)
		require.Equal(h.t, []int{0}, c.AlsoShards, "the shard of api:x it debited")
		require.Zero(h.t, h.available("api:x"))
	}},
	{"severalKeys/a row holds every key while it executes, and frees every key at its end", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 1})
		c := h.hold(multi("acct:1", "api:x"))
		m := c.ID
		acct := h.insert(dueNow("acct:1"))[0]
		api := h.insert(dueNow("api:x"))[0]
		require.Empty(h.t, h.claimIDs(at(time.Second)), "both keys are held")
		for _, k := range []string{"acct:1", "api:x"} {
			require.Equal(h.t, []string{m}, idsOf(h.keyInfo(k).Holders), "%s's holders", k)
			require.Equal(h.t, []string{m}, idsOf(h.executing(k)), "List by %s", k)
		}
		h.commit("w", at(2*time.Second), done(c))
		require.ElementsMatch(h.t, []string{acct, api}, h.claimIDs(at(3*time.Second)))
	}},
	{"severalKeys/the only row in sight of the busy K = 1 key in its key column stays ready, and runs once the key frees", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 2})
		// The row of several keys is due only after acct:1's holder is
		// claimed: inserted while acct:1 was held it would go in blocked,
		// and in one window with the holder it would be the key's second
		// row in sight.
		later := multi("acct:1", "api:x")
		later.RunAt = at(1500 * time.Millisecond)
		ids := h.insert(dueNow("acct:1"), later)
		holder := h.claimOne("w", at(time.Second))
		require.Equal(h.t, ids[0], holder.ID)
		require.Empty(h.t, h.claimIDs(at(2*time.Second)), "acct:1 is held")
		h.requireStatus(store.StatusReady, ids[1])
		require.Equal(h.t, 2, h.available("api:x"), "left ready, it took nothing of api:x")

		h.commit("w", at(3*time.Second), done(holder))
		require.Equal(h.t, ids[1:], h.claimIDs(at(4*time.Second)))
	}},
	{"severalKeys/a blocked row is woken by the key that blocked it, not by its others", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 1})
		acct := h.holdKey("acct:1")
		api := h.holdKey("api:x")
		m := h.insert(multi("acct:1", "api:x"))[0]
		require.Empty(h.t, h.claimIDs(at(time.Second)))
		require.Equal(h.t, "acct:1", h.get(m).BlockedOn, "the first full key in key order")
		info := h.keyInfo("acct:1")
		require.Equal(h.t, [3]int{1, 1, 0}, [3]int{info.Waiting, info.Blocked, info.WaitingElsewhere}, "acct:1's line holds it")
		require.Equal(h.t, m, info.NextInLine.ID)
		info = h.keyInfo("api:x")
		require.Equal(h.t, [3]int{0, 0, 1}, [3]int{info.Waiting, info.Blocked, info.WaitingElsewhere}, "api:x's does not: it waits for acct:1")
		require.Nil(h.t, info.NextInLine)

		h.commit("w", at(2*time.Second), done(api))
		h.requireStatus(store.StatusBlocked, m)
		h.commit("w", at(3*time.Second), done(acct))
		h.requireStatus(store.StatusReady, m)
		require.Equal(h.t, []string{m}, h.claimIDs(at(4*time.Second)))
	}},
	{"severalKeys/a row inserted while its gate is full goes in blocked in the gate's line, and the gate's freed slot is handed to it", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 1})
		gated := func(acct, api string) store.NewInstance {
			ni := multi(acct, api)
			ni.Also[0].Intent = gate.GateIntent
			return ni
		}
		holder := h.hold(gated("acct:0", "api:x"))
		w := h.insert(gated("acct:1", "api:x"))[0]
		roomy := h.insert(gated("acct:2", "api:y"))[0]
		h.requireStatus(store.StatusBlocked, w)
		h.requireStatus(store.StatusReady, roomy)
		in := h.get(w)
		require.Equal(h.t, "api:x", in.BlockedOn, "the gate has no free slot")
		require.Equal(h.t, "acct:1", in.Key, "its keys read in their one order, wherever it waits")
		info := h.keyInfo("api:x")
		require.Equal(h.t, [3]int{1, 1, 0}, [3]int{info.Waiting, info.Blocked, info.WaitingElsewhere}, "api:x's line holds it")
		require.Equal(h.t, w, info.NextInLine.ID)
		info = h.keyInfo("acct:1")
		require.Equal(h.t, [3]int{0, 0, 1}, [3]int{info.Waiting, info.Blocked, info.WaitingElsewhere}, "acct:1's does not: it waits for api:x")

		require.Equal(h.t, []string{roomy}, h.claimIDs(at(time.Second)), "off the pick path: the claim reads the row whose gate has room only")
		got := h.handOff("w", at(2*time.Second), map[string]int{queue: 1}, done(holder))
		require.Equal(h.t, []string{w}, claimedIDs(got), "api:x's freed slot goes to its line's head, which takes acct:1 with it")
		for _, k := range []string{"acct:1", "api:x"} {
			require.Equal(h.t, []string{w}, idsOf(h.keyInfo(k).Holders), "%s's holders", k)
		}
	}},
	{"severalKeys/the rows an insert puts behind a full gate take its free slots in promotion order, the rest wait in its line for a freed slot", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 3})
		h.hold(multi("acct:0", "api:x"))
		batch := make([]store.NewInstance, 4)
		for i := range batch {
			batch[i] = multi(fmt.Sprintf("acct:%d", i+1), "api:x")
		}
		batch[3].Priority = -1 // first in promotion order
		ids := h.insert(batch...)
		h.requireStatus(store.StatusReady, ids[3], ids[0])
		h.requireStatus(store.StatusBlocked, ids[1], ids[2])
		cs := h.claim("w", 10, at(time.Second))
		require.ElementsMatch(h.t, []string{ids[3], ids[0]}, claimedIDs(cs), "off the pick path, the others")
		require.Equal(h.t, 0, h.slotsFree("api:x"))

		// A slot credited the usual way (an outcome not contended)
		// promotes the line's head.
		h.commit("w", at(2*time.Second), done(h.byID(cs, ids[3])))
		h.requireStatus(store.StatusReady, ids[1])
		h.requireStatus(store.StatusBlocked, ids[2])
		require.Equal(h.t, []string{ids[1]}, h.claimIDs(at(3*time.Second)))
	}},
	{"severalKeys/an insert's rows of a gate go in behind the rows waiting in its line, even while it has free slots", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 2})
		first := h.insert(multi("acct:1", "api:x"), multi("acct:2", "api:x"), multi("acct:3", "api:x"))
		h.requireStatus(store.StatusReady, first[0], first[1])
		h.requireStatus(store.StatusBlocked, first[2])
		require.Equal(h.t, 2, h.slotsFree("api:x"), "no claim yet: the ready rows have not taken the free slots")

		// A second batch while no claim has run: taking the free slots, its
		// rows would pass the row waiting in the gate's line.
		second := h.insert(multi("acct:4", "api:x"), multi("acct:5", "api:x"))
		h.requireStatus(store.StatusBlocked, second...)
		for _, id := range second {
			require.Equal(h.t, "api:x", h.get(id).BlockedOn, "behind the row waiting in api:x's line")
		}
		cs := h.claim("w", 10, at(time.Second))
		require.ElementsMatch(h.t, first[:2], claimedIDs(cs), "the first batch's ready rows take the slots; nothing is left to block")
		h.commit("w", at(2*time.Second), done(h.byID(cs, first[0])))
		h.requireStatus(store.StatusReady, first[2])
		h.requireStatus(store.StatusBlocked, second...)
		require.Equal(h.t, []string{first[2]}, h.claimIDs(at(3*time.Second)), "the line's head first")
	}},
	{"severalKeys/rows a full gate would block wait in their first key's line when a row of that key goes in ready ahead of them", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "hot", Limit: 1})
		ids := h.insert(multi("acct:1", "hot:x"), multi("acct:1", "hot:x"), multi("acct:2", "hot:x"))
		h.requireStatus(store.StatusReady, ids[0])
		h.requireStatus(store.StatusBlocked, ids[1], ids[2])
		require.Equal(h.t, "acct:1", h.get(ids[1]).BlockedOn, "behind the row of its account that takes the gate's slot, as a claim would block it (acct:1 comes first in key order)")
		require.Equal(h.t, "hot:x", h.get(ids[2]).BlockedOn, "no row of acct:2 ahead: the gate's line")
		require.Equal(h.t, []string{ids[0]}, h.claimIDs(at(time.Second)))
	}},
	{"severalKeys/a reservation in a full gate's line is no row waiting there: an insert's row still waits in its first key's line", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "hot", Limit: 1})
		_, reserved, x := h.chainStart("hot:x", 2, 1)
		require.Equal(h.t, []string{x[1]}, claimedIDs(reserved), "hot:x's line holds a reservation only")
		h.holdKey("hot:y")
		y := h.insert(multi("acct:5", "hot:y"))[0]
		require.Equal(h.t, "hot:y", h.get(y).BlockedOn, "it waits in hot:y's line")

		ids := h.insert(dueNow("acct:1"), multi("acct:1", "hot:x"), multi("acct:1", "hot:y"))
		h.requireStatus(store.StatusReady, ids[0])
		h.requireStatus(store.StatusBlocked, ids[1], ids[2])
		require.Equal(h.t, "acct:1", h.get(ids[1]).BlockedOn, "no row waits in hot:x's line: behind the row of its account that goes in ready")
		require.Equal(h.t, "hot:y", h.get(ids[2]).BlockedOn, "a row waits in hot:y's line: in that line, behind it")
	}},
	{"severalKeys/a row woken by a key waits in that key's line until a claim takes it", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 1})
		api := h.holdKey("api:x")
		m := h.insert(multi("acct:1", "api:x"))[0]
		require.Empty(h.t, h.claimIDs(at(time.Second)))
		require.Equal(h.t, "api:x", h.get(m).BlockedOn)

		h.commit("w", at(2*time.Second), done(api))
		h.requireStatus(store.StatusReady, m)
		in := h.get(m)
		require.Equal(h.t, "acct:1", in.Key, "its keys read in their one order, wherever it waits")
		require.Empty(h.t, in.BlockedOn, "ready: blocked on nothing")
		info := h.keyInfo("api:x")
		require.Equal(h.t, [3]int{1, 0, 0}, [3]int{info.Waiting, info.Blocked, info.WaitingElsewhere}, "promoted by api:x, it waits in api:x's line")
		require.Equal(h.t, m, info.NextInLine.ID)
		info = h.keyInfo("acct:1")
		require.Equal(h.t, [3]int{0, 0, 1}, [3]int{info.Waiting, info.Blocked, info.WaitingElsewhere})

		c := h.byID(h.claim("w", 10, at(3*time.Second)), m)
		require.Equal(h.t, "acct:1", c.Key)
		for _, k := range []string{"acct:1", "api:x"} {
			info = h.keyInfo(k)
			require.Equal(h.t, []string{m}, idsOf(info.Holders), "%s's holders", k)
			require.Equal(h.t, [3]int{0, 0, 0}, [3]int{info.Waiting, info.Blocked, info.WaitingElsewhere}, "%s: claimed, it waits in no line", k)
		}
	}},
	{"severalKeys/raising a key's own limit admits at once the rows that hold it as another key", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		ids := h.insertHoldingGate("stripe:big", 6)
		require.Len(h.t, h.claim("w", 10, at(time.Second)), 2)
		h.requireStatus(store.StatusBlocked, ids[2:]...)
		for _, id := range ids[2:] {
			require.Equal(h.t, "stripe:big", h.get(id).BlockedOn)
		}

		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2}, gate.Limit{Name: "stripe:big", Limit: 5})
		h.requireStatus(store.StatusReady, ids[2:5]...)
		h.requireStatus(store.StatusBlocked, ids[5])
		require.ElementsMatch(h.t, ids[2:5], claimedIDs(h.claim("w", 10, at(2*time.Second))), "no reconcile needed")
		require.Len(h.t, h.executing("stripe:big"), 5)
		require.Empty(h.t, h.claim("w", 10, at(3*time.Second)))
		require.Zero(h.t, h.reconcile(0, at(4*time.Second)).Drift)
	}},
	{"severalKeys/a limit change counts the live rows holding a key of the name or the key itself in any position", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2})
		h.commit("w", at(time.Second), done(h.hold(multi("acct:0", "stripe:big")))) // ended: not live
		held := h.hold(multi("acct:2", "stripe:big"))                               // stripe:big held as its other key
		require.Equal(h.t, "acct:2", held.Key)
		h.insert(multi("acct:1", "stripe:big"), multi("acct:3", "stripe:small", "stripe:tiny"), dueNow("stripe:big"))

		res := h.syncLimits(gate.Limit{Name: "stripe", Limit: 3}, gate.Limit{Name: "stripe:big", Limit: 4})
		require.Equal(h.t, map[string]int64{"stripe": 5, "stripe:big": 3}, res.Live,
			"a row counts once under each of its keys of the name; the ended row not at all")
	}},
	{"severalKeys/health counts a gate held as another key, and a row blocked on it, under the gate's name", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 1}, gate.Limit{Name: "zz", Limit: 5})
		gateFirst := func(also ...string) store.NewInstance {
			ni := multi("zz:1", also...)
			ni.KeyIntent = gate.GateIntent
			for i := range ni.Also {
				ni.Also[i].Intent = gate.GateIntent
			}
			return ni
		}
		c := h.hold(gateFirst("api:x")) // both gates: its first key is api:x (api:x < zz:1)
		require.Equal(h.t, "api:x", c.Key)
		held := h.hold(multi("acct:1", "api:y")) // api:y held as the other key of an identity
		require.Equal(h.t, "acct:1", held.Key)
		m := h.insert(multi("acct:2", "api:y"))[0]
		require.Empty(h.t, h.claimIDs(at(time.Second)))
		require.Equal(h.t, "api:y", h.get(m).BlockedOn)

		var api *store.GateHealth
		for _, g := range h.health(at(2 * time.Second)).Gates {
			if g.Name == "api" {
				api = &g
			}
		}
		require.NotNil(h.t, api)
		require.Equal(h.t, [4]int64{2, 1, 2, 1}, [4]int64{api.Active, int64(api.HighestKeyActive), int64(api.SaturatedKeys), api.BlockedReady},
			"active, most on one key, keys without room, rows blocked on its keys")

		k1 := h.insert(multi("acct:1", "zz:2"))[0] // acct:1 is held: it waits for acct:1, whatever zz:2 says
		require.Empty(h.t, h.claimIDs(at(3*time.Second)))
		require.Equal(h.t, "acct:1", h.get(k1).BlockedOn)
		require.Equal(h.t, []store.NameCount{{Name: "acct", Count: 1}, {Name: "api", Count: 1}}, h.health(at(4*time.Second)).BlockedBy,
			"each blocked row under the name of the key that blocked it")
	}},
	{"severalKeys/a crash frees every key: reaped, the K = 1 key at once and the gate's slot at the next reconcile", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 2})
		c := h.hold(multi("acct:1", "api:x"))
		m := c.ID
		require.Equal(h.t, 1, h.reap(at(2*lease)))
		require.Equal(h.t, 1, h.available("api:x"), "a reap does not credit (the step may still run)")
		h.reconcile(0, at(2*lease))
		require.Equal(h.t, 2, h.available("api:x"), "the reconciler restores the slot from the rows")
		h.requireStatus(store.StatusReady, m)
		h.insert(dueNow("acct:1"))
		require.Len(h.t, h.claimIDs(at(2*lease+time.Second)), 1, "acct:1 is free again, for one row")
	}},
	{"severalKeys/an outcome sets a row's keys: it then runs only when its new keys have room", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 1})
		c := h.holdKey("acct:1")
		m := c.ID
		api := h.holdKey("api:x")
		o := next(c, "charge")
		o.SetKey, o.Key, o.Also = true, "api:x", []store.KeyRef{{Key: "acct:1"}}
		o.KeyIntent = gate.GateIntent
		h.commit("w", at(time.Second), o)
		in := h.get(m)
		require.Equal(h.t, "acct:1", in.Key)
		require.Equal(h.t, []store.KeyRef{{Key: "api:x", Intent: gate.GateIntent}}, in.Also)
		require.Empty(h.t, h.claimIDs(at(2*time.Second)), "api:x is held")
		require.Equal(h.t, "api:x", h.get(m).BlockedOn)

		h.commit("w", at(3*time.Second), done(api))
		c = h.byID(h.claim("w", 10, at(4*time.Second)), m)
		o = next(c, "after")
		o.SetKey, o.Key = true, "acct:2" // the others go
		h.commit("w", at(5*time.Second), o)
		require.Nil(h.t, h.get(m).Also)
		require.Equal(h.t, 1, h.available("api:x"))
		require.Equal(h.t, []string{m}, h.claimIDs(at(6*time.Second)))
	}},
	{"severalKeys/a spawned child of several keys is stored as an inserted row is", func(h *harness) {
		h.severalKeys()
		c := h.holdKey("parent:1")
		o, kids := spawnOutcome(c, 1, "api:x")
		o.Children[0].KeyIntent = gate.GateIntent
		o.Children[0].Also = []store.KeyRef{{Key: "acct:1"}}
		h.commit("w", at(time.Second), o)
		in := h.get(kids[0])
		require.Equal(h.t, "acct:1", in.Key, "its keys in their one order")
		require.Equal(h.t, []store.KeyRef{{Key: "api:x", Intent: gate.GateIntent}}, in.Also)
	}},
	{"severalKeys/a freed slot goes to a row of several keys with its other K = 1 key when that key is free", func(h *harness) {
		h.severalKeys()
		holder := h.holdKey("acct:1")
		m := h.insert(multi("acct:1", "acct:9"))[0]
		after := h.insert(dueNow("acct:1"))[0]
		require.Empty(h.t, h.claimIDs(at(time.Second)))
		h.requireStatus(store.StatusBlocked, m, after)

		got := h.handOff("w", at(3*time.Second), map[string]int{queue: 5}, done(holder))
		require.Equal(h.t, []string{m}, claimedIDs(got), "the row of several keys, holding both keys")
		require.Equal(h.t, "acct:1", got[0].Key)
		require.Equal(h.t, []store.KeyRef{{Key: "acct:9"}}, got[0].Also)
		h.requireStatus(store.StatusBlocked, after)
		h.insert(dueNow("acct:9"))
		require.Empty(h.t, h.claimIDs(at(4*time.Second)), "acct:9 is held by the row handed acct:1's slot")
	}},
	{"severalKeys/a row holding a full gate as another key is claimed contended, so that its end may hand the gate's slot on", func(h *harness) {
		h.severalKeys()
		_, cs := h.fillGate(1, 2)
		require.Equal(h.t, "acct:0", cs[0].Key, "the gate is another key of the row")
		require.True(h.t, cs[0].Contended, "a row waits for the gate it holds")
	}},
	{"severalKeys/a batch that frees several slots of a gate hands them to as many rows of several keys, each with its own other key", func(h *harness) {
		h.severalKeys()
		ids, cs := h.fillGate(2, 4)

		got := h.handOff("w", at(2*time.Second), map[string]int{queue: 5}, done(cs[0]), done(cs[1]))
		require.ElementsMatch(h.t, ids[2:], claimedIDs(got), "both freed slots, each to a row with its own account")
		for _, c := range got {
			require.Equal(h.t, []store.KeyRef{{Key: "stripe:big", Intent: gate.GateIntent}}, c.Also)
		}
		h.insert(dueNow("acct:3"))
		require.Empty(h.t, h.claimIDs(at(3*time.Second)), "acct:3 is held by the row handed a slot")
	}},
	{"severalKeys/a gate with a slot to spare hands no slot to a row of several keys, so no slot is left without a row", func(h *harness) {
		h.severalKeys()
		ids, cs := h.fillGate(2, 4)
		// One holder ends without a hand-off: its slot is credited and
		// promotes the next row, which no claim has taken yet.
		h.commit("w", at(2*time.Second), done(cs[0]))
		h.requireStatus(store.StatusReady, ids[2])
		h.requireStatus(store.StatusBlocked, ids[3])
		// The other ends with a hand-off while the gate has that slot to
		// spare: handed to the promoted row, it would leave the spare slot
		// with no row to take it and the last row blocked.
		got := h.handOff("w", at(3*time.Second), map[string]int{queue: 5}, done(cs[1]))
		require.Empty(h.t, got, "a gate with a slot to spare hands nothing")
		require.ElementsMatch(h.t, ids[2:], h.claimIDs(at(4*time.Second)), "both slots go to the two rows left")
	}},
	{"severalKeys/a freed slot is not handed to a row of several keys whose other key is held, nor past it", func(h *harness) {
		h.severalKeys()
		holder := h.holdKey("acct:1")
		nine := h.insert(dueNow("acct:9"))[0]
		require.Equal(h.t, []string{nine}, h.claimIDs(at(time.Second/2)))
		m := h.insert(multi("acct:1", "acct:9"))[0]
		after := h.insert(dueNow("acct:1"))[0]
		require.Empty(h.t, h.claimIDs(at(time.Second)))
		h.requireStatus(store.StatusBlocked, m, after)

		got := h.handOff("w", at(2*time.Second), map[string]int{queue: 5}, done(holder))
		require.Empty(h.t, got, "neither the row of several keys nor the row behind it")
		h.requireStatus(store.StatusReady, m)
		h.requireStatus(store.StatusBlocked, after)
		require.Empty(h.t, h.claimIDs(at(3*time.Second)), "acct:9 is still held")
		require.Equal(h.t, "acct:9", h.get(m).BlockedOn)
	}},
	{"severalKeys/a row of several keys takes every slot a row of the same keys frees", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 1})
		r := h.hold(multi("acct:1", "api:x"))
		w := h.insert(multi("acct:1", "api:x"))[0]
		require.Empty(h.t, h.claimIDs(at(time.Second)))
		h.requireStatus(store.StatusBlocked, w)

		got := h.handOff("w", at(2*time.Second), map[string]int{queue: 5}, done(r))
		require.Equal(h.t, []string{w}, claimedIDs(got))
		require.Equal(h.t, []int{0}, got[0].AlsoShards, "api:x's shard, passed on")
		require.Zero(h.t, h.available("api:x"), "the gate's slot passed on, not credited")
		h.insert(dueNow("api:x"))
		require.Empty(h.t, h.claimIDs(at(3*time.Second)), "api:x is full")
		h.commit("w", at(4*time.Second), done(got[0]))
		require.Len(h.t, h.claimIDs(at(5*time.Second)), 1, "the gate's slot is back")
	}},
	{"severalKeys/a row of two K = 1 keys takes both keys a row of the same keys frees", func(h *harness) {
		h.severalKeys()
		r := h.hold(multi("acct:1", "acct:2"))
		w := h.insert(multi("acct:1", "acct:2"))[0]
		require.Empty(h.t, h.claimIDs(at(time.Second)))
		h.requireStatus(store.StatusBlocked, w)

		got := h.handOff("w", at(2*time.Second), map[string]int{queue: 5}, done(r))
		require.Equal(h.t, []string{w}, claimedIDs(got), "the ended row's hold of acct:2 frees with it")
		h.insert(dueNow("acct:2"))
		require.Empty(h.t, h.claimIDs(at(3*time.Second)), "acct:2 is held by the row handed the slots")
	}},
	{"severalKeys/a row of several keys does not pass a row waiting in its other key's line", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 1})
		r := h.hold(multi("acct:1", "api:x"))
		x := h.insert(dueNow("api:x"))[0]
		w := h.insert(multi("acct:1", "api:x"))[0]
		require.Empty(h.t, h.claimIDs(at(time.Second)))
		h.requireStatus(store.StatusBlocked, w)
		require.Contains(h.t, []store.Status{store.StatusReady, store.StatusBlocked}, h.get(x).Status, "x waits in api:x's line")

		got := h.handOff("w", at(2*time.Second), map[string]int{queue: 5}, done(r))
		require.Equal(h.t, []string{x}, claimedIDs(got), "api:x's slot goes to api:x's line")
		h.requireStatus(store.StatusReady, w)
		require.Empty(h.t, h.claimIDs(at(3*time.Second)), "api:x is full")
		require.Equal(h.t, "api:x", h.get(w).BlockedOn)
	}},
	{"severalKeys/a row that an outcome gives another key is not handed its own freed slot", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 1})
		api := h.holdKey("api:x")
		c := h.holdKey("acct:1")
		o := next(c, "charge")
		o.SetKey, o.Key, o.Also = true, "acct:1", []store.KeyRef{{Key: "api:x", Intent: gate.GateIntent}}
		got := h.handOff("w", at(time.Second), map[string]int{queue: 5}, o)
		require.Empty(h.t, got, "acct:1's slot would admit it under acct:1 alone: api:x is full")
		h.requireStatus(store.StatusReady, c.ID)
		require.Zero(h.t, h.available("api:x"))
		require.Empty(h.t, h.claimIDs(at(2*time.Second)))
		require.Equal(h.t, "api:x", h.get(c.ID).BlockedOn)

		h.commit("w", at(3*time.Second), done(api))
		require.Equal(h.t, []string{c.ID}, h.claimIDs(at(4*time.Second)))
	}},
	{"severalKeys/a hand-off reserves rows of the same keys after a row of several keys, and a chain passes every key's slot", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "g", Limit: 1})
		holder := h.hold(multi("acct:1", "g:x"))
		ids := h.insert(multi("acct:1", "g:x"), multi("acct:1", "g:x"), multi("acct:1", "g:x"), multi("acct:1", "g:y"))
		require.Empty(h.t, h.claimIDs(at(time.Second)), "both keys are held")
		o := contended([]store.Outcome{done(holder)})[0]
		o.Ahead = 3
		_, running, reserved := h.completeHandOff(at(2*time.Second), store.HandOff{Room: map[string]int{queue: 1}, Reserve: true}, o)
		require.Equal(h.t, []string{ids[0]}, claimedIDs(running), "the next row of the account, with the gate's slot its outcome freed")
		require.Equal(h.t, ids[1:3], claimedIDs(reserved), "the rows of the same keys after it, in line; not the row of another gate")
		for _, r := range reserved {
			require.Equal(h.t, ids[0], r.After)
		}
		h.requireStatus(store.StatusBlocked, ids[3])
		one, gx := h.insert(dueNow("acct:1"))[0], h.insert(dueNow("g:x"))[0]
		require.Empty(h.t, h.claimIDs(at(3*time.Second)), "the chain holds the account and the gate's one slot")

		// ids[0] → ids[1], then ids[1] → ids[2]: each successor is passed
		// both keys' slots, and nothing else runs meanwhile.
		_, running, more := h.completeHandOff(at(4*time.Second), store.HandOff{Room: map[string]int{}, Reserve: true}, successor(done(running[0]), reserved[0]))
		require.Equal(h.t, []string{ids[1]}, claimedIDs(running))
		require.Empty(h.t, more)
		require.Empty(h.t, h.claimIDs(at(5*time.Second)), "the successor holds both keys")
		require.Equal(h.t, 0, h.slotsFree("g:x"), "the gate's slot passed on, not freed")
		_, running, _ = h.completeHandOff(at(6*time.Second), store.HandOff{Room: map[string]int{}, Reserve: true}, successor(done(running[0]), reserved[1]))
		require.Equal(h.t, []string{ids[2]}, claimedIDs(running))
		require.Empty(h.t, h.claimIDs(at(7*time.Second)), "the successor holds both keys")

		// The chain's last outcome frees both keys the usual way.
		h.commit("w", at(8*time.Second), done(running[0]))
		require.Equal(h.t, 1, h.slotsFree("g:x"))
		got := h.claimIDs(at(9 * time.Second))
		require.Contains(h.t, got, gx, "the gate is free")
		require.True(h.t, slices.Contains(got, one) != slices.Contains(got, ids[3]), "the account is free, for one of its rows: %v", got)
	}},
	{"severalKeys/a claim reserves no row of several keys, and gives none successors", func(h *harness) {
		h.severalKeys()
		h.syncLimits(gate.Limit{Name: "api", Limit: 1})
		ids := []string{h.insert(multi("api:x", "acct:1"))[0], h.insert(dueNow("api:x"))[0], h.insert(dueNow("api:x"))[0]}
		res := h.claimReq(store.ClaimRequest{Queue: queue, Worker: "w", Limit: 10, Lease: lease, Now: at(time.Second), Reserve: 2})
		require.Equal(h.t, []string{ids[0]}, claimedIDs(res.Claimed), "no successor for a row of several keys")

		h.commit("w", at(2*time.Second), done(res.Claimed[0]))
		m := h.insert(multi("api:x", "acct:2"))[0]
		res = h.claimReq(store.ClaimRequest{Queue: queue, Worker: "w", Limit: 10, Lease: lease, Now: at(3 * time.Second), Reserve: 2})
		for _, c := range res.Claimed {
			require.NotEqual(h.t, m, c.ID, "a claim never reserves a row of several keys")
		}
	}},
	{"severalKeys/MaxActivePerKey counts a row under each of its keys", func(h *harness) {
		h.severalKeys()
		h.syncPolicies(store.DefaultNamespace, store.ConcurrencyPolicy{Queue: queue, MaxActive: 10, MaxActivePerKey: 1})
		h.syncLimits(gate.Limit{Name: "g", Limit: 5})
		c := h.hold(multi("g:a", "g:b"))
		a, b := h.insert(dueNow("g:a"))[0], h.insert(dueNow("g:b"))[0]
		require.Empty(h.t, h.claimIDs(at(time.Second)), "both keys have a row active in the queue")
		h.commit("w", at(2*time.Second), done(c))
		h.reconcile(0, at(2*time.Second)) // a policy's blocked rows wait for the reconciler or a freed slot
		require.ElementsMatch(h.t, []string{a, b}, h.claimIDs(at(3*time.Second)))
		c2 := h.insert(multi("g:0", "g:b"))[0]
		require.Equal(h.t, "g:0", h.get(c2).Key)
		require.Empty(h.t, h.claimIDs(at(4*time.Second)), "g:b, its other key, has a row active")
		require.Equal(h.t, "g:b", h.get(c2).BlockedOn)
	}},
}

// idsOf lists the ids of instances.
func idsOf(ins []store.Instance) []string {
	out := make([]string, len(ins))
	for i, in := range ins {
		out[i] = in.ID
	}
	return out
}
