package postgres_test

import (
	"testing"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/stretchr/testify/require"
)

func TestInsertClaimComplete(t *testing.T) {
	e := newEnv(t)
	ids := e.insert(newInstance(""), newInstance("account:1"), newInstance("account:1"))
	got := e.claim("w1", 10)
	require.Len(t, got, 2)
	require.Equal(t, ids[0], got[0].ID)
	require.Equal(t, ids[1], got[1].ID)
	require.Equal(t, store.StatusBlocked, e.get(ids[2]).Status)
	res := e.complete("w1", done(got[0]), done(got[1]))
	require.False(t, res[0].Stale)
	require.False(t, res[1].Stale)
	require.Equal(t, store.StatusDone, e.get(ids[1]).Status)
	require.Equal(t, store.StatusReady, e.get(ids[2]).Status)
	got = e.claim("w1", 10)
	require.Len(t, got, 1)
	require.Equal(t, ids[2], got[0].ID)
	// stale: wrong fence
	stale := done(got[0])
	stale.Fence++
	res = e.complete("w1", stale)
	require.True(t, res[0].Stale)
}

// TestInsertTakesNowFromOptionsClock: with Options.Clock, an insert is due
// (or not) by that clock, not the database's: a row due an hour after a
// clock far behind the database's now() waits for that hour.
func TestInsertTakesNowFromOptionsClock(t *testing.T) {
	now := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	e := newEnv(t, func(o *postgres.Options) { o.Clock = func() time.Time { return now } })
	later := newInstance("")
	later.RunAt = now.Add(time.Hour)
	ids := e.insert(newInstance(""), later)
	require.True(t, e.get(ids[0]).CreatedAt.Equal(now), "created at the store's clock")

	res, err := e.s.Claim(e.ctx, store.ClaimRequest{Queue: "q", Worker: "w1", Limit: 10, Lease: time.Minute, Now: now})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.Equal(t, ids[0], res.Claimed[0].ID)
	require.True(t, res.NextDue.Equal(now.Add(time.Hour)), "the later row is scheduled, due in an hour: %v", res.NextDue)

	res, err = e.s.Claim(e.ctx, store.ClaimRequest{Queue: "q", Worker: "w1", Limit: 10, Lease: time.Minute, Now: now.Add(time.Hour)})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.Equal(t, ids[1], res.Claimed[0].ID)
}
