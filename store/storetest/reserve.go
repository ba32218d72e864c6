package storetest

import (
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// The reservation rules (store.Claimed.After, store.Outcome.Successor,
// store.HandOff.Reserve, store.ClaimRequest.Reserve), each run on a K = 1
// key and on a gate of limit 1: a reservation is a blocked row with the
// worker, which no claim, promotion or hand-off takes; the outcome that
// names it passes it its slot without touching the counter; released or
// reaped, it goes back to ready without crediting anything.

// reserveKeys are the keys the reservation rules run on, with their limits.
var reserveKeys = []struct {
	key    string
	limits []gate.Limit
}{
	{"acct:1", nil},
	{"hot:1", []gate.Limit{{Name: "hot", Limit: 1, Shards: 1}}},
}

// reserveRules are the rules run on each of reserveKeys, each in a store
// of its own (see reserveTests).
type reserveRule struct {
	name string
	fn   func(h *harness, k string)
}

// perKey makes one test of each rule per key of reserveKeys, with the
// key's limits set.
func perKey(rules ...reserveRule) []test {
	var out []test
	for _, r := range rules {
		for _, kc := range reserveKeys {
			out = append(out, test{r.name + " (" + kc.key + ")", func(h *harness) {
				if kc.limits != nil {
					h.syncLimits(kc.limits...)
				}
				r.fn(h, kc.key)
			}})
		}
	}
	return out
}

// slotsFree is a gate key's free slots (-1 for a K = 1 key, which has no
// counter).
func (h *harness) slotsFree(k string) int {
	h.t.Helper()
	info := h.keyInfo(k)
	if info.Shards == 0 {
		return -1
	}
	return info.Available
}

// completeHandOff runs CompleteHandOff for worker w and splits what it
// returns into rows made executing and reservations.
func (h *harness) completeHandOff(now time.Time, ho store.HandOff, outs ...store.Outcome) (res []store.OutcomeResult, running, reserved []store.Claimed) {
	h.t.Helper()
	if ho.Lease == 0 {
		ho.Lease = lease
	}
	res, got, err := h.s.(store.HandOffer).CompleteHandOff(h.ctx, "w", outs, now, ho)
	require.NoError(h.t, err)
	require.Len(h.t, res, len(outs))
	for _, c := range got {
		if c.After != "" {
			reserved = append(reserved, c)
		} else {
			running = append(running, c)
		}
	}
	return res, running, reserved
}

// chainStart holds key k with a claim, inserts n more rows of it (blocked
// behind the holder), and completes the holder with a hand-off that
// reserves ahead successors for the row it hands the slot to. It returns
// that row, the reservations and the ids of the n rows.
func (h *harness) chainStart(k string, n, ahead int) (store.Claimed, []store.Claimed, []string) {
	h.t.Helper()
	holder := h.holdKey(k)
	ids := h.insertKeyed(k, n)
	require.Empty(h.t, h.claim("w", 10, at(time.Second)), "the key is held: its rows are blocked")
	o := contended([]store.Outcome{done(holder)})[0]
	o.Ahead = ahead
	res, running, reserved := h.completeHandOff(at(2*time.Second), store.HandOff{Room: map[string]int{queue: 1}, Reserve: true}, o)
	require.False(h.t, res[0].Stale)
	require.Len(h.t, running, 1)
	require.Equal(h.t, ids[0], running[0].ID)
	return running[0], reserved, ids
}

// successor is o naming r as its successor.
func successor(o store.Outcome, r store.Claimed) store.Outcome {
	o.Successor = store.ClaimRef{ID: r.ID, Fence: r.Fence}
	o.Contended = true
	return o
}

func refs(cs ...store.Claimed) []store.ClaimRef {
	out := make([]store.ClaimRef, len(cs))
	for i, c := range cs {
		out[i] = store.ClaimRef{ID: c.ID, Fence: c.Fence}
	}
	return out
}

var reserveTests = append(perKey([]reserveRule{
	{"reserve/a hand-off reserves the key's next rows, which nothing else takes, and a chain passes one slot along", func(h *harness, k string) {
		first, reserved, ids := h.chainStart(k, 4, 2)
		before := h.slotsFree(k)
		require.LessOrEqual(h.t, before, 0, "the one slot is in use")
		require.Len(h.t, reserved, 2)
		require.Equal(h.t, ids[1:3], claimedIDs(reserved), "in the key's line")
		for _, r := range reserved {
			require.Equal(h.t, first.ID, r.After)
			require.NotZero(h.t, r.Fence)
			in := h.get(r.ID)
			require.Equal(h.t, store.StatusBlocked, in.Status)
			require.Equal(h.t, "w", in.Worker)
		}
		require.Equal(h.t, before, h.slotsFree(k), "a hand-off and reservations do not touch the counter")

		require.Empty(h.t, h.claim("other", 10, at(3*time.Second)), "no claim takes a reserved row")
		h.reconcile(0, at(3*time.Second))
		h.requireStatus(store.StatusBlocked, ids[1], ids[2])
		hb, err := h.s.Heartbeat(h.ctx, "w", refs(reserved...), lease, at(3*time.Second))
		require.NoError(h.t, err)
		require.Empty(h.t, hb.Lost, "a heartbeat renews reservations")

		// The chain first → reserved[0] → reserved[1], the reserved
		// row's outcome before its predecessor's in the batch.
		a, b := successor(done(first), reserved[0]), successor(done(reserved[0]), reserved[1])
		res, running, more := h.completeHandOff(at(4*time.Second), store.HandOff{Room: map[string]int{}, Reserve: true}, b, a)
		require.False(h.t, res[0].Stale, "the outcome of a reserved row whose predecessor's is in the batch")
		require.False(h.t, res[1].Stale)
		require.False(h.t, res[0].Yield || res[1].Yield, "the key's next row is in turn: the chain goes on")
		require.Empty(h.t, more, "Ahead 0: no more reservations")
		require.Equal(h.t, []string{reserved[1].ID}, claimedIDs(running), "the chain's end is passed the slot")
		require.Equal(h.t, reserved[1].Fence, running[0].Fence, "under the reservation's fence")
		h.requireStatus(store.StatusExecuting, reserved[1].ID)
		h.requireStatus(store.StatusDone, reserved[0].ID, first.ID)
		require.Len(h.t, h.executing(k), 1)
		require.Equal(h.t, before, h.slotsFree(k))

		// Its outcome frees the slot the usual way.
		h.commit("w", at(5*time.Second), done(running[0]))
		if before >= 0 {
			require.Equal(h.t, before+1, h.slotsFree(k))
		}
		require.Equal(h.t, ids[3], h.claimOne("other", at(6*time.Second)).ID)
	}},
	{"reserve/a claim asked for successors reserves the key's next rows of its window", func(h *harness, k string) {
		ids := h.insertKeyed(k, 4)
		res, err := h.s.Claim(h.ctx, store.ClaimRequest{Queue: queue, Worker: "w", Limit: 10, Lease: lease, Now: at(time.Second), Reserve: 2})
		require.NoError(h.t, err)
		require.Len(h.t, res.Claimed, 3, "the key's first row, then its next two reserved")
		holder := res.Claimed[0]
		require.Equal(h.t, ids[0], holder.ID)
		require.Empty(h.t, holder.After)
		require.True(h.t, holder.Contended, "its outcome passes its slot on")
		for i, r := range res.Claimed[1:] {
			require.Equal(h.t, ids[i+1], r.ID, "in the key's line")
			require.Equal(h.t, ids[0], r.After)
			require.True(h.t, r.Contended)
			require.Equal(h.t, store.StatusBlocked, h.status(r.ID))
		}
		require.Equal(h.t, store.StatusBlocked, h.status(ids[3]), "beyond Reserve: blocked")
		require.Empty(h.t, h.get(ids[3]).Worker)
		before := h.slotsFree(k)

		res2, running, _ := h.completeHandOff(at(2*time.Second), store.HandOff{Room: map[string]int{}},
			successor(done(holder), res.Claimed[1]))
		require.False(h.t, res2[0].Stale)
		require.Equal(h.t, []string{res.Claimed[1].ID}, claimedIDs(running))
		require.Equal(h.t, before, h.slotsFree(k))
		require.Empty(h.t, h.claim("other", 10, at(3*time.Second)), "the key is full, its rows reserved or blocked")

		// Without Reserve, a claim reserves nothing.
		k2 := k + "-plain"
		more := h.insertKeyed(k2, 3)
		cs := h.claim("w", 10, at(4*time.Second))
		require.Equal(h.t, more[:1], claimedIDs(cs))
		h.requireStatus(store.StatusBlocked, more[1:]...)
		require.Empty(h.t, h.get(more[1]).Worker)
	}},
	{"reserve/a released reservation and a reaped one go back to ready in their place, crediting nothing", func(h *harness, k string) {
		first, reserved, _ := h.chainStart(k, 4, 3)
		before := h.slotsFree(k)
		require.Len(h.t, reserved, 3)
		require.NoError(h.t, h.s.Release(h.ctx, "w", refs(reserved[0]), at(3*time.Second)))
		in := h.get(reserved[0].ID)
		require.Equal(h.t, store.StatusReady, in.Status)
		require.Empty(h.t, in.Worker)
		require.Equal(h.t, before, h.slotsFree(k), "a reservation holds no slot to give back")

		// Past every lease: the claim and the reservations left are reaped.
		require.Equal(h.t, 3, h.reap(at(time.Hour)))
		for _, r := range reserved[1:] {
			in := h.get(r.ID)
			require.Equal(h.t, store.StatusReady, in.Status)
			require.Empty(h.t, in.Worker)
		}
		// The outcomes of a reaped chain are stale: nothing commits.
		res, running, _ := h.completeHandOff(at(time.Hour+time.Second), store.HandOff{Room: map[string]int{}},
			successor(done(first), reserved[1]), done(reserved[1]))
		require.True(h.t, res[0].Stale, "the reaper took the claim back")
		require.True(h.t, res[1].Stale, "and the reservation")
		require.Empty(h.t, running)
		h.requireStatus(store.StatusReady, reserved[1].ID)
	}},
	{"reserve/an outcome whose reservation was given back frees its slot as without one", func(h *harness, k string) {
		first, reserved, _ := h.chainStart(k, 2, 1)
		require.Len(h.t, reserved, 1)
		before := h.slotsFree(k)
		require.NoError(h.t, h.s.Release(h.ctx, "w", refs(reserved[0]), at(3*time.Second)))
		res, running, _ := h.completeHandOff(at(4*time.Second), store.HandOff{Room: map[string]int{}},
			successor(done(first), reserved[0]))
		require.False(h.t, res[0].Stale)
		require.Empty(h.t, running)
		if before >= 0 {
			require.Equal(h.t, before+1, h.slotsFree(k), "credited")
		}
		require.Equal(h.t, reserved[0].ID, h.claimOne("other", at(5*time.Second)).ID)
	}},
	{"reserve/Complete refuses an outcome that names a successor, committing nothing", func(h *harness, k string) {
		first, reserved, _ := h.chainStart(k, 2, 1)
		require.Len(h.t, reserved, 1)
		_, err := h.s.Complete(h.ctx, "w", []store.Outcome{successor(done(first), reserved[0])}, at(3*time.Second))
		require.ErrorIs(h.t, err, store.ErrInvalid)
		h.requireStatus(store.StatusExecuting, first.ID)
		h.requireStatus(store.StatusBlocked, reserved[0].ID)
	}},
	{"reserve/a reserved row canceled never fails and keeps its reservation until its claim ends", func(h *harness, k string) {
		first, reserved, _ := h.chainStart(k, 3, 2)
		require.Len(h.t, reserved, 2)
		for _, r := range reserved {
			require.NoError(h.t, h.s.Cancel(h.ctx, r.ID, at(3*time.Second)))
			in := h.get(r.ID)
			require.Equal(h.t, store.StatusBlocked, in.Status, "its step may run in its predecessor's slot")
			require.True(h.t, in.CancelRequested)
			require.NoError(h.t, h.s.Cancel(h.ctx, r.ID, at(3*time.Second)), "a second cancel does nothing")
		}
		hb, err := h.s.Heartbeat(h.ctx, "w", refs(reserved...), lease, at(3*time.Second))
		require.NoError(h.t, err)
		require.ElementsMatch(h.t, refs(reserved...), hb.Canceled, "the worker hears of it")

		// Released before it started: canceled, and nothing runs it.
		require.NoError(h.t, h.s.Release(h.ctx, "w", refs(reserved[1]), at(4*time.Second)))
		h.requireStatus(store.StatusCanceled, reserved[1].ID)

		// Passed its slot (its step may have run): its outcome, not
		// terminal, cancels it, and only then is the slot freed.
		res, running, more := h.completeHandOff(at(5*time.Second), store.HandOff{Room: map[string]int{}, Reserve: true},
			successor(done(first), reserved[0]))
		require.False(h.t, res[0].Stale)
		require.Equal(h.t, []string{reserved[0].ID}, claimedIDs(running))
		require.Empty(h.t, more)
		h.commit("w", at(6*time.Second), next(running[0], "again"))
		h.requireStatus(store.StatusCanceled, reserved[0].ID)
		require.Empty(h.t, h.executing(k))
	}},
	{"reserve/a chain stops at its next flush when a better-priority row waits", func(h *harness, k string) {
		first, reserved, ids := h.chainStart(k, 4, 1)
		require.Len(h.t, reserved, 1)
		x := inst("")
		x.RunAt = at(0)
		x.Priority = -1
		h.insert(x)
		require.Empty(h.t, h.claimReq(store.ClaimRequest{Worker: "w", Limit: 1, Now: at(3 * time.Second), Workflows: versionOne("none")}).Claimed)
		h.requireStatus(store.StatusReady, x.ID)

		o := successor(done(first), reserved[0])
		o.Ahead = 2
		res, running, more := h.completeHandOff(at(4*time.Second), store.HandOff{Room: map[string]int{}, Reserve: true}, o)
		require.Equal(h.t, []string{reserved[0].ID}, claimedIDs(running), "the successor may run already: it takes the slot")
		require.Empty(h.t, more, "but no row of the key is reserved ahead of x")
		require.True(h.t, res[0].Yield, "and the worker is told to give back what it reserved after it")
		for _, id := range ids[2:] {
			require.Empty(h.t, h.get(id).Worker, "not reserved")
		}
		cs := h.claim("w", 10, at(5*time.Second))
		require.NotEmpty(h.t, cs)
		require.Equal(h.t, x.ID, cs[0].ID, "x first")
	}},
	{"reserve/a successor's outcome commits only while its predecessor's claim held", func(h *harness, k string) {
		first, reserved, _ := h.chainStart(k, 3, 1)
		require.Len(h.t, reserved, 1)
		// The reservation's lease outlives the claim's: the reaper takes
		// the claim back (and its slot) but not the reservation.
		hb, err := h.s.Heartbeat(h.ctx, "w", refs(reserved[0]), 10*lease, at(3*time.Second))
		require.NoError(h.t, err)
		require.Empty(h.t, hb.Lost)
		require.Equal(h.t, 1, h.reap(at(3*time.Second+lease)))
		h.requireStatus(store.StatusReady, first.ID)

		// The step that ran in the lost slot: its chain commits nothing.
		res, running, _ := h.completeHandOff(at(4*time.Second+lease), store.HandOff{Room: map[string]int{}},
			successor(done(first), reserved[0]), done(reserved[0]))
		require.True(h.t, res[0].Stale, "the claim was reaped")
		require.True(h.t, res[1].Stale, "its successor ran in a slot it never held")
		require.Empty(h.t, running)
		require.NotEqual(h.t, store.StatusDone, h.status(reserved[0].ID))
	}},
}...), test{"reserve/a lowered limit stops a chain at its next flush", func(h *harness) {
	h.syncLimits(gate.Limit{Name: "api", Limit: 2})
	k := "api:1"
	ids := h.insertKeyed(k, 6)
	res, err := h.s.Claim(h.ctx, store.ClaimRequest{Queue: queue, Worker: "w", Limit: 10, Lease: lease, Now: at(time.Second), Reserve: 1})
	require.NoError(h.t, err)
	require.Len(h.t, res.Claimed, 4, "two rows admitted, one successor each")
	holders, reserved := res.Claimed[:2], res.Claimed[2:]
	require.Equal(h.t, ids[:2], claimedIDs(holders))

	h.syncLimits(gate.Limit{Name: "api", Limit: 1})
	var outs []store.Outcome
	for i := range holders {
		o := successor(done(holders[i]), reserved[i])
		o.Ahead = 1
		outs = append(outs, o)
	}
	flushed, running, more := h.completeHandOff(at(2*time.Second), store.HandOff{Room: map[string]int{queue: 2}, Reserve: true}, outs...)
	require.Len(h.t, running, 2, "the successors may run already: they take their slots")
	require.Empty(h.t, more, "over the new limit, nothing more is reserved")
	require.True(h.t, flushed[0].Yield && flushed[1].Yield, "and the chains over the limit are told to stop")
	_, handed, more := h.completeHandOff(at(3*time.Second), store.HandOff{Room: map[string]int{queue: 2}, Reserve: true},
		contended([]store.Outcome{done(running[0]), done(running[1])})...)
	require.Empty(h.t, handed, "a key over its limit hands nothing off")
	require.Empty(h.t, more)
	require.Empty(h.t, h.executing(k))
	cs := h.claim("w", 10, at(4*time.Second))
	require.Len(h.t, cs, 1, "the new limit binds")
	require.Zero(h.t, h.reconcile(0, at(5*time.Second)).Drift)
}})
