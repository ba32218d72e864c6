package storetest

import (
	"fmt"
	"slices"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

var queryTests = []test{
	{"history/recorded when the outcome carries it", func(h *harness) {
		id := h.insert(inst(""))[0]
		c := h.claimOne("w", at(0))
		o := next(c, "two")
		o.History = &store.HistoryEntry{Step: "start", Attempt: 0, Key: "acct:1", Also: []string{"api:x"}, Worker: "w",
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
		require.Equal(h.t, "acct:1", hist[0].Key, "the step's keys as the outcome gave them")
		require.Equal(h.t, []string{"api:x"}, hist[0].Also)
		require.Empty(h.t, hist[1].Also)
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
	{"list/newest first (time-ordered ids) pages without gaps or repeats", func(h *harness) {
		var inserted []string
		for i := range 7 {
			ni := inst(fmt.Sprintf("account:%d", i%2))
			if i%3 == 0 {
				ni.Workflow = "other"
			}
			inserted = append(inserted, h.insert(ni)[0])
		}
		newest := slices.Clone(inserted)
		slices.Reverse(newest)
		require.Equal(h.t, newest, listIDs(h.list(store.ListFilter{Newest: true})), "latest inserted first")

		var paged []string
		after := ""
		for range len(inserted) + 1 {
			page := h.list(store.ListFilter{Newest: true, AfterID: after, Limit: 3})
			require.LessOrEqual(h.t, len(page), 3)
			if len(page) == 0 {
				break
			}
			paged = append(paged, listIDs(page)...)
			after = page[len(page)-1].ID
		}
		require.Equal(h.t, newest, paged, "pages cover every row once, newest first")

		// Filters hold on every page.
		var others []string
		for _, id := range newest {
			if h.get(id).Workflow == "other" {
				others = append(others, id)
			}
		}
		page := h.list(store.ListFilter{Newest: true, Workflow: "other", Limit: 2})
		require.Equal(h.t, others[:2], listIDs(page))
		page = h.list(store.ListFilter{Newest: true, Workflow: "other", AfterID: page[1].ID, Limit: 2})
		require.Equal(h.t, others[2:], listIDs(page))
		require.Len(h.t, h.list(store.ListFilter{Newest: true, Key: "account:1"}), 3)
	}},
	{"list/a scan bounded by ScanLimit pages on without skipping or repeating, even past pages with no match", func(h *harness) {
		// 23 rows; the rare key and the rare queue match a few, so that some
		// windows of ScanLimit ids hold no match at all.
		var ids []string
		for i := range 23 {
			ni := inst("")
			switch i {
			case 1, 2, 3, 17:
				ni.Key = "account:rare"
			case 9, 22:
				ni.Queue = "q2"
			}
			ids = append(ids, h.insert(ni)[0])
		}
		slices.Sort(ids)
		for _, newest := range []bool{false, true} {
			order := slices.Clone(ids)
			if newest {
				slices.Reverse(order)
			}
			for _, f := range []store.ListFilter{
				{Key: "account:rare", Limit: 2, ScanLimit: 5},
				{Queue: "q2", Limit: 2, ScanLimit: 5},
				{Key: "account:rare", Status: store.StatusReady, Limit: 1, ScanLimit: 4},
				{Workflow: "wf", Limit: 3, ScanLimit: 3}, // every row matches
				{Queue: "q2", ScanLimit: 7},              // no Limit
			} {
				f.Newest = newest
				msg := fmt.Sprintf("%+v", f)
				var want []string
				for _, id := range order {
					in := h.get(id)
					if (f.Key == "" || in.Key == f.Key) && (f.Queue == "" || in.Queue == f.Queue) &&
						(f.Workflow == "" || in.Workflow == f.Workflow) && (f.Status == "" || in.Status == f.Status) {
						want = append(want, id)
					}
				}
				var got []string
				empty, pages := 0, 0
				pos := 0 // how many ids of order the pages so far covered
				for f.AfterID = ""; ; pages++ {
					require.Less(h.t, pages, len(order)+2, "%s: the pages never end", msg)
					p, err := h.s.ListPage(h.ctx, f)
					require.NoError(h.t, err, msg)
					require.Equal(h.t, listIDs(p.Rows), listIDs(h.list(f)), "%s: List is ListPage's rows", msg)
					if f.Limit > 0 {
						require.LessOrEqual(h.t, len(p.Rows), f.Limit, msg)
					}
					got = append(got, listIDs(p.Rows)...)
					if len(p.Rows) == 0 {
						empty++
					}
					if p.Next == "" {
						require.False(h.t, p.ScanStopped, msg)
						break
					}
					next := slices.Index(order, p.Next)
					require.GreaterOrEqual(h.t, next, pos, "%s: the cursor moves forward", msg)
					if p.ScanStopped {
						if f.Limit > 0 {
							require.Less(h.t, len(p.Rows), f.Limit, "%s: a stopped page is not full", msg)
						}
						require.Equal(h.t, pos+f.ScanLimit-1, next, "%s: a stopped scan advances by ScanLimit ids", msg)
					} else {
						require.Len(h.t, p.Rows, f.Limit, "%s: a page that did not stop is full", msg)
						require.Equal(h.t, p.Rows[len(p.Rows)-1].ID, p.Next, msg)
						require.LessOrEqual(h.t, next, pos+f.ScanLimit-1, "%s: never past ScanLimit ids", msg)
					}
					pos = next + 1
					f.AfterID = p.Next
				}
				require.Equal(h.t, want, got, "%s: the pages hold every match once, in order", msg)
				if f.Key != "" || f.Queue != "" {
					require.Positive(h.t, empty, "%s: some page found no match and still advanced", msg)
				}
			}
		}

		// Without ScanLimit, Next is the last row of a full page, "" past the end.
		p, err := h.s.ListPage(h.ctx, store.ListFilter{Key: "account:rare", Limit: 3})
		require.NoError(h.t, err)
		require.Len(h.t, p.Rows, 3)
		require.Equal(h.t, p.Rows[2].ID, p.Next)
		require.False(h.t, p.ScanStopped)
		p, err = h.s.ListPage(h.ctx, store.ListFilter{Key: "account:rare", Limit: 3, AfterID: p.Next})
		require.NoError(h.t, err)
		require.Len(h.t, p.Rows, 1)
		require.Empty(h.t, p.Next)
	}},
	{"inbox/lists unconsumed signals oldest first until a step consumes them", func(h *harness) {
		id := h.insert(inst(""))[0]
		require.Empty(h.t, h.inbox(id, 0))
		h.signal(id, "approve", `{"by":"ops"}`, at(0))
		h.signal(id, "note", "1", at(time.Second))
		in := h.inbox(id, 0)
		require.Len(h.t, in, 2)
		require.Equal(h.t, "approve", in[0].Name)
		require.Equal(h.t, id, in[0].InstanceID)
		require.JSONEq(h.t, `{"by":"ops"}`, string(in[0].Payload))
		require.Equal(h.t, "note", in[1].Name)
		require.Len(h.t, h.inbox(id, 1), 1)

		// A step that awaits "approve" consumes it when its outcome commits.
		c := h.claimOne("w", at(2*time.Second))
		h.commit("w", at(3*time.Second), await(c, "approve", "after"))
		c = h.claimOne("w", at(4*time.Second))
		require.NotNil(h.t, c.Signal)
		o := next(c, "end")
		o.ConsumeSignal = c.Signal.ID
		h.commit("w", at(5*time.Second), o)
		in = h.inbox(id, 0)
		require.Len(h.t, in, 1)
		require.Equal(h.t, "note", in[0].Name)

		require.Empty(h.t, h.inbox("00000000-0000-4000-8000-000000000404", 0), "a missing instance has an empty inbox")
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

func (h *harness) inbox(id string, limit int) []store.Signal {
	h.t.Helper()
	in, err := h.s.Inbox(h.ctx, id, limit)
	require.NoError(h.t, err)
	return in
}

func listIDs(ins []store.Instance) []string {
	out := make([]string, len(ins))
	for i, in := range ins {
		out[i] = in.ID
	}
	return out
}
