package postgres

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// limitChangeFixture stores a limit of 4 on api, gives it the counters of
// rows (key, shard, capacity, available) and returns the change to limit
// and a read of one counter.
func limitChangeFixture(t *testing.T, s *Store, counters string) (sync func(limit int) error, counter func(key string, shard int) [2]int) {
	ctx := context.Background()
	sync = func(limit int) error {
		_, err := s.SyncKeyLimits(ctx, store.DefaultNamespace, store.KeyLimits{Limits: []gate.Limit{{Name: "api", Limit: limit}}}, store.SyncOptions{})
		return err
	}
	require.NoError(t, sync(4))
	_, err := s.pool.Exec(ctx, s.q(`DELETE FROM {schema}.key_slots`))
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, s.q(`INSERT INTO {schema}.key_slots (key, shard, capacity, available) VALUES `+counters))
	require.NoError(t, err)
	counter = func(key string, shard int) (c [2]int) {
		t.Helper()
		require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT capacity, available FROM {schema}.key_slots WHERE key = $1 AND shard = $2`), key, shard).
			Scan(&c[0], &c[1]))
		return c
	}
	return sync, counter
}

// holdCounters locks the counters of key matching cond in a transaction of
// its own until the returned release is called.
func holdCounters(t *testing.T, s *Store, cond string) (release func()) {
	ctx := context.Background()
	holder, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(ctx) })
	_, err = holder.Exec(ctx, s.q(`SELECT 1 FROM {schema}.key_slots WHERE `+cond+` FOR UPDATE`))
	require.NoError(t, err)
	return func() { require.NoError(t, holder.Rollback(ctx)) }
}

// lockable reports whether the counters matching cond can be locked now.
func lockable(s *Store, cond string) bool {
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, s.q(`SELECT 1 FROM {schema}.key_slots WHERE `+cond+` FOR UPDATE NOWAIT`))
	return err == nil
}

// requireFree checks that no transaction holds the counters matching cond.
func requireFree(t *testing.T, s *Store, cond, why string) {
	t.Helper()
	ctx := context.Background()
	free, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = free.Rollback(ctx) }()
	_, err = free.Exec(ctx, s.q(`SELECT 1 FROM {schema}.key_slots WHERE `+cond+` FOR UPDATE NOWAIT`))
	require.NoError(t, err, why)
}

// TestLimitChangeDoesNotWaitHoldingCounters checks that a limit change
// never waits for a counter another transaction holds while it holds
// others: with one key's counter held, the keys of its chunk before and
// after it are re-shaped and free again, and the change ends once the held
// key is freed. A chunk that waited for the held counter kept the first
// key's counters locked (and unchanged) until the holder committed.
func TestLimitChangeDoesNotWaitHoldingCounters(t *testing.T) {
	s := newInternalStore(t)
	require.GreaterOrEqual(t, limitChunk, 3, "the three keys make one chunk")
	sync, counter := limitChangeFixture(t, s, `('api:a', 0, 4, 4), ('api:b', 0, 4, 3), ('api:c', 0, 4, 1)`)
	release := holdCounters(t, s, `key = 'api:b'`)

	done := make(chan error, 1)
	go func() { done <- sync(2) }()
	require.Eventually(t, func() bool { return counter("api:c", 0)[0] == 3 }, 10*time.Second, 10*time.Millisecond,
		"the keys of the held key's chunk are re-shaped while it is held")
	require.Equal(t, [2]int{2, 2}, counter("api:a", 0))
	requireFree(t, s, `key IN ('api:a', 'api:c')`, "the change holds no counter while another transaction holds one it needs")
	select {
	case err := <-done:
		t.Fatalf("the change returned (%v) while a key's counters were held", err)
	case <-time.After(100 * time.Millisecond):
	}
	require.Equal(t, [2]int{4, 3}, counter("api:b", 0), "the held key is not re-shaped yet")

	release()
	require.NoError(t, <-done)
	for key, want := range map[string][2]int{"api:a": {2, 2}, "api:b": {2, 1}, "api:c": {3, 0}} {
		require.Equal(t, want, counter(key, 0), "key %s: capacity and available (used slots kept, a key over the new limit at capacity = used)", key)
	}
}

// TestLimitChangeReshapesAKeyWhole checks that a key of which another
// transaction holds one counter keeps all its counters as they are until
// the change can lock them all: its shards are re-shaped together, never
// some from the old limit and some from the new. Its free counter is not
// kept locked meanwhile.
func TestLimitChangeReshapesAKeyWhole(t *testing.T) {
	s := newInternalStore(t)
	// api has a limit of 4 in two shards of 2 (as stored by the fixture's
	// rows, not by the limit's sharding: only the re-shape reads that).
	sync, counter := limitChangeFixture(t, s, `('api:a', 0, 2, 2), ('api:a', 1, 2, 1), ('api:b', 0, 4, 4)`)
	release := holdCounters(t, s, `key = 'api:a' AND shard = 1`)

	done := make(chan error, 1)
	go func() { done <- sync(1) }()
	require.Eventually(t, func() bool { return counter("api:b", 0)[0] == 1 }, 10*time.Second, 10*time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the change returned (%v) while a key's counter was held", err)
	case <-time.After(100 * time.Millisecond):
	}
	require.Equal(t, [2]int{2, 2}, counter("api:a", 0), "a key with a held counter keeps its free one unchanged")
	// Each pass locks the free counter for as long as its statements take
	// and finds the other held: between passes it is free.
	require.Eventually(t, func() bool { return lockable(s, `key = 'api:a' AND shard = 0`) }, 5*time.Second, time.Millisecond,
		"the free counter of a key with a held one is not kept locked")
	release()
	require.NoError(t, <-done)
	require.Equal(t, [2]int{1, 1}, counter("api:a", 0), "api:a's first shard re-shaped to the new limit of 1")
	require.Equal(t, [2]int{1, 0}, counter("api:a", 1), "api:a's second shard keeps the slot its holder uses")
}

// TestLimitChangeWaitsAtLastForAHeldCounter checks that a key of several
// counters one of which stays held through every pass without waiting is
// then re-shaped by a transaction that waits for it: the change ends when
// the holder commits, and holds no other key's counter meanwhile. (A key
// of one counter is waited for at once:
// TestLimitChangeWaitsAtOnceForALoneHeldCounter.)
func TestLimitChangeWaitsAtLastForAHeldCounter(t *testing.T) {
	s := newInternalStore(t)
	old := reshapeFreePasses
	reshapeFreePasses = 2
	t.Cleanup(func() { reshapeFreePasses = old })
	sync, counter := limitChangeFixture(t, s, `('api:a', 0, 4, 4), ('api:b', 0, 2, 1), ('api:b', 1, 2, 2)`)
	release := holdCounters(t, s, `key = 'api:b' AND shard = 0`)

	done := make(chan error, 1)
	go func() { done <- sync(2) }()
	require.Eventually(t, lockWaiting(s, "%{schema}.key_slots%FOR UPDATE"), 10*time.Second, 10*time.Millisecond, "after its passes the change waits for the held counter")
	require.Equal(t, [2]int{2, 2}, counter("api:a", 0))
	requireFree(t, s, `key = 'api:a'`, "the waiting transaction holds the held key's counters only")
	release()
	require.NoError(t, <-done)
	require.Equal(t, [2]int{2, 1}, counter("api:b", 0), "the limit of 2 in one shard, its used slot kept")
	require.Equal(t, [2]int{0, 0}, counter("api:b", 1), "the shard the limit no longer has, empty")
}

// TestLimitChangeWaitsAtOnceForALoneHeldCounter checks that a key of one
// counter that a chunk found held is re-shaped right after that chunk by a
// transaction that waits for it, however many passes without waiting the
// change may make: waiting for a lone counter holds no other, and a
// saturated key's counter is held by its claims and step ends nearly all
// the time. A key of several counters keeps its passes
// (TestLimitChangeReshapesAKeyWhole).
func TestLimitChangeWaitsAtOnceForALoneHeldCounter(t *testing.T) {
	s := newInternalStore(t)
	old := reshapeFreePasses
	reshapeFreePasses = math.MaxInt
	t.Cleanup(func() { reshapeFreePasses = old })
	sync, counter := limitChangeFixture(t, s, `('api:a', 0, 4, 4), ('api:b', 0, 4, 3)`)
	release := holdCounters(t, s, `key = 'api:b'`)

	done := make(chan error, 1)
	go func() { done <- sync(2) }()
	require.Eventually(t, lockWaiting(s, "%{schema}.key_slots%FOR UPDATE"), 10*time.Second, 10*time.Millisecond, "the change waits for the lone held counter")
	require.Equal(t, [2]int{2, 2}, counter("api:a", 0))
	requireFree(t, s, `key = 'api:a'`, "the waiting transaction holds the held key's counter only")
	release()
	require.NoError(t, <-done)
	require.Equal(t, [2]int{2, 1}, counter("api:b", 0))
}

// TestNameChangePassesOverKeysOfTheirOwnLimit: a change of a name's limit
// re-shapes the counters of the name's keys that run under it, not those
// of a key with a limit of its own, which the change leaves as they are:
// the change does not wait for such a key's counter, held by another
// transaction (a saturated tenant's claims hold it nearly all the time).
func TestNameChangePassesOverKeysOfTheirOwnLimit(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	_, counter := limitChangeFixture(t, s, `('api:a', 0, 4, 4), ('api:own', 0, 6, 5)`)
	own := gate.Limit{Name: "api:own", Limit: 6}
	sync := func(limit int) error {
		_, err := s.SyncKeyLimits(ctx, store.DefaultNamespace, store.KeyLimits{Limits: []gate.Limit{{Name: "api", Limit: limit}, own}}, store.SyncOptions{})
		return err
	}
	require.NoError(t, sync(4))
	release := holdCounters(t, s, `key = 'api:own'`)
	defer release()
	done := make(chan error, 1)
	go func() { done <- sync(2) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the name's change waits for the counter of a key of its own limit")
	}
	require.Equal(t, [2]int{2, 2}, counter("api:a", 0), "a key under its name's limit is re-shaped")
	require.Equal(t, [2]int{6, 5}, counter("api:own", 0), "a key of its own limit keeps its counter")
}
