package runtime

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// track registers a claim whose step runs (stop records its cancel).
func track(c *claims, id string, fence int64, validUntil time.Time, stopped map[string]bool) *claimState {
	st := &claimState{ref: store.ClaimRef{ID: id, Fence: fence}, validUntil: validUntil,
		cancel: func() { stopped[id] = true }}
	c.inflight[id] = st
	return st
}

// A heartbeat renews what it names by id and fence; an answer about an
// older claim of the same instance changes nothing of the current one. A
// lost claim's step stops; so does a canceled one's, and a canceled
// reservation still queued in a slot's chain comes out of it with the
// reservations after it, to be given back.
func TestClaimsRenewed(t *testing.T) {
	c := newClaims()
	now := time.Now()
	stopped := map[string]bool{}
	a := track(&c, "a", 2, now, stopped)
	b := track(&c, "b", 1, now, stopped)
	x := track(&c, "x", 1, now, stopped)
	y := track(&c, "y", 1, now, stopped) // reserved to run after x
	z := store.Claimed{Instance: store.Instance{ID: "z", Fence: 1}}
	c.succ[x.ref] = store.Claimed{Instance: store.Instance{ID: "y", Fence: 1}}
	c.succ[y.ref] = z
	require.Equal(t, []store.ClaimRef{a.ref, b.ref, x.ref, y.ref}, c.held(), "in id order")

	later := now.Add(time.Minute)
	old := store.ClaimRef{ID: "a", Fence: 1}
	back := c.renewed([]store.ClaimRef{old, b.ref, y.ref},
		store.HeartbeatResult{Lost: []store.ClaimRef{old, b.ref}, Canceled: []store.ClaimRef{y.ref}}, later)
	require.False(t, a.lost, "an answer about fence 1 says nothing of fence 2")
	require.Equal(t, now, a.validUntil)
	require.True(t, b.lost)
	require.True(t, stopped["b"])
	require.True(t, y.canceled)
	require.Equal(t, []store.ClaimRef{y.ref, {ID: "z", Fence: 1}}, back, "the canceled reservation and the one after it")
	require.Empty(t, c.succ, "x's slot frees when its step ends")
	require.False(t, x.canceled)
	require.Equal(t, []store.ClaimRef{a.ref, x.ref, y.ref}, c.held(), "a lost claim is not renewed again")

	c.renewed([]store.ClaimRef{a.ref}, store.HeartbeatResult{}, later)
	require.Equal(t, later, a.validUntil)
	c.renewed([]store.ClaimRef{a.ref}, store.HeartbeatResult{}, now)
	require.Equal(t, later, a.validUntil, "a late answer never shortens a lease")
}

// The watchdog gives up a claim whose lease may end before the deadline,
// and a successor running in a slot whose predecessor's lease may end,
// whatever its own lease says.
func TestClaimsExpire(t *testing.T) {
	c := newClaims()
	now := time.Now()
	stopped := map[string]bool{}
	fresh := track(&c, "fresh", 1, now.Add(time.Minute), stopped)
	stale := track(&c, "stale", 1, now.Add(time.Second), stopped)
	succ := track(&c, "succ", 1, now.Add(time.Minute), stopped)
	succ.pred = stale
	require.Zero(t, c.expire(now), "every lease holds past now")
	require.Equal(t, 2, c.expire(now.Add(2*time.Second)))
	require.False(t, fresh.lost)
	require.True(t, stale.lost)
	require.True(t, succ.lost, "its slot is held by its predecessor's lease too")
	require.True(t, stopped["succ"])
	require.Zero(t, c.expire(now.Add(2*time.Second)), "a claim is given up once")
}
