package storetest

import (
	"encoding/json"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

var signalTests = []test{
	{"signals/await releases the slot", func(h *harness) {
		ids := h.insertKeyed("account:1", 2)
		c := h.claimOne("w", at(time.Second))
		require.Equal(h.t, ids[0], c.ID)
		h.commit("w", at(2*time.Second), await(c, "approved", "apply"))
		got := h.get(ids[0])
		require.Equal(h.t, store.StatusAwaiting, got.Status)
		require.Equal(h.t, "approved", got.AwaitSignal)
		require.Equal(h.t, "apply", got.Step)
		cs := h.claim("w", 10, at(3*time.Second))
		require.Equal(h.t, []string{ids[1]}, claimedIDs(cs), "the key is free while its holder awaits")
	}},
	{"signals/await credits a gate slot", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 1})
		ids := h.insertKeyed("stripe:a", 2)
		c := h.claimOne("w", at(time.Second))
		require.Equal(h.t, 0, h.available("stripe:a"))
		o := await(c, "approved", "apply")
		o.TimeoutAt = at(time.Hour)
		h.commit("w", at(2*time.Second), o)
		require.Equal(h.t, 1, h.available("stripe:a"), "parking is not executing")
		require.Equal(h.t, ids[1:], claimedIDs(h.claim("w", 10, at(3*time.Second))))
	}},
	{"signals/a signal wakes the await and the claim carries it", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(time.Second))
		h.commit("w", at(2*time.Second), await(c, "approved", "apply"))
		require.Empty(h.t, h.claim("w", 10, at(3*time.Second)), "an awaiting row is not claimable")
		res := h.signal(id, "approved", `{"by":"ann","n":[1,2]}`, at(4*time.Second))
		require.True(h.t, res.Woke)
		require.False(h.t, res.Duplicate)
		h.requireStatus(store.StatusReady, id)
		w := h.claimOne("w", at(5*time.Second))
		require.Equal(h.t, "apply", w.Step)
		require.NotNil(h.t, w.Signal)
		require.Positive(h.t, w.Signal.ID)
		require.Equal(h.t, id, w.Signal.InstanceID)
		require.Equal(h.t, "approved", w.Signal.Name)
		require.JSONEq(h.t, `{"n":[1,2],"by":"ann"}`, string(w.Signal.Payload))
		near(h.t, at(4*time.Second), w.Signal.CreatedAt, "signal created_at")
		require.False(h.t, w.TimedOut)
	}},
	{"signals/a signal of another name does not wake", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(time.Second))
		h.commit("w", at(2*time.Second), await(c, "approved", "apply"))
		res := h.signal(id, "rejected", `{}`, at(3*time.Second))
		require.False(h.t, res.Woke)
		h.requireStatus(store.StatusAwaiting, id)
	}},
	{"signals/a woken row re-admits through its key", func(h *harness) {
		ids := h.insertKeyed("account:1", 2)
		c := h.claimOne("w", at(time.Second))
		h.commit("w", at(2*time.Second), await(c, "go", "after"))
		other := h.claimOne("w", at(3*time.Second))
		require.Equal(h.t, ids[1], other.ID)
		require.True(h.t, h.signal(ids[0], "go", `{}`, at(4*time.Second)).Woke)
		require.Empty(h.t, h.claim("w", 10, at(5*time.Second)), "the woken row waits for the key's holder")
		require.NotEqual(h.t, store.StatusExecuting, h.status(ids[0]))
		h.commit("w", at(6*time.Second), done(other))
		w := h.claimOne("w", at(7*time.Second))
		require.Equal(h.t, ids[0], w.ID)
		require.NotNil(h.t, w.Signal, "the signal survives the wait for the key")
		require.Equal(h.t, "go", w.Signal.Name)
	}},
	{"signals/a signal sent before the await is delivered", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(time.Second))
		res := h.signal(id, "go", `{"early":true}`, at(2*time.Second))
		require.False(h.t, res.Woke, "the row executes: nothing to wake")
		h.commit("w", at(3*time.Second), await(c, "go", "after"))
		h.requireStatus(store.StatusReady, id)
		w := h.claimOne("w", at(4*time.Second))
		require.NotNil(h.t, w.Signal)
		require.Equal(h.t, "go", w.Signal.Name)
		require.JSONEq(h.t, `{"early":true}`, string(w.Signal.Payload))
	}},
	{"signals/a signal is consumed only when the outcome commits", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w1", at(time.Second))
		h.commit("w1", at(2*time.Second), await(c, "go", "after"))
		h.signal(id, "go", `{"v":1}`, at(3*time.Second))
		first := h.claimOne("w1", at(4*time.Second))
		require.NotNil(h.t, first.Signal)
		sig := first.Signal.ID

		// The lease expires; the old worker's outcome is stale and consumes nothing.
		require.Equal(h.t, 1, h.reap(at(4*time.Second+2*lease)))
		o := await(first, "go", "after-again")
		o.ConsumeSignal = sig
		h.stale("w1", at(5*time.Minute), o)

		second := h.claimOne("w2", at(6*time.Minute))
		require.NotNil(h.t, second.Signal, "the signal is redelivered to the next run")
		require.Equal(h.t, sig, second.Signal.ID)
		require.Equal(h.t, 1, second.Attempt)
		// Awaiting again without consuming: the signal is still in the inbox.
		h.commit("w2", at(7*time.Minute), await(second, "go", "after-again"))
		h.requireStatus(store.StatusReady, id)

		third := h.claimOne("w3", at(8*time.Minute))
		require.NotNil(h.t, third.Signal)
		require.Equal(h.t, sig, third.Signal.ID)
		o = await(third, "go", "final")
		o.ConsumeSignal = sig
		h.commit("w3", at(9*time.Minute), o)
		h.requireStatus(store.StatusAwaiting, id)
	}},
	{"signals/dedup key stores a signal once", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(time.Second))
		h.commit("w", at(2*time.Second), await(c, "go", "after"))
		req := store.SignalRequest{InstanceID: id, Name: "go", Payload: json.RawMessage(`{}`), DedupKey: "evt-1", Now: at(3 * time.Second)}
		res, err := h.s.Signal(h.ctx, req)
		require.NoError(h.t, err)
		require.Equal(h.t, store.SignalResult{Woke: true}, res)
		w := h.claimOne("w", at(4*time.Second))
		o := await(w, "go", "again")
		o.ConsumeSignal = w.Signal.ID
		h.commit("w", at(5*time.Second), o)

		res, err = h.s.Signal(h.ctx, req)
		require.NoError(h.t, err)
		require.Equal(h.t, store.SignalResult{Duplicate: true}, res)
		h.requireStatus(store.StatusAwaiting, id)

		req.DedupKey = "evt-2"
		res, err = h.s.Signal(h.ctx, req)
		require.NoError(h.t, err)
		require.Equal(h.t, store.SignalResult{Woke: true}, res)
	}},
	{"signals/missing and terminal instances are errors", func(h *harness) {
		_, err := h.s.Signal(h.ctx, store.SignalRequest{InstanceID: uuid.NewString(), Name: "go", Now: at(0)})
		require.ErrorIs(h.t, err, store.ErrNotFound)
		id := h.insert(inst(""))[0]
		h.commit("w", at(2*time.Second), done(h.claimOne("w", at(time.Second))))
		_, err = h.s.Signal(h.ctx, store.SignalRequest{InstanceID: id, Name: "go", Now: at(3 * time.Second)})
		require.ErrorIs(h.t, err, store.ErrTerminal)
	}},
	{"signals/await timeout fires", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(time.Second))
		o := await(c, "go", "timed")
		o.TimeoutAt = at(5 * time.Minute)
		h.commit("w", at(2*time.Second), o)
		near(h.t, at(5*time.Minute), h.get(id).TimeoutAt, "timeout_at")

		n, err := h.s.FireTimers(h.ctx, at(4*time.Minute))
		require.NoError(h.t, err)
		require.Zero(h.t, n)
		h.requireStatus(store.StatusAwaiting, id)

		n, err = h.s.FireTimers(h.ctx, at(5*time.Minute+time.Second))
		require.NoError(h.t, err)
		require.Equal(h.t, 1, n)
		h.requireStatus(store.StatusReady, id)
		w := h.claimOne("w", at(6*time.Minute))
		require.True(h.t, w.TimedOut)
		require.Nil(h.t, w.Signal)
		require.Equal(h.t, "timed", w.Step)

		// A later run is not a timeout any more.
		h.commit("w", at(7*time.Minute), next(w, "more"))
		require.False(h.t, h.claimOne("w", at(8*time.Minute)).TimedOut)
	}},
}
