package storetest

import (
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// normalizeTests pin the defaults and error classes every backend shares
// (store.NormalizeNewInstance, store.NormalizeClaim): a request means the
// same thing whichever store receives it.
var normalizeTests = []test{
	{"normalize/an empty queue is the default queue, on insert and on claim", func(h *harness) {
		ni := inst("")
		ni.Queue = ""
		id := h.insert(ni)[0]
		require.Equal(h.t, store.DefaultQueue, h.get(id).Queue)
		res, err := h.s.Claim(h.ctx, store.ClaimRequest{Worker: "w", Limit: 1, Lease: lease, Now: at(0)})
		require.NoError(h.t, err)
		require.Len(h.t, res.Claimed, 1)
		require.Equal(h.t, id, res.Claimed[0].ID)
		require.Equal(h.t, store.DefaultQueue, res.Claimed[0].Queue)
	}},
	{"normalize/a claim without a lease takes the default lease", func(h *harness) {
		h.insert(inst(""))
		res, err := h.s.Claim(h.ctx, store.ClaimRequest{Queue: queue, Worker: "w", Limit: 1, Now: at(0)})
		require.NoError(h.t, err)
		require.Len(h.t, res.Claimed, 1)
		near(h.t, at(store.DefaultLease), h.get(res.Claimed[0].ID).LeaseExpiresAt, "default lease")
	}},
	{"normalize/an id that is not a UUID or a missing step is invalid, and nothing is inserted", func(h *harness) {
		good := inst("")
		bad := inst("")
		bad.ID = "not-a-uuid"
		_, err := h.s.Insert(h.ctx, []store.NewInstance{good, bad})
		require.ErrorIs(h.t, err, store.ErrInvalid)
		noStep := inst("")
		noStep.Step = ""
		_, err = h.s.Insert(h.ctx, []store.NewInstance{noStep})
		require.ErrorIs(h.t, err, store.ErrInvalid)
		_, err = h.s.Get(h.ctx, good.ID)
		require.ErrorIs(h.t, err, store.ErrNotFound, "all or nothing")
	}},
	{"normalize/a claim without a worker is invalid", func(h *harness) {
		h.insert(inst(""))
		_, err := h.s.Claim(h.ctx, store.ClaimRequest{Queue: queue, Limit: 1, Lease: lease, Now: at(0)})
		require.ErrorIs(h.t, err, store.ErrInvalid)
	}},
	{"normalize/retrying an instance that is not failed or canceled is ErrNotRetryable", func(h *harness) {
		id := h.insert(inst(""))[0]
		err := h.s.Retry(h.ctx, id, at(0))
		require.ErrorIs(h.t, err, store.ErrNotRetryable)
	}},
	{"normalize/a claim returns an await whose timeout passed, without FireTimers", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(0))
		a := await(c, "go", "late")
		a.TimeoutAt = at(time.Minute)
		h.commit("w", at(time.Second), a)
		require.Empty(h.t, h.claim("w", 1, at(30*time.Second)))
		got := h.claimOne("w", at(2*time.Minute))
		require.Equal(h.t, id, got.ID)
		require.True(h.t, got.TimedOut)
		require.Equal(h.t, "late", got.Step)
	}},
}
