package postgres_test

import (
	"testing"

	"github.com/godurable/godurable/store"
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
