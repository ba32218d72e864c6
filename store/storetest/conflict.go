package storetest

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// uinst is inst(k) with unique key u and conflict mode c.
func uinst(k, u string, c store.Conflict) store.NewInstance {
	ni := inst(k)
	ni.UniqueKey, ni.OnConflict = u, c
	return ni
}

// conflictErr inserts nis, requires a *store.ConflictError wrapping want
// that names holder in status, and that nothing of the batch was inserted.
func (h *harness) conflictErr(want error, holder string, status store.Status, nis ...store.NewInstance) {
	h.t.Helper()
	before := len(h.list(store.ListFilter{}))
	_, err := h.s.Insert(h.ctx, nis)
	require.Error(h.t, err)
	require.True(h.t, errors.Is(err, want), "got %v", err)
	var ce *store.ConflictError
	require.True(h.t, errors.As(err, &ce), "got %T %v", err, err)
	require.Equal(h.t, holder, ce.Holder)
	require.Equal(h.t, status, ce.Status)
	require.Len(h.t, h.list(store.ListFilter{}), before, "a refused batch inserts nothing")
}

// conflictTests are the rules of NewInstance.OnConflict.
var conflictTests = []test{
	{"conflict/cancel-older cancels a holder that has not started and inserts", func(h *harness) {
		old := h.insert(uinst("", "u", store.ConflictSkip))[0]
		ni := uinst("", "u", store.ConflictCancelOlder)
		res, err := h.s.Insert(h.ctx, []store.NewInstance{ni})
		require.NoError(h.t, err)
		require.Equal(h.t, store.InsertResult{ID: ni.ID, Canceled: old}, res[0])
		h.requireStatus(store.StatusCanceled, old)
		h.requireStatus(store.StatusReady, ni.ID)
		require.Equal(h.t, []string{ni.ID}, claimedIDs(h.claim("w", 10, at(time.Second))))
	}},
	{"conflict/cancel-older of a running holder requests its cancel and inserts at once; the step keeps its key's slot", func(h *harness) {
		old := h.insert(uinst("acct:1", "u", store.ConflictSkip))[0]
		c := h.claimOne("w", at(0))
		require.Equal(h.t, old, c.ID)
		ni := uinst("acct:1", "u", store.ConflictCancelOlder)
		res, err := h.s.Insert(h.ctx, []store.NewInstance{ni})
		require.NoError(h.t, err)
		require.Equal(h.t, old, res[0].Canceled)
		require.False(h.t, res[0].Duplicate)
		in := h.get(old)
		require.Equal(h.t, store.StatusExecuting, in.Status)
		require.True(h.t, in.CancelRequested)
		require.Empty(h.t, h.claim("w", 10, at(time.Second)), "the running step holds acct:1")
		h.commit("w", at(2*time.Second), next(c, "more"))
		h.requireStatus(store.StatusCanceled, old)
		require.Equal(h.t, ni.ID, h.claimOne("w", at(3*time.Second)).ID)
	}},
	{"conflict/a holder whose cancel is requested holds its unique key no more", func(h *harness) {
		old := h.insert(uinst("", "u", store.ConflictSkip))[0]
		h.claimOne("w", at(0))
		require.NoError(h.t, h.s.Cancel(h.ctx, old, at(time.Second)))
		ni := uinst("", "u", store.ConflictSkip)
		res, err := h.s.Insert(h.ctx, []store.NewInstance{ni})
		require.NoError(h.t, err)
		require.Equal(h.t, store.InsertResult{ID: ni.ID}, res[0])
	}},
	{"conflict/cancel-older of a terminal holder in its scope is a ConflictError wrapping ErrTerminal", func(h *harness) {
		old := uinst("", "u", store.ConflictSkip)
		old.UniqueStatuses = []store.Status{store.StatusDone}
		h.insert(old)
		h.commit("w", at(time.Second), done(h.claimOne("w", at(0))))
		ni := uinst("", "u", store.ConflictCancelOlder)
		ni.UniqueStatuses = []store.Status{store.StatusDone}
		h.conflictErr(store.ErrTerminal, old.ID, store.StatusDone, inst(""), ni)
	}},
	{"conflict/replace gives a holder that has not started the new state, and inserts nothing", func(h *harness) {
		for _, k := range []string{"", "acct:1"} {
			holder := uinst(k, "u"+k, store.ConflictSkip)
			holder.Queue = "other" // out of the claims below
			h.insert(holder)
			ni := uinst(k, "u"+k, store.ConflictReplace)
			ni.State = json.RawMessage(`{"n":7}`)
			res, err := h.s.Insert(h.ctx, []store.NewInstance{ni})
			require.NoError(h.t, err)
			require.Equal(h.t, store.InsertResult{ID: holder.ID, Replaced: true}, res[0])
			require.JSONEq(h.t, `{"n":7}`, string(h.get(holder.ID).State))
			_, err = h.s.Get(h.ctx, ni.ID)
			require.True(h.t, errors.Is(err, store.ErrNotFound), "nothing inserted: %v", err)
		}
		// A blocked holder (behind its key's running row) has not started either.
		h.holdKey("acct:2")
		ahead := inst("acct:2")
		ahead.RunAt = at(-2 * time.Hour)
		blocked := uinst("acct:2", "b", store.ConflictSkip)
		blocked.RunAt = at(-time.Hour)
		h.insert(ahead)
		h.insert(blocked)
		require.Empty(h.t, h.claim("w", 10, at(time.Second)))
		h.requireStatus(store.StatusBlocked, blocked.ID)
		ni := uinst("acct:2", "b", store.ConflictReplace)
		ni.State = json.RawMessage(`{"n":8}`)
		res, err := h.s.Insert(h.ctx, []store.NewInstance{ni})
		require.NoError(h.t, err)
		require.True(h.t, res[0].Replaced)
		require.JSONEq(h.t, `{"n":8}`, string(h.get(blocked.ID).State))
	}},
	{"conflict/replace of a holder that started is a ConflictError wrapping ErrStarted", func(h *harness) {
		running := h.insert(uinst("", "run", store.ConflictSkip))[0]
		c := h.claimOne("w", at(0))
		h.conflictErr(store.ErrStarted, running, store.StatusExecuting, inst(""), uinst("", "run", store.ConflictReplace))

		h.commit("w", at(time.Second), await(c, "go", "after"))
		h.conflictErr(store.ErrStarted, running, store.StatusAwaiting, uinst("", "run", store.ConflictReplace))

		h.signal(running, "go", `{}`, at(2*time.Second))
		h.requireStatus(store.StatusReady, running)
		h.conflictErr(store.ErrStarted, running, store.StatusReady, uinst("", "run", store.ConflictReplace))
	}},
	{"conflict/a unique key a row cancels or replaces is in no other row of its batch", func(h *harness) {
		_, err := h.s.Insert(h.ctx, []store.NewInstance{uinst("", "u", store.ConflictSkip), uinst("", "u", store.ConflictReplace)})
		require.True(h.t, errors.Is(err, store.ErrInvalid), "got %v", err)
		_, err = h.s.Insert(h.ctx, []store.NewInstance{uinst("", "u", store.ConflictCancelOlder), uinst("", "u", store.ConflictSkip)})
		require.True(h.t, errors.Is(err, store.ErrInvalid), "got %v", err)
		_, err = h.s.Insert(h.ctx, []store.NewInstance{uinst("", "", store.ConflictReplace)})
		require.True(h.t, errors.Is(err, store.ErrInvalid), "OnConflict without a unique key: %v", err)
		require.Empty(h.t, h.list(store.ListFilter{}))
	}},
}
