package postgres

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// The rules of reservations are store/storetest's reserve/ rules, which
// every backend passes; the tests here pin what only this backend does with
// them: the statements a hand-off's transaction plans.

// reserveKeys are the keys the cases run on, with the limits they need.
var reserveKeys = []struct {
	key    string
	limits []gate.Limit
}{
	{"acct:1", nil},
	{"hot:1", []gate.Limit{{Name: "hot", Limit: 1, Shards: 1}}},
}

// freshKeyRows inserts n rows of key k, which no claim holds, one insert
// each (so in the key's line in that order).
func freshKeyRows(t *testing.T, k string, limits []gate.Limit, n int) (*Store, []string) {
	t.Helper()
	s := newInternalStore(t)
	if len(limits) > 0 {
		_, err := s.SyncLimits(context.Background(), limits)
		require.NoError(t, err)
	}
	return s, insertKeyRows(t, s, k, n)
}

// insertKeyRows inserts n rows of key k, one insert each, and returns their ids.
func insertKeyRows(t *testing.T, s *Store, k string, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		in := keyedInstance(k)
		_, err := s.Insert(context.Background(), []store.NewInstance{in})
		require.NoError(t, err)
		ids = append(ids, in.ID)
	}
	return ids
}

func doneOf(c store.Claimed) store.Outcome {
	return store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone, Contended: true}
}

// gateAvailable is the free slots of a gate key's counters (-1: none, a
// K = 1 key).
func gateAvailable(t *testing.T, s *Store, k string) int {
	t.Helper()
	var n *int
	require.NoError(t, s.pool.QueryRow(context.Background(),
		s.q(`SELECT sum(available)::int FROM {schema}.key_slots WHERE key = $1`), k).Scan(&n))
	if n == nil {
		return -1
	}
	return *n
}

func rowOf(t *testing.T, s *Store, id string) store.Instance {
	t.Helper()
	in, err := s.Get(context.Background(), id)
	require.NoError(t, err)
	return in
}

// reserve completes holder with a hand-off that may reserve ahead
// successors, and returns the rows handed off and reserved.
func reserve(t *testing.T, s *Store, holder store.Claimed, ahead int) (handed, reserved []store.Claimed) {
	t.Helper()
	o := doneOf(holder)
	o.Ahead = ahead
	res, got, err := s.CompleteHandOff(context.Background(), "w", []store.Outcome{o}, time.Time{},
		store.HandOff{Room: map[string]int{"q": 1}, Lease: time.Minute, Reserve: true})
	require.NoError(t, err)
	require.False(t, res[0].Stale)
	for _, c := range got {
		if c.After != "" {
			reserved = append(reserved, c)
		} else {
			handed = append(handed, c)
		}
	}
	return handed, reserved
}

// TestHandOffPlansTheFreeingStatements: a connection's first transaction
// that hands a slot off also parses and plans the statements that free
// slots (queueFreeing), which it does not need itself, without changing
// anything: the slot still passes on, the counter does not move.
func TestHandOffPlansTheFreeingStatements(t *testing.T) {
	for _, rk := range reserveKeys {
		t.Run(rk.key, func(t *testing.T) {
			ctx := context.Background()
			base, _ := freshKeyRows(t, rk.key, rk.limits, 0)
			cfg := base.pool.Config()
			cfg.MaxConns = 1 // every call below runs on the one backend
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			defer pool.Close()
			s, err := New(ctx, pool, Options{Schema: base.schema})
			require.NoError(t, err)
			var warm pgx.Batch
			s.queueFreeing(&warm)
			freeing := batchSQL(&warm)
			prepared := func(texts ...string) int {
				var n int
				require.NoError(t, pool.QueryRow(ctx,
					`SELECT count(DISTINCT statement)::int FROM pg_prepared_statements WHERE statement = ANY ($1::text[])`,
					texts).Scan(&n))
				return n
			}

			holder := holdKey(t, s, rk.key)
			next := insertKeyRows(t, s, rk.key, 1)
			require.Zero(t, prepared(s.q(sqlCredit), s.q(sqlPromote), s.q(sqlKeysWaiting)), "the claim and the inserts do not free slots")
			before := gateAvailable(t, s, rk.key)
			handed, _ := reserve(t, s, holder, 0)
			require.Len(t, handed, 1)
			require.Equal(t, next[0], handed[0].ID)
			require.Equal(t, len(freeing), prepared(freeing...), "the hand-off planned every freeing statement")
			require.Equal(t, before, gateAvailable(t, s, rk.key), "the slot passed on: the counter did not move")
			require.Equal(t, store.StatusExecuting, rowOf(t, s, next[0]).Status)
		})
	}
}

// batchSQL is the distinct statements queued in b.
func batchSQL(b *pgx.Batch) []string {
	var out []string
	for _, q := range b.QueuedQueries {
		if !slices.Contains(out, q.SQL) {
			out = append(out, q.SQL)
		}
	}
	return out
}

// TestFreeingCoversQueueFree: queueFreeing (planned early by a
// connection's first hand-off) queues every statement that queueFree
// queues for a K = 1 key and a gate shard, credited, and the waiting-key
// read of an outcome batch; no more.
func TestFreeingCoversQueueFree(t *testing.T) {
	s := &Store{schema: "t_free"}
	var freeing, free pgx.Batch
	s.queueFreeing(&freeing)
	s.queueFree(&free, []freedSlot{{key: "acct:1", shard: -1, waiters: true}, {key: "hot:1", shard: 0, waiters: true}}, true, time.Time{})
	free.Queue(s.q(sqlKeysWaiting), []string{"acct:1", "hot:1"})
	require.ElementsMatch(t, batchSQL(&free), batchSQL(&freeing))
}
