package storetest

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

var queryTests = []test{
	{"history/recorded when the outcome carries it", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(0))
		o := next(c, "two")
		o.History = &store.HistoryEntry{Step: "start", Attempt: 0, Key: "", Worker: "w",
			StartedAt: at(0), FinishedAt: at(time.Second), Outcome: "next"}
		h.commit("w", at(time.Second), o)
		c = h.claimOne("w", at(2*time.Second))
		h.commit("w", at(3*time.Second), next(c, "three")) // no history
		c = h.claimOne("w", at(4*time.Second))
		o = store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeFailed, Error: "boom",
			History: &store.HistoryEntry{Step: "three", Attempt: 0, Worker: "w", StartedAt: at(4 * time.Second),
				FinishedAt: at(5 * time.Second), Outcome: "error", Error: "boom"}}
		h.commit("w", at(5*time.Second), o)

		hist, err := h.s.History(h.ctx, id)
		require.NoError(h.t, err)
		require.Len(h.t, hist, 2)
		require.Equal(h.t, id, hist[0].InstanceID)
		require.Equal(h.t, "start", hist[0].Step)
		require.Equal(h.t, "next", hist[0].Outcome)
		require.Equal(h.t, "w", hist[0].Worker)
		near(h.t, at(0), hist[0].StartedAt, "started")
		near(h.t, at(time.Second), hist[0].FinishedAt, "finished")
		require.Equal(h.t, "three", hist[1].Step)
		require.Equal(h.t, "error", hist[1].Outcome)
		require.Equal(h.t, "boom", hist[1].Error)

		// A stale outcome records nothing.
		require.NoError(h.t, h.s.Retry(h.ctx, id, at(6*time.Second)))
		c = h.claimOne("w", at(7*time.Second))
		o = next(c, "x")
		o.Fence++
		o.History = &store.HistoryEntry{Step: "three", Outcome: "next"}
		h.stale("w", at(8*time.Second), o)
		hist, err = h.s.History(h.ctx, id)
		require.NoError(h.t, err)
		require.Len(h.t, hist, 2)
	}},
	{"list/filters and pages by id", func(h *harness) {
		var all []string
		for i := range 7 {
			ni := inst(fmt.Sprintf("account:%d", i%2))
			if i%3 == 0 {
				ni.Workflow = "other"
			}
			if i == 6 {
				ni.Queue = "q2"
			}
			all = append(all, h.insert(ni)[0])
		}
		c := h.claimOne("w", at(0)) // the first row executes
		slices.Sort(all)

		require.Equal(h.t, all, listIDs(h.list(store.ListFilter{})), "ordered by id")
		for _, in := range h.list(store.ListFilter{Workflow: "other"}) {
			require.Equal(h.t, "other", in.Workflow)
		}
		require.Len(h.t, h.list(store.ListFilter{Workflow: "other"}), 3)
		require.Len(h.t, h.list(store.ListFilter{Key: "account:0"}), 4)
		require.Len(h.t, h.list(store.ListFilter{Queue: "q2"}), 1)
		exec := h.list(store.ListFilter{Status: store.StatusExecuting})
		require.Equal(h.t, []string{c.ID}, listIDs(exec))
		require.Len(h.t, h.list(store.ListFilter{Workflow: "other", Key: "account:0", Queue: queue}), 1)

		var paged []string
		after := ""
		for range len(all) + 1 {
			page := h.list(store.ListFilter{AfterID: after, Limit: 3})
			require.LessOrEqual(h.t, len(page), 3)
			if len(page) == 0 {
				break
			}
			paged = append(paged, listIDs(page)...)
			after = page[len(page)-1].ID
		}
		require.Equal(h.t, all, paged, "pages cover every row once, in id order")
	}},
	{"list/newest first pages by creation time, stable under ties", func(h *harness) {
		// Rows inserted together share a creation time: ties are broken by id.
		var want []store.Instance
		for range 3 {
			for _, id := range h.insert(inst(""), inst("")) {
				got, err := h.s.Get(h.ctx, id)
				require.NoError(h.t, err)
				want = append(want, got)
			}
		}
		slices.SortFunc(want, func(a, b store.Instance) int {
			return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), strings.Compare(b.ID, a.ID))
		})
		require.Equal(h.t, listIDs(want), listIDs(h.list(store.ListFilter{NewestFirst: true})))

		var paged []string
		after := ""
		for range len(want) + 1 {
			page := h.list(store.ListFilter{NewestFirst: true, AfterID: after, Limit: 4})
			if len(page) == 0 {
				break
			}
			paged = append(paged, listIDs(page)...)
			after = page[len(page)-1].ID
		}
		require.Equal(h.t, listIDs(want), paged, "pages cover every row once, newest first")
		require.Empty(h.t, h.list(store.ListFilter{NewestFirst: true, AfterID: uuid.NewString()}), "after an unknown id: nothing")
	}},
	{"keyinfo/holders, waiters and next in line", func(h *harness) {
		ids := h.insertKeyed("account:1", 3)
		c := h.claimOne("w", at(0))
		require.Equal(h.t, ids[0], c.ID)
		require.Empty(h.t, h.claim("w", 10, at(time.Second)))
		info := h.keyInfo("account:1")
		require.Equal(h.t, 1, info.K)
		require.Zero(h.t, info.Shards)
		require.Equal(h.t, []string{ids[0]}, listIDs(info.Holders))
		require.Equal(h.t, "w", info.Holders[0].Worker)
		require.Equal(h.t, 2, info.Waiting)
		require.Equal(h.t, 2, info.Blocked)
		require.NotNil(h.t, info.NextInLine)
		require.Equal(h.t, ids[1], info.NextInLine.ID)

		empty := h.keyInfo("account:404")
		require.Empty(h.t, empty.Holders)
		require.Zero(h.t, empty.Waiting)
		require.Nil(h.t, empty.NextInLine)

		h.syncLimits(gate.Limit{Name: "stripe", Limit: 4, Shards: 2})
		g := h.insertKeyed("stripe:z", 1)
		gi := h.keyInfo("stripe:z")
		require.Equal(h.t, 4, gi.K)
		require.Equal(h.t, 2, gi.Shards)
		require.Equal(h.t, 4, gi.Available)
		require.Equal(h.t, 1, gi.Waiting)
		require.Zero(h.t, gi.Blocked)
		require.Equal(h.t, g[0], gi.NextInLine.ID)
	}},
	{"keyinfo/a K = 1 key has one slot, free while no row of it executes", func(h *harness) {
		ids := h.insertKeyed("account:1", 2)
		info := h.keyInfo("account:1")
		require.Equal(h.t, 1, info.K)
		require.Equal(h.t, 1, info.Available, "rows waiting for an executor do not hold the key")
		require.Equal(h.t, 2, info.Waiting)

		c := h.claimOne("w", at(0))
		require.Equal(h.t, ids[0], c.ID)
		require.Zero(h.t, h.available("account:1"), "the holder takes the key's one slot")

		h.commit("w", at(time.Second), done(c))
		require.Equal(h.t, 1, h.available("account:1"), "the outcome frees the slot")
		require.Equal(h.t, 1, h.available("account:404"), "a key nobody uses is free")
	}},
}

func listIDs(ins []store.Instance) []string {
	out := make([]string, len(ins))
	for i, in := range ins {
		out[i] = in.ID
	}
	return out
}
