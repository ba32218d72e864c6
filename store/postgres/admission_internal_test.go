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
