package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// TestSyncUnchangedTakesNoLock: a sync of limits and rate limits that
// would store what is stored (unchanged) returns while another transaction
// holds the limits' lock, and writes nothing; one that changes a limit, a
// rate limit, or what the namespace owns waits for the lock, as before.
func TestSyncUnchangedTakesNoLock(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	want := store.KeyLimits{
		Limits:     []gate.Limit{{Name: "stripe", Limit: 5, Shards: 2}, {Name: "tenant", Limit: 1}},
		RateLimits: []gate.RateLimit{{Name: "mail", Limit: 20, Period: time.Second, Burst: 10, PerKey: true}},
	}
	_, err := s.SyncKeyLimits(ctx, "svc", want, store.SyncOptions{})
	require.NoError(t, err)
	_, err = s.SyncKeyLimits(ctx, "other", store.KeyLimits{Limits: []gate.Limit{{Name: "theirs", Limit: 3}}}, store.SyncOptions{})
	require.NoError(t, err)

	// Another sync holds the lock.
	holder, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, sqlLimitsLock, lockSalt(s.schema, saltLimits))
	require.NoError(t, err)

	syncWith := func(ns string, w store.KeyLimits, o store.SyncOptions) error {
		c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := s.SyncKeyLimits(c, ns, w, o)
		return err
	}
	sync := func(ns string, w store.KeyLimits) error { return syncWith(ns, w, store.SyncOptions{}) }
	wantLs, wantRs, err := store.ValidateKeyLimits("svc", want.Limits, want.RateLimits)
	require.NoError(t, err)
	require.True(t, s.unchanged(ctx, "svc", true, true, wantLs.All(), wantRs.All(), store.SyncOptions{}))
	require.NoError(t, sync("svc", want), "unchanged: no lock taken")
	require.NoError(t, sync("svc", store.KeyLimits{Limits: want.Limits}), "unchanged, rate limits not synced")
	require.NoError(t, sync("svc", store.KeyLimits{RateLimits: want.RateLimits}), "unchanged, limits not synced")
	keep := store.SyncOptions{KeepOmitted: true}
	require.NoError(t, syncWith("svc", store.KeyLimits{Limits: want.Limits[1:]}, keep), "unchanged, one limit set as stored")
	require.NoError(t, syncWith("svc", store.KeyLimits{Limits: []gate.Limit{}}, store.SyncOptions{KeepOmitted: true, RemoveLimits: []string{"missing"}}),
		"unchanged, a missing limit removed")
	for what, o := range map[string]store.SyncOptions{
		"one limit set anew":        keep,
		"one of its limits removed": {KeepOmitted: true, RemoveLimits: []string{"tenant"}},
		"another's limit removed":   {KeepOmitted: true, RemoveLimits: []string{"theirs"}},
	} {
		w := store.KeyLimits{Limits: []gate.Limit{{Name: "tenant", Limit: 2}}}
		if len(o.RemoveLimits) > 0 {
			w = store.KeyLimits{Limits: []gate.Limit{}}
		}
		require.ErrorIs(t, syncWith("svc", w, o), context.DeadlineExceeded, "%s: the sync must wait for the lock", what)
	}

	changed := map[string]store.KeyLimits{
		"a limit":          {Limits: []gate.Limit{{Name: "stripe", Limit: 6, Shards: 2}, {Name: "tenant", Limit: 1}}, RateLimits: want.RateLimits},
		"a limit's shards": {Limits: []gate.Limit{{Name: "stripe", Limit: 5}, {Name: "tenant", Limit: 1}}, RateLimits: want.RateLimits},
		"a limit omitted":  {Limits: want.Limits[:1], RateLimits: want.RateLimits},
		"a limit added":    {Limits: append([]gate.Limit{{Name: "new", Limit: 2}}, want.Limits...), RateLimits: want.RateLimits},
		"a rate's period":  {Limits: want.Limits, RateLimits: []gate.RateLimit{{Name: "mail", Limit: 20, Period: 2 * time.Second, Burst: 10, PerKey: true}}},
		"a rate's per key": {Limits: want.Limits, RateLimits: []gate.RateLimit{{Name: "mail", Limit: 20, Period: time.Second, Burst: 10}}},
		"rates emptied":    {Limits: want.Limits, RateLimits: []gate.RateLimit{}},
		"another's limit":  {Limits: append([]gate.Limit{{Name: "theirs", Limit: 3}}, want.Limits...), RateLimits: want.RateLimits},
	}
	for what, w := range changed {
		require.ErrorIs(t, sync("svc", w), context.DeadlineExceeded, "%s: the sync must wait for the lock", what)
	}
	require.NoError(t, holder.Rollback(ctx))

	// And what was stored is what the first syncs stored.
	ls, err := s.Limits(ctx)
	require.NoError(t, err)
	require.Len(t, ls, 3)
	rs, err := s.RateLimits(ctx)
	require.NoError(t, err)
	require.Equal(t, want.RateLimits, rs)
}
