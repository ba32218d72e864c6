package postgres

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

func TestCleanShards(t *testing.T) {
	lim := gate.Limit{Name: "api", Limit: 10, Shards: 3} // capacities 4, 3, 3
	for _, tc := range []struct {
		name   string
		locked []slotRow
		n      int
		want   bool
	}{
		{"every counter as the limit makes it", []slotRow{{shard: 0, capacity: 4}, {shard: 2, capacity: 3}}, 3, true},
		{"nothing locked, counters as the limit", nil, 3, true},
		{"a counter left from a wider sharding", []slotRow{{shard: 0, capacity: 4}}, 4, false},
		{"a shard not created yet", []slotRow{{shard: 0, capacity: 4}}, 2, false},
		{"a locked shard beyond the limit's shards", []slotRow{{shard: 3, capacity: 3}}, 3, false},
		{"a capacity from an older limit", []slotRow{{shard: 1, capacity: 5}}, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cleanShards(lim, tc.locked, tc.n); got != tc.want {
				t.Fatalf("cleanShards = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestStrandedIsNotSaturated checks sqlStranded's notion of room: a key
// whose slots are all taken, with blocked rows and no ready row, is
// saturated, not stranded (heal would otherwise retry it for nothing and
// hold up the outcome flush); once its slot frees with nothing promoted, it
// is stranded.
func TestStrandedIsNotSaturated(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	_, err := s.SyncLimits(ctx, []gate.Limit{{Name: "api", Limit: 1}})
	require.NoError(t, err)
	var ins []store.NewInstance
	for _, key := range []string{"api:x", "api:x", "acct:1", "acct:1"} {
		ins = append(ins, store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`), Key: key})
	}
	_, err = s.Insert(ctx, ins)
	require.NoError(t, err)
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 4, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 2) // one per key, the other row of each blocked

	stranded := func() []string {
		var got []string
		rows, err := s.pool.Query(ctx, s.q(sqlStranded), []string{"acct:1", "api:x"}, []bool{true, false})
		require.NoError(t, err)
		for rows.Next() {
			var k string
			require.NoError(t, rows.Scan(&k))
			got = append(got, k)
		}
		require.NoError(t, rows.Err())
		return got
	}
	require.Empty(t, stranded(), "both keys are saturated")

	// Their slots free (the executing rows finish, the gate is credited) but
	// nothing is promoted: both keys are stranded.
	_, err = s.pool.Exec(ctx, `UPDATE `+s.schema+`.instances SET status = 'done', worker = NULL, lease_expires_at = NULL, key_shard = NULL
		WHERE status = 'executing'`)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `UPDATE `+s.schema+`.key_slots SET available = capacity`)
	require.NoError(t, err)
	require.Equal(t, []string{"acct:1", "api:x"}, stranded())
}
