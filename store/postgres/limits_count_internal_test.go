package postgres

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// TestLimitChangeCountsLiveRowsOnceInForce: a limit change counts the live
// rows of its names after it committed and outside the limits' lock (a
// name's count reads every live row of the name), so that neither the new
// limit nor another sync waits for it. The count is held up here by a
// lock on instances, which these syncs read only to count: the change is
// stored, and another namespace's sync stores its own, while the first
// sync's count waits; once it runs, the sync reports the live row and
// records the warning that names it.
func TestLimitChangeCountsLiveRowsOnceInForce(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	_, err := s.SyncLimits(ctx, []gate.Limit{{Name: "api", Limit: 5}})
	require.NoError(t, err)
	_, err = s.Insert(ctx, []store.NewInstance{{ID: store.NewInstanceID(), Workflow: "wf", Version: 1, Queue: "q",
		Step: "s", State: json.RawMessage(`{}`), Key: "api:1"}})
	require.NoError(t, err)

	holder, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, "LOCK TABLE "+s.schema+".instances IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	type result struct {
		res store.LimitsResult
		err error
	}
	first, second := make(chan result, 1), make(chan result, 1)
	go func() {
		res, err := s.SyncLimits(ctx, []gate.Limit{{Name: "api", Limit: 8}})
		first <- result{res, err}
	}()
	stored := func(name string, limit int) func() bool {
		return func() bool {
			var n int
			err := s.pool.QueryRow(ctx, s.q(`SELECT coalesce(max("limit"), 0) FROM {schema}.limits WHERE name = $1`), name).Scan(&n)
			return err == nil && n == limit
		}
	}
	require.Eventually(t, stored("api", 8), 5*time.Second, 10*time.Millisecond, "the change waits for its count")
	go func() {
		res, err := s.SyncKeyLimits(ctx, "other", store.KeyLimits{Limits: []gate.Limit{{Name: "mail", Limit: 3}}}, store.SyncOptions{})
		second <- result{res, err}
	}()
	require.Eventually(t, stored("mail", 3), 5*time.Second, 10*time.Millisecond, "another sync waits for the first one's count")
	select {
	case r := <-first:
		t.Fatalf("the first sync returned before its count could run: %+v", r)
	default:
	}

	require.NoError(t, holder.Rollback(ctx))
	r := <-first
	require.NoError(t, r.err)
	require.Equal(t, map[string]int64{"api": 1}, r.res.Live)
	require.NoError(t, (<-second).err)
	h, err := s.Health(ctx, time.Time{})
	require.NoError(t, err)
	var live []gate.Warning
	for _, w := range h.Warnings {
		if w.Kind == gate.LiveKeysChanged {
			live = append(live, w)
		}
	}
	require.Len(t, live, 1, "%+v", h.Warnings)
	require.Equal(t, "api", live[0].Name)
	require.Equal(t, int64(1), live[0].Live)
}
