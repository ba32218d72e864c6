package storetest

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// spawnOutcome spawns n children of workflow "child" (the last one keyed k).
func spawnOutcome(c store.Claimed, n int, k string) (store.Outcome, []string) {
	o := store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeSpawn, Step: "joined", State: json.RawMessage(`{"spawned":true}`)}
	var ids []string
	for i := range n {
		child := store.NewInstance{ID: uuid.NewString(), Workflow: "child", Version: 1, Queue: queue, Step: "start",
			State: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
		if i == n-1 {
			child.Key = k
		}
		o.Children = append(o.Children, child)
		ids = append(ids, child.ID)
	}
	return o, ids
}

var spawnTests = []test{
	{"spawn/children run and the parent joins on the last terminal child", func(h *harness) {
		parent := inst("account:1")
		parent.Workflow = "parent"
		h.insert(parent)
		c := h.claimOne("w", at(time.Second))
		o, kids := spawnOutcome(c, 3, "account:1")
		h.commit("w", at(2*time.Second), o)

		p := h.get(parent.ID)
		require.Equal(h.t, store.StatusChildren, p.Status)
		require.Equal(h.t, 3, p.PendingChildren)
		require.Equal(h.t, "joined", p.Step)
		got, err := h.s.Children(h.ctx, parent.ID)
		require.NoError(h.t, err)
		require.Len(h.t, got, 3)
		for i, in := range got {
			require.Equal(h.t, kids[i], in.ID, "children in creation order")
			require.Equal(h.t, parent.ID, in.ParentID)
			require.Equal(h.t, "child", in.Workflow)
			require.Equal(h.t, store.StatusReady, in.Status)
		}

		// The parent awaiting its children holds no slot: the child keyed
		// like the parent runs.
		cs := h.claim("w", 10, at(3*time.Second))
		require.ElementsMatch(h.t, kids, claimedIDs(cs))
		byID := map[string]store.Claimed{}
		for _, c := range cs {
			byID[c.ID] = c
		}
		h.commit("w", at(4*time.Second), done(byID[kids[0]]))
		require.Equal(h.t, 2, h.get(parent.ID).PendingChildren)
		h.commit("w", at(5*time.Second), store.Outcome{ID: kids[1], Fence: byID[kids[1]].Fence, Kind: store.OutcomeFailed, Error: "nope"})
		p = h.get(parent.ID)
		require.Equal(h.t, store.StatusChildren, p.Status)
		require.Equal(h.t, 1, p.PendingChildren)
		require.Empty(h.t, h.claim("w", 10, at(6*time.Second)))

		require.NoError(h.t, h.s.Cancel(h.ctx, kids[2], at(7*time.Second)))
		require.Equal(h.t, store.StatusChildren, h.get(parent.ID).Status, "the canceled child's step still runs")
		h.commit("w", at(7*time.Second), next(byID[kids[2]], "more"))
		p = h.get(parent.ID)
		require.Equal(h.t, store.StatusReady, p.Status, "the last terminal child (even canceled) readies the parent")
		require.Equal(h.t, 0, p.PendingChildren)
		w := h.claimOne("w", at(8*time.Second))
		require.Equal(h.t, parent.ID, w.ID)
		require.Equal(h.t, "joined", w.Step)
	}},
}
