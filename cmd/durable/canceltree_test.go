package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// TestCLICancelChildren cancels a parent awaiting two children, one of
// them running, with -children.
func TestCLICancelChildren(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := migrated(t)
	ni := func() store.NewInstance {
		return store.NewInstance{ID: store.NewInstanceID(), Workflow: "sync", Version: 1, Queue: "tree", Step: "fetch", State: json.RawMessage(`{}`)}
	}
	parent := ni()
	_, err := s.st.Insert(ctx, []store.NewInstance{parent})
	require.NoError(t, err)
	claim := func() store.Claimed {
		res, err := s.st.Claim(ctx, store.ClaimRequest{Queue: "tree", Worker: "worker-a", Limit: 1, Lease: time.Hour})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 1)
		return res.Claimed[0]
	}
	p := claim()
	a, b := ni(), ni()
	_, err = s.st.Complete(ctx, "worker-a", []store.Outcome{{ID: p.ID, Fence: p.Fence, Kind: store.OutcomeSpawn, Step: "joined",
		State: json.RawMessage(`{}`), Children: []store.NewInstance{a, b}}}, time.Time{})
	require.NoError(t, err)
	ac := claim() // a runs; b waits
	require.Equal(t, a.ID, ac.ID)

	out := s.ok(t, "cancel", parent.ID, "-children")
	assert.Contains(t, out, "canceled "+parent.ID+" (sync at step joined)")
	assert.Contains(t, out, "cancel requested for "+a.ID+" (sync, executing step fetch on worker worker-a)")
	assert.Contains(t, out, "canceled "+b.ID)
	assert.Contains(t, out, "3 instance(s) canceled: "+parent.ID+" and 2 descendant(s)")
	for id, want := range map[string]store.Status{parent.ID: store.StatusCanceled, a.ID: store.StatusExecuting, b.ID: store.StatusCanceled} {
		in, err := s.st.Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, want, in.Status, id)
	}
	out = s.ok(t, "cancel", parent.ID, "-children")
	assert.Contains(t, out, "cancel requested for "+a.ID, "a's step has not returned yet")
	_, err = s.st.Complete(ctx, "worker-a", []store.Outcome{{ID: a.ID, Fence: ac.Fence, Kind: store.OutcomeReady, Step: "more",
		State: json.RawMessage(`{}`)}}, time.Time{})
	require.NoError(t, err)
	out = s.ok(t, "cancel", parent.ID, "-children")
	assert.Contains(t, out, "nothing to cancel: "+parent.ID+" (canceled) and its descendants are all terminal")
	_, errOut, code := s.cli(t, "cancel", parent.ID)
	assert.Equal(t, 1, code, "without -children a terminal instance is an error, as before")
	assert.Contains(t, errOut, "terminal")
}
