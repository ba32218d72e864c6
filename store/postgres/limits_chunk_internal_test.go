package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// TestLimitChangeHoldsOneChunkOfCounters checks that a limit change
// re-shapes a name's counters a chunk at a time, each chunk committed
// before the next is locked: while another transaction holds one key's
// counters, the keys before it are already re-shaped and free, and the
// keys after it not yet locked. A change that locked every counter of the
// name in one transaction would hold the first key's counters until the
// blocked one was freed.
func TestLimitChangeHoldsOneChunkOfCounters(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	old := limitChunk
	limitChunk = 1
	t.Cleanup(func() { limitChunk = old })

	sync := func(limit int) error {
		_, err := s.SyncKeyLimits(ctx, store.DefaultNamespace, store.KeyLimits{Limits: []gate.Limit{{Name: "api", Limit: limit}}}, store.SyncOptions{})
		return err
	}
	require.NoError(t, sync(4))
	_, err := s.pool.Exec(ctx, s.q(`INSERT INTO {schema}.key_slots (key, shard, capacity, available)
VALUES ('api:a', 0, 4, 4), ('api:b', 0, 4, 3), ('api:c', 0, 4, 1)`))
	require.NoError(t, err)
	counter := func(key string) (capacity, available int) {
		t.Helper()
		require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT capacity, available FROM {schema}.key_slots WHERE key = $1 AND shard = 0`), key).
			Scan(&capacity, &available))
		return capacity, available
	}

	holder, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, s.q(`SELECT 1 FROM {schema}.key_slots WHERE key = 'api:b' FOR UPDATE`))
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- sync(2) }()
	require.Eventually(t, func() bool { c, _ := counter("api:a"); return c == 2 }, 10*time.Second, 10*time.Millisecond,
		"the first key's counters are re-shaped while a later key's are held")
	c, a := counter("api:a")
	require.Equal(t, [2]int{2, 2}, [2]int{c, a})
	select {
	case err := <-done:
		t.Fatalf("the change returned (%v) while a key's counters were held", err)
	default:
	}
	free, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = free.Exec(ctx, s.q(`SELECT 1 FROM {schema}.key_slots WHERE key IN ('api:a', 'api:c') FOR UPDATE NOWAIT`))
	require.NoError(t, err, "only the held key's chunk waits: the keys before it and after it are not locked by the change")
	require.NoError(t, free.Rollback(ctx))
	c, a = counter("api:c")
	require.Equal(t, [2]int{4, 1}, [2]int{c, a}, "a key after the held one is re-shaped after it")

	require.NoError(t, holder.Rollback(ctx))
	require.NoError(t, <-done)
	for key, want := range map[string][2]int{"api:a": {2, 2}, "api:b": {2, 1}, "api:c": {3, 0}} {
		c, a := counter(key)
		require.Equal(t, want, [2]int{c, a}, "key %s: capacity and available (used slots kept, a key over the new limit at capacity = used)", key)
	}
}
