package storetest

import (
	"encoding/json"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

var insertTests = []test{
	{"insert/round trip", func(h *harness) {
		ni := inst("account:7")
		ni.Workflow, ni.Version, ni.Priority, ni.Step = "sync", 3, 4, "fetch"
		ni.KeyIntent = gate.IdentityIntent
		ni.State = json.RawMessage(`{"b":{"c":[1,2,3]},"a":"x"}`)
		ni.RunAt = at(time.Second)
		ni.UniqueKey = "sync-7"
		h.insert(ni)

		got := h.get(ni.ID)
		require.Equal(h.t, ni.ID, got.ID)
		require.Equal(h.t, "sync", got.Workflow)
		require.Equal(h.t, 3, got.Version)
		require.Equal(h.t, queue, got.Queue)
		require.Equal(h.t, 4, got.Priority)
		require.Equal(h.t, store.StatusReady, got.Status)
		require.Equal(h.t, "fetch", got.Step)
		require.Equal(h.t, 0, got.Attempt)
		require.Equal(h.t, "account:7", got.Key)
		require.Equal(h.t, gate.IdentityIntent, got.KeyIntent)
		require.Equal(h.t, -1, got.KeyShard)
		require.Equal(h.t, "sync-7", got.UniqueKey)
		require.Empty(h.t, got.Worker)
		require.Empty(h.t, got.ParentID)
		require.False(h.t, got.CreatedAt.IsZero(), "created_at set")
		near(h.t, ni.RunAt, got.RunAt, "run_at round trip")
		require.JSONEq(h.t, string(ni.State), string(got.State))
		// The state is stored as a JSON object, never as a string of JSON.
		var obj map[string]any
		require.NoError(h.t, json.Unmarshal(got.State, &obj), "state must decode as an object")

		_, err := h.s.Get(h.ctx, uuid.NewString())
		require.ErrorIs(h.t, err, store.ErrNotFound)
	}},
	{"insert/many is all or none", func(h *harness) {
		taken := h.insert(inst(""))[0]
		a, b, c := inst(""), inst(""), inst("")
		c.ID = taken
		_, err := h.s.Insert(h.ctx, []store.NewInstance{a, b, c})
		require.ErrorIs(h.t, err, store.ErrDuplicate)
		for _, id := range []string{a.ID, b.ID} {
			_, err := h.s.Get(h.ctx, id)
			require.ErrorIs(h.t, err, store.ErrNotFound, "nothing of a failed batch is inserted")
		}
		got := h.insert(a, b)
		require.Equal(h.t, []string{a.ID, b.ID}, got, "results follow the batch order")
	}},
	{"insert/duplicate caller id", func(h *harness) {
		a := inst("")
		h.insert(a)
		_, err := h.s.Insert(h.ctx, []store.NewInstance{a})
		require.ErrorIs(h.t, err, store.ErrDuplicate)

		b := inst("")
		_, err = h.s.Insert(h.ctx, []store.NewInstance{b, b})
		require.ErrorIs(h.t, err, store.ErrDuplicate, "the same id twice in one batch")
		_, err = h.s.Get(h.ctx, b.ID)
		require.ErrorIs(h.t, err, store.ErrNotFound)
	}},
	{"insert/unique key default scope", func(h *harness) {
		a := inst("")
		a.UniqueKey = "u"
		h.insert(a)

		dup := inst("")
		dup.UniqueKey = "u"
		res, err := h.s.Insert(h.ctx, []store.NewInstance{dup})
		require.NoError(h.t, err)
		require.Equal(h.t, []store.InsertResult{{ID: a.ID, Duplicate: true}}, res)
		_, err = h.s.Get(h.ctx, dup.ID)
		require.ErrorIs(h.t, err, store.ErrNotFound, "a duplicate inserts nothing")

		// Executing still occupies the key.
		c := h.claimOne("w", at(time.Second))
		res, err = h.s.Insert(h.ctx, []store.NewInstance{dup})
		require.NoError(h.t, err)
		require.True(h.t, res[0].Duplicate)

		// Within one batch, the second is a duplicate of the first.
		x, y := inst(""), inst("")
		x.UniqueKey, y.UniqueKey = "v", "v"
		res, err = h.s.Insert(h.ctx, []store.NewInstance{x, y})
		require.NoError(h.t, err)
		require.Equal(h.t, []store.InsertResult{{ID: x.ID}, {ID: x.ID, Duplicate: true}}, res)

		// Once terminal, the key is free again.
		h.commit("w", at(2*time.Second), done(c))
		res, err = h.s.Insert(h.ctx, []store.NewInstance{dup})
		require.NoError(h.t, err)
		require.Equal(h.t, []store.InsertResult{{ID: dup.ID}}, res)
	}},
	{"insert/unique key custom scope", func(h *harness) {
		a := inst("")
		a.UniqueKey, a.UniqueStatuses = "u", []store.Status{store.StatusReady}
		h.insert(a)
		b := inst("")
		b.UniqueKey, b.UniqueStatuses = "u", []store.Status{store.StatusReady}
		res, err := h.s.Insert(h.ctx, []store.NewInstance{b})
		require.NoError(h.t, err)
		require.Equal(h.t, store.InsertResult{ID: a.ID, Duplicate: true}, res[0])

		// a executes: not in the scope {ready}, so b inserts.
		c := h.claimOne("w", at(time.Second))
		require.Equal(h.t, a.ID, c.ID)
		h.insert(b)

		// A scope that includes done keeps the key after completion.
		h.commit("w", at(2*time.Second), done(c))
		d := inst("")
		d.UniqueKey, d.UniqueStatuses = "u", []store.Status{store.StatusDone}
		res, err = h.s.Insert(h.ctx, []store.NewInstance{d})
		require.NoError(h.t, err)
		require.Equal(h.t, store.InsertResult{ID: a.ID, Duplicate: true}, res[0])
	}},
	{"insert/future run_at is not claimable before it passes", func(h *harness) {
		ni := inst("")
		ni.RunAt = at(10 * time.Minute)
		h.insert(ni)
		require.Empty(h.t, h.claim("w", 10, at(10*time.Minute-time.Second)))
		h.requireStatus(store.StatusReady, ni.ID)
		c := h.claimOne("w", at(10*time.Minute))
		require.Equal(h.t, ni.ID, c.ID)
	}},
	{"insert/zero times use the store clock", func(h *harness) {
		ni := inst("")
		ni.RunAt = time.Time{}
		h.insert(ni)
		got := h.get(ni.ID)
		require.WithinDuration(h.t, time.Now(), got.RunAt, time.Minute, "zero run_at is the store's now")
		cs := h.claim("w", 10, time.Time{})
		require.Equal(h.t, []string{ni.ID}, claimedIDs(cs), "a zero claim time is the store's now")
		require.WithinDuration(h.t, time.Now().Add(lease), cs[0].LeaseExpiresAt, time.Minute)
	}},
	{"insert/large batch has no parameter ceiling", func(h *harness) {
		const n = 70_000
		nis := make([]store.NewInstance, n)
		for i := range nis {
			nis[i] = store.NewInstance{ID: uuid.NewString(), Workflow: "tiny", Queue: "bulk", Step: "s", State: json.RawMessage(`{}`), RunAt: base}
		}
		res, err := h.s.Insert(h.ctx, nis)
		require.NoError(h.t, err)
		require.Len(h.t, res, n)
		for i, r := range res {
			if r.ID != nis[i].ID || r.Duplicate {
				h.t.Fatalf("result %d = %+v, want id %s", i, r, nis[i].ID)
			}
		}
		require.Len(h.t, h.list(store.ListFilter{Queue: "bulk", Limit: n + 1}), n)
		require.Equal(h.t, "tiny", h.get(nis[n-1].ID).Workflow)
	}},
}
