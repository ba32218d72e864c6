package postgres

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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

	stranded := func() []string { return strandedOf(t, s, []string{"acct:1", "api:x"}, []bool{true, false}) }
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

// TestShortPromotionIsStranded checks the stranded check of a gate key
// whose freeing transaction promoted fewer rows than it freed slots,
// because another transaction held one of its blocked rows: sqlPromote
// reports it although it promoted a row, sqlStranded finds it stranded
// while it has more free slots than ready rows, and a heal's
// sqlPromoteIfRoom promotes the room its ready rows will not take. Before,
// a key with one row promoted, or one ready row, counted as served, and
// the other free slot stayed free, every row behind it blocked, until the
// reconciler's sweep.
func TestShortPromotionIsStranded(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	_, err := s.SyncLimits(ctx, []gate.Limit{{Name: "api", Limit: 2}})
	require.NoError(t, err)
	var ins []store.NewInstance
	for range 5 {
		ins = append(ins, store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`), Key: "api:x"})
	}
	_, err = s.Insert(ctx, ins)
	require.NoError(t, err)
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 5, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 2, "the gate's limit")

	// Both slots free, as an outcome batch frees them before it promotes.
	_, err = s.pool.Exec(ctx, `UPDATE `+s.schema+`.instances SET status = 'done', worker = NULL, lease_expires_at = NULL, key_shard = NULL
		WHERE status = 'executing'`)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `UPDATE `+s.schema+`.key_slots SET available = capacity`)
	require.NoError(t, err)
	count := func(status string) int {
		var n int
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.schema+`.instances WHERE key = 'api:x' AND status = $1`, status).Scan(&n))
		return n
	}
	require.Equal(t, 3, count("blocked"))

	// Another transaction holds the first two blocked rows (a claim's
	// window, a hand-off's candidates).
	holder, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT id FROM `+s.schema+`.instances WHERE key = 'api:x' AND status = 'blocked' ORDER BY priority, run_at, seq LIMIT 2 FOR UPDATE`)
	require.NoError(t, err)

	rows, err := s.pool.Query(ctx, s.q(sqlPromote), []string{"api:x"}, []int32{2}, nil, []bool{false})
	require.NoError(t, err)
	var stranded []string
	promoted, err := scanPromoted(rows, new([]string), func(k string) { stranded = append(stranded, k) }, nil)
	require.NoError(t, err)
	require.Equal(t, 1, promoted, "the third blocked row, the others locked")
	require.Equal(t, []string{"api:x"}, stranded, "a short promotion leaves the key stranded")

	strandedNow := func() []string { return strandedOf(t, s, []string{"api:x"}, []bool{false}) }
	require.Equal(t, []string{"api:x"}, strandedNow(), "two free slots, one ready row, blocked rows behind")

	require.NoError(t, holder.Rollback(ctx))
	_, err = s.pool.Exec(ctx, s.q(sqlPromoteIfRoom), []string{"api:x"}, promoteChunk, nil, s.channel, true)
	require.NoError(t, err)
	require.Equal(t, 2, count("ready"), "the heal promotes the room the ready row will not take, and no more")
	require.Equal(t, 1, count("blocked"))
	require.Empty(t, strandedNow(), "as many ready rows as free slots")
}

// strandedOf returns the keys of keys (one[i]: K = 1) that sqlStranded
// finds stranded.
func strandedOf(t *testing.T, s *Store, keys []string, one []bool) []string {
	t.Helper()
	rows, err := s.pool.Query(context.Background(), s.q(sqlStranded), keys, one)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return got
}
