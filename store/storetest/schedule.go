package storetest

import (
	"encoding/json"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

var scheduleTests = []test{
	{"schedule/a ready outcome with a future run_at waits", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(time.Second))
		o := next(c, "start")
		o.RunAt, o.Attempt, o.Error = at(10*time.Minute), 1, "boom"
		h.commit("w", at(2*time.Second), o)
		got := h.get(id)
		require.Equal(h.t, store.StatusReady, got.Status)
		require.Equal(h.t, 1, got.Attempt)
		require.Equal(h.t, "boom", got.LastError)
		near(h.t, at(10*time.Minute), got.RunAt, "run_at")

		res := h.claimReq(store.ClaimRequest{Worker: "w", Limit: 5, Now: at(time.Minute)})
		require.Empty(h.t, res.Claimed)
		near(h.t, at(10*time.Minute), res.NextDue, "next due is the retry's run_at")

		w := h.claimOne("w", at(10*time.Minute))
		require.Equal(h.t, 1, w.Attempt)
		require.JSONEq(h.t, `{"step":"start"}`, string(w.State))
	}},
	{"schedule/a sleeping row holds no slot", func(h *harness) {
		ids := h.insertKeyed("account:1", 2)
		c := h.claimOne("w", at(0))
		o := next(c, "wake")
		o.RunAt = at(time.Hour)
		h.commit("w", at(time.Second), o)
		require.Equal(h.t, ids[1:], claimedIDs(h.claim("w", 10, at(2*time.Second))), "the key is free while its holder sleeps")
	}},
	{"schedule/next due is the earliest run_at or timeout", func(h *harness) {
		later := inst("")
		later.RunAt = at(10 * time.Minute)
		h.insert(later)
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(time.Second))
		require.Equal(h.t, id, c.ID)
		o := await(c, "go", "after")
		o.TimeoutAt = at(3 * time.Minute)
		h.commit("w", at(2*time.Second), o)

		other := inst("")
		other.Queue = "elsewhere"
		other.RunAt = at(time.Minute)
		h.insert(other)

		res := h.claimReq(store.ClaimRequest{Worker: "w", Limit: 5, Now: at(5 * time.Second)})
		require.Empty(h.t, res.Claimed)
		near(h.t, at(3*time.Minute), res.NextDue, "the await's timeout comes first; other queues do not count")
	}},
	{"schedule/next due is zero when nothing is scheduled", func(h *harness) {
		h.insert(inst(""))
		res := h.claimReq(store.ClaimRequest{Worker: "w", Limit: 5, Now: at(time.Second)})
		require.Len(h.t, res.Claimed, 1)
		require.True(h.t, res.NextDue.IsZero(), "next due = %v", res.NextDue)
	}},
	{"schedule/next due is only reported when fewer than limit were claimed", func(h *harness) {
		h.insert(inst(""), inst(""))
		later := inst("")
		later.RunAt = at(time.Hour)
		later.State = json.RawMessage(`{"later":true}`)
		h.insert(later)
		res := h.claimReq(store.ClaimRequest{Worker: "w", Limit: 2, Now: at(time.Second)})
		require.Len(h.t, res.Claimed, 2)
		require.True(h.t, res.NextDue.IsZero())
		res = h.claimReq(store.ClaimRequest{Worker: "w", Limit: 2, Now: at(time.Second)})
		require.Empty(h.t, res.Claimed)
		near(h.t, at(time.Hour), res.NextDue, "next due")
	}},
}
