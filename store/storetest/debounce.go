package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// dinst is inst("") debounced on key with period p and max wait w, with
// state {"n": n}.
func dinst(key string, p, w time.Duration, n int) store.NewInstance {
	ni := inst("")
	ni.RunAt = time.Time{}
	ni.Debounce = store.Debounce{Key: key, Period: p, MaxWait: w}
	ni.State = json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))
	return ni
}

// debounceTests are the rules of NewInstance.Debounce. An insert takes
// the store's clock, so the rules read run times against the instance's
// CreatedAt and the wall clock around the inserts.
var debounceTests = []test{
	{"debounce/an insert replaces the pending instance's state and pushes its start, up to its first insert plus MaxWait", func(h *harness) {
		first := dinst("mail:7", time.Hour, 90*time.Minute, 1)
		before := time.Now()
		id := h.insert(first)[0]
		in := h.get(id)
		require.Equal(h.t, store.DebounceUniqueKey("mail:7"), in.UniqueKey)
		created := in.CreatedAt
		require.WithinDuration(h.t, created.Add(time.Hour), in.RunAt, time.Millisecond, "the first start: now + Period")

		time.Sleep(5 * time.Millisecond)
		res, err := h.s.Insert(h.ctx, []store.NewInstance{dinst("mail:7", time.Hour, 90*time.Minute, 2)})
		require.NoError(h.t, err)
		require.Equal(h.t, store.InsertResult{ID: id, Replaced: true}, res[0])
		in = h.get(id)
		require.JSONEq(h.t, `{"n":2}`, string(in.State))
		require.True(h.t, in.RunAt.After(created.Add(time.Hour)), "pushed back: %s after %s", in.RunAt, created)
		require.False(h.t, in.RunAt.After(time.Now().Add(time.Hour)))
		require.Equal(h.t, store.StatusReady, in.Status)

		// A short MaxWait caps the start at the first insert + MaxWait.
		capped := h.insert(dinst("mail:8", time.Hour, 30*time.Minute, 1))[0]
		c := h.get(capped)
		require.WithinDuration(h.t, c.CreatedAt.Add(30*time.Minute), c.RunAt, time.Millisecond, "FirstDelay: MaxWait < Period")
		time.Sleep(5 * time.Millisecond)
		res, err = h.s.Insert(h.ctx, []store.NewInstance{dinst("mail:8", time.Hour, 30*time.Minute, 2)})
		require.NoError(h.t, err)
		require.True(h.t, res[0].Replaced)
		require.WithinDuration(h.t, c.CreatedAt.Add(30*time.Minute), h.get(capped).RunAt, time.Millisecond, "never past the first insert + MaxWait")
		require.Len(h.t, h.list(store.ListFilter{}), 2, "one instance per debounce key")
		require.True(h.t, before.Before(created.Add(time.Second)))
	}},
	{"debounce/once the pending instance has started, the next insert starts a new one", func(h *harness) {
		id := h.insert(dinst("k", time.Minute, 0, 1))[0]
		c := h.claimOne("w", at(time.Hour)) // due on the suite's clock
		require.Equal(h.t, id, c.ID)
		res, err := h.s.Insert(h.ctx, []store.NewInstance{dinst("k", time.Minute, 0, 2)})
		require.NoError(h.t, err)
		require.False(h.t, res[0].Replaced)
		require.NotEqual(h.t, id, res[0].ID)
		require.JSONEq(h.t, `{"n":1}`, string(h.get(id).State), "the started one keeps its state")

		// The started one ready again (its next step) is not pending either.
		h.commit("w", at(time.Hour+time.Second), next(c, "second"))
		res2, err := h.s.Insert(h.ctx, []store.NewInstance{dinst("k", time.Minute, 0, 3)})
		require.NoError(h.t, err)
		require.Equal(h.t, store.InsertResult{ID: res[0].ID, Replaced: true}, res2[0], "the new pending one takes the burst")
		require.JSONEq(h.t, `{"n":3}`, string(h.get(res[0].ID).State))
	}},
	{"debounce/a pending instance replaced falls due and is claimed once, with the last state", func(h *harness) {
		id := h.insert(dinst("k", time.Minute, 0, 1))[0]
		for n := 2; n <= 4; n++ {
			res, err := h.s.Insert(h.ctx, []store.NewInstance{dinst("k", time.Minute, 0, n)})
			require.NoError(h.t, err)
			require.Equal(h.t, id, res[0].ID)
		}
		cs := h.claim("w", 10, at(time.Hour))
		require.Equal(h.t, []string{id}, claimedIDs(cs))
		require.JSONEq(h.t, `{"n":4}`, string(cs[0].State))
	}},
	{"debounce/a debounced insert has no unique key or OnConflict of its own, and its key is once in a batch", func(h *harness) {
		for _, bad := range []func(*store.NewInstance){
			func(ni *store.NewInstance) { ni.UniqueKey = "mine" },
			func(ni *store.NewInstance) { ni.OnConflict = store.ConflictReplace },
			func(ni *store.NewInstance) { ni.Debounce.Period = 0 },
			func(ni *store.NewInstance) { ni.Debounce.Key = "" },
		} {
			ni := dinst("k", time.Minute, 0, 1)
			bad(&ni)
			_, err := h.s.Insert(h.ctx, []store.NewInstance{ni})
			require.True(h.t, errors.Is(err, store.ErrInvalid), "got %v", err)
		}
		_, err := h.s.Insert(h.ctx, []store.NewInstance{dinst("k", time.Minute, 0, 1), dinst("k", time.Minute, 0, 2)})
		require.True(h.t, errors.Is(err, store.ErrInvalid), "got %v", err)
		require.Empty(h.t, h.list(store.ListFilter{}))
	}},
}
