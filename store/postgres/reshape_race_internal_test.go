package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReshapeKeepsCountersAClaimCreated: a limit change reshapes a key's
// counters after its commit (reshapeCounters), while claims go on. A
// claim that read the new limit creates the counters of the new shards
// (sqlSlotsEnsure) and debits them; when it does so after the reshape read
// the key's counters, the reshape must leave those counters as the claim
// made them: overwritten from the reshape's older read, their slots would
// come back free while the claim's rows hold them, and the key would run
// over its limit.
func TestReshapeKeepsCountersAClaimCreated(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	_, err := s.pool.Exec(ctx, s.q(`INSERT INTO {schema}.limits (name, "limit", shards) VALUES ('stripe', 5, 1), ('stripe:big', 50, 5)`))
	require.NoError(t, err)
	// Shard 0 is as the new limit makes it, one slot in use; shards 1-4
	// do not exist yet.
	_, err = s.pool.Exec(ctx, s.q(`INSERT INTO {schema}.key_slots (key, shard, capacity, available) VALUES ('stripe:big', 0, 10, 9)`))
	require.NoError(t, err)

	// The claim: creates shards 1-4 and takes all of shard 1, not yet
	// committed when the reshape reads the key's counters.
	claim, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = claim.Rollback(ctx) }()
	_, err = claim.Exec(ctx, s.q(sqlSlotsEnsure), []string{"stripe:big", "stripe:big", "stripe:big", "stripe:big"},
		[]int32{1, 2, 3, 4}, []int32{10, 10, 10, 10})
	require.NoError(t, err)
	_, err = claim.Exec(ctx, s.q(sqlDebit), []string{"stripe:big"}, []int32{1}, []int32{10})
	require.NoError(t, err)

	reshaped := make(chan error, 1)
	go func() {
		var st strandedKeys
		reshaped <- s.reshapeCounters(ctx, []string{"stripe:big"}, &st)
	}()
	// The reshape has read the counters and waits to write the ones the
	// claim created.
	require.Eventually(t, lockWaiting(s, "%{schema}.key_slots%"), 5*time.Second, 5*time.Millisecond, "the reshape never waited for the claim's counters")
	require.NoError(t, claim.Commit(ctx))
	select {
	case err := <-reshaped:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the reshape did not end")
	}

	var used, capacity, shard1 int
	require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT sum(capacity - available), sum(capacity),
		sum(available) FILTER (WHERE shard = 1) FROM {schema}.key_slots WHERE key = 'stripe:big'`)).Scan(&used, &capacity, &shard1))
	require.Equal(t, 0, shard1, "the claim's debit of shard 1 is kept")
	require.Equal(t, 11, used, "the slot in use before and the claim's ten")
	require.Equal(t, 50, capacity)
}
