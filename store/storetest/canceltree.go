package storetest

import (
	"errors"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// cancelTreeTests are the rules of store.CancelTree on a backend: a tree's
// instances are each canceled by Cancel's rules, parents first, and a
// parent canceled before its children stays canceled.
var cancelTreeTests = []test{
	{"cancel/a tree is canceled parent first, each node by Cancel's rules, and its canceled parent stays canceled", func(h *harness) {
		parent := h.insert(inst(""))[0]
		p := h.claimOne("w", at(0))
		a, b := inst(""), inst("")
		h.commit("w", at(time.Second), store.Outcome{ID: p.ID, Fence: p.Fence, Kind: store.OutcomeSpawn,
			Step: "joined", Children: []store.NewInstance{a, b}})
		kids := h.claim("w", 2, at(2*time.Second))
		require.Equal(h.t, []string{a.ID, b.ID}, claimedIDs(kids))
		g := inst("")
		h.commit("w", at(3*time.Second), store.Outcome{ID: kids[0].ID, Fence: kids[0].Fence, Kind: store.OutcomeSpawn,
			Step: "joined", Children: []store.NewInstance{g}}) // a awaits its child g; b runs
		other := h.insert(inst(""))[0]

		got, err := store.CancelTree(h.ctx, h.s, parent, at(4*time.Second))
		require.NoError(h.t, err)
		require.Equal(h.t, []string{parent, a.ID, b.ID, g.ID}, got, "parents before their children")
		h.requireStatus(store.StatusCanceled, parent, a.ID, g.ID)
		in := h.get(b.ID)
		require.Equal(h.t, store.StatusExecuting, in.Status, "a running step keeps its slot until it returns")
		require.True(h.t, in.CancelRequested)
		h.requireStatus(store.StatusReady, other)

		h.commit("w", at(5*time.Second), next(kids[1], "more"))
		h.requireStatus(store.StatusCanceled, b.ID)
		h.requireStatus(store.StatusCanceled, parent) // its children's cancels do not wake it
		require.Equal(h.t, []string{other}, claimedIDs(h.claim("w", 10, at(6*time.Second))), "nothing of the tree runs")

		again, err := store.CancelTree(h.ctx, h.s, parent, at(7*time.Second))
		require.NoError(h.t, err, "a canceled tree's root is no error")
		require.Empty(h.t, again)
		_, err = store.CancelTree(h.ctx, h.s, store.NewInstanceID(), at(7*time.Second))
		require.True(h.t, errors.Is(err, store.ErrNotFound), "got %v", err)
	}},
	{"cancel/a tree whose root ended alone still has its live descendants canceled", func(h *harness) {
		parent := h.insert(inst(""))[0]
		p := h.claimOne("w", at(0))
		kid := inst("")
		h.commit("w", at(time.Second), store.Outcome{ID: p.ID, Fence: p.Fence, Kind: store.OutcomeSpawn,
			Step: "joined", Children: []store.NewInstance{kid}})
		require.NoError(h.t, h.s.Cancel(h.ctx, parent, at(2*time.Second))) // the parent alone
		h.requireStatus(store.StatusReady, kid.ID)
		got, err := store.CancelTree(h.ctx, h.s, parent, at(3*time.Second))
		require.NoError(h.t, err)
		require.Equal(h.t, []string{kid.ID}, got)
		h.requireStatus(store.StatusCanceled, kid.ID)
	}},
}
