package postgres

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// TestSyncWritesOnlyWhatItChanges pins that a sync writes the limits and
// rate limits it adds, changes or removes, and no other stored row: with a
// per-key limit for every tenant, setting one of them rewrote them all.
// A row left alone keeps its version (xmin); a row written gets a new one.
func TestSyncWritesOnlyWhatItChanges(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	versions := func(table string) map[string]string {
		rows, err := s.pool.Query(ctx, s.q(`SELECT name, xmin::text FROM {schema}.`+table))
		require.NoError(t, err)
		out := map[string]string{}
		var name, xmin string
		_, err = pgx.ForEachRow(rows, []any{&name, &xmin}, func() error { out[name] = xmin; return nil })
		require.NoError(t, err)
		return out
	}
	limits := []gate.Limit{{Name: "api", Limit: 5}}
	for i := range 200 {
		limits = append(limits, gate.Limit{Name: fmt.Sprintf("api:t%d", i), Limit: 5 + i%40})
	}
	rates := []gate.RateLimit{{Name: "api", Limit: 10, Period: time.Second}, {Name: "mail", Limit: 3, Period: time.Minute}}
	_, err := s.SyncKeyLimits(ctx, "ops", store.KeyLimits{Limits: limits, RateLimits: rates}, store.SyncOptions{})
	require.NoError(t, err)
	before, rBefore := versions("limits"), versions("rate_limits")
	require.Len(t, before, 201)
	require.Len(t, rBefore, 2)

	// One tenant's limit set, as `durable limits set` does.
	_, err = s.SyncKeyLimits(ctx, "ops", store.KeyLimits{Limits: []gate.Limit{{Name: "api:t7", Limit: 60}}}, store.SyncOptions{KeepOmitted: true})
	require.NoError(t, err)
	after := versions("limits")
	require.Len(t, after, 201)
	for name, v := range after {
		if name == "api:t7" {
			require.NotEqual(t, before[name], v, "the changed limit was not written")
			continue
		}
		require.Equal(t, before[name], v, "limit %s was rewritten by a sync that did not change it", name)
	}

	// The whole desired state again, one tenant changed, one gone, one
	// new, one rate limit changed.
	limits = slices.DeleteFunc(limits, func(l gate.Limit) bool { return l.Name == "api:t2" })
	for i, l := range limits {
		switch l.Name {
		case "api:t0":
			limits[i].Limit = 77
		case "api:t7":
			limits[i].Limit = 60 // as set above: unchanged
		}
	}
	limits = append(limits, gate.Limit{Name: "api:new", Limit: 9})
	rates[1].Limit = 4
	before = after
	_, err = s.SyncKeyLimits(ctx, "ops", store.KeyLimits{Limits: limits, RateLimits: rates}, store.SyncOptions{})
	require.NoError(t, err)
	after, rAfter := versions("limits"), versions("rate_limits")
	require.Len(t, after, 201)
	require.NotContains(t, after, "api:t2")
	require.Contains(t, after, "api:new")
	for name, v := range after {
		if name == "api:t0" || name == "api:new" {
			require.NotEqual(t, before[name], v, "limit %s changed or added but not written", name)
			continue
		}
		require.Equal(t, before[name], v, "limit %s was rewritten by a sync that did not change it", name)
	}
	require.Equal(t, rBefore["api"], rAfter["api"], "an unchanged rate limit was rewritten")
	require.NotEqual(t, rBefore["mail"], rAfter["mail"], "the changed rate limit was not written")

	// What is stored is what was asked for.
	got, err := s.Limits(ctx)
	require.NoError(t, err)
	want, err := gate.NewLimits(limits)
	require.NoError(t, err)
	require.Equal(t, want.All(), got)
	gotRates, err := s.RateLimits(ctx)
	require.NoError(t, err)
	require.Equal(t, []gate.RateLimit{{Name: "api", Limit: 10, Period: time.Second, Burst: 10}, {Name: "mail", Limit: 4, Period: time.Minute, Burst: 4}}, gotRates)
}

// TestSyncJudgesTheWholeSetFromWhatItReads: a locked sync reads the
// entries it can change, the names' limits and the first per-key limit of
// each name, not every stored limit (sqlLimitsOwnedFor), and judges as if
// it had read them all: removing a name's limit while another namespace
// holds per-key limits of it is refused, naming the first of them, and a
// change of a name's limit reports that name alone, whatever per-key
// limits of it are stored. The same with every sync reading every stored
// limit (past ownedOfMax names).
func TestSyncJudgesTheWholeSetFromWhatItReads(t *testing.T) {
	for _, most := range []int{ownedOfMax, 0} {
		t.Run(fmt.Sprintf("ownedOfMax %d", most), func(t *testing.T) {
			old := ownedOfMax
			ownedOfMax = most
			defer func() { ownedOfMax = old }()
			syncJudgesTheWholeSet(t)
		})
	}
}

func syncJudgesTheWholeSet(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	_, err := s.SyncKeyLimits(ctx, "app", store.KeyLimits{Limits: []gate.Limit{{Name: "zz", Limit: 2}, {Name: "aa", Limit: 3}}}, store.SyncOptions{})
	require.NoError(t, err)
	var tenants []gate.Limit
	for i := range 300 {
		tenants = append(tenants, gate.Limit{Name: fmt.Sprintf("zz:t%03d", 299-i), Limit: 4})
	}
	_, err = s.SyncKeyLimits(ctx, "tenants", store.KeyLimits{Limits: tenants}, store.SyncOptions{})
	require.NoError(t, err)

	_, err = s.SyncKeyLimits(ctx, "app", store.KeyLimits{Limits: []gate.Limit{{Name: "aa", Limit: 3}}}, store.SyncOptions{})
	require.ErrorIs(t, err, gate.ErrPerKeyWithoutGate)
	require.ErrorContains(t, err, `"zz:t000"`, "the first per-key limit of the name, as Validate over every stored limit names it")
	_, err = s.SyncKeyLimits(ctx, "app", store.KeyLimits{Limits: []gate.Limit{}}, store.SyncOptions{KeepOmitted: true, RemoveLimits: []string{"zz"}})
	require.ErrorIs(t, err, gate.ErrPerKeyWithoutGate)

	res, err := s.SyncKeyLimits(ctx, "app", store.KeyLimits{Limits: []gate.Limit{{Name: "zz", Limit: 5}, {Name: "aa", Limit: 3}}}, store.SyncOptions{})
	require.NoError(t, err)
	require.Equal(t, []gate.Change{{Name: "zz", OldK: 2, NewK: 5, OldSet: true, NewSet: true}}, res.Changes)
	res, err = s.SyncKeyLimits(ctx, "tenants", store.KeyLimits{Limits: []gate.Limit{}}, store.SyncOptions{KeepOmitted: true, RemoveLimits: []string{"zz:t150"}})
	require.NoError(t, err)
	require.Equal(t, []gate.Change{{Name: "zz:t150", OldK: 4, NewK: 5, OldSet: true}}, res.Changes, "the key falls back to its name's limit")
	ls, err := s.Limits(ctx)
	require.NoError(t, err)
	require.Len(t, ls, 2+299)
}
