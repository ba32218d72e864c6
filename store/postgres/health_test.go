package postgres_test

import (
	"testing"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

func TestHealth(t *testing.T) {
	e := newEnv(t)
	_, err := e.s.SyncLimits(e.ctx, []gate.Limit{{Name: "api", Limit: 2, Shards: 2}, {Name: "mail", Limit: 5}})
	require.NoError(t, err)
	now := time.Now().Add(time.Minute)
	var ins []store.NewInstance
	for range 3 {
		ins = append(ins, newInstance("api:a"))
	}
	ins = append(ins, newInstance("acct:1"), newInstance("acct:1"), newInstance(""))
	later := newInstance("")
	later.RunAt = now.Add(time.Hour)
	ins = append(ins, later)
	e.insert(ins...)

	res, err := e.s.Claim(e.ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 10, Now: now})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 4) // api:a twice, acct:1 once, the keyless row

	h, err := e.s.Health(e.ctx, now)
	require.NoError(t, err)
	require.Len(t, h.Queues, 1)
	q := h.Queues[0]
	require.Equal(t, "q", q.Queue)
	require.EqualValues(t, 0, q.Ready)
	require.EqualValues(t, 1, q.Scheduled)
	require.EqualValues(t, 2, q.Blocked)
	require.EqualValues(t, 4, q.Executing)
	require.EqualValues(t, 4, q.Active)

	require.Len(t, h.Gates, 2)
	api := h.Gates[0]
	require.Equal(t, store.GateHealth{Name: "api", Limit: 2, Shards: 2, Active: 2, BlockedReady: 1,
		SaturatedKeys: 1, HighestKeyActive: 2}, api)
	require.Equal(t, store.GateHealth{Name: "mail", Limit: 5, Shards: 1}, h.Gates[1])

	// A due row reports its wait.
	e.insert(newInstance(""))
	h, err = e.s.Health(e.ctx, now)
	require.NoError(t, err)
	require.EqualValues(t, 1, h.Queues[0].Ready)
	require.Greater(t, h.Queues[0].OldestReady, 30*time.Second)
}
