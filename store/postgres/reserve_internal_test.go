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

// The reservation tests run each case on a K = 1 key and on a gate of
// limit 1: a reservation (store.Claimed.After) is a blocked row with the
// worker, which no claim, promotion or hand-off takes; the outcome that
// names it passes it its slot without touching the counter; released or
// reaped, it goes back to ready without crediting anything.

// reserveKeys are the keys the cases run on, with the limits they need.
var reserveKeys = []struct {
	key    string
	limits []gate.Limit
}{
	{"acct:1", nil},
	{"hot:1", []gate.Limit{{Name: "hot", Limit: 1, Shards: 1}}},
}

// reserveSetup holds key k with a claim and inserts n more rows of it.
func reserveSetup(t *testing.T, k string, limits []gate.Limit, n int) (*Store, store.Claimed, []string) {
	t.Helper()
	s, _ := freshKeyRows(t, k, limits, 0)
	holder := holdKey(t, s, k)
	return s, holder, insertKeyRows(t, s, k, n)
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

// TestReservationChain: a hand-off reserves successors; nothing else
// takes them; a batch with the outcomes of a chain passes the first
// row's slot to the last successor, the rows between never executing, and
// the counter never moves.
func TestReservationChain(t *testing.T) {
	for _, kc := range reserveKeys {
		t.Run(kc.key, func(t *testing.T) {
			ctx := context.Background()
			s, holder, ids := reserveSetup(t, kc.key, kc.limits, 4)
			before := gateAvailable(t, s, kc.key)
			handed, reserved := reserve(t, s, holder, 2)
			require.Len(t, handed, 1)
			require.Equal(t, ids[0], handed[0].ID)
			require.Len(t, reserved, 2)
			require.Equal(t, []string{ids[1], ids[2]}, []string{reserved[0].ID, reserved[1].ID}, "in the key's line")
			for _, r := range reserved {
				require.Equal(t, ids[0], r.After)
				in := rowOf(t, s, r.ID)
				require.Equal(t, store.StatusBlocked, in.Status)
				require.Equal(t, "w", in.Worker)
				require.NotZero(t, r.Fence)
			}
			require.Equal(t, before, gateAvailable(t, s, kc.key), "a hand-off and reservations do not touch the counter")
			info, err := s.KeyInfo(ctx, kc.key)
			require.NoError(t, err)
			require.NotNil(t, info.NextInLine)
			require.Equal(t, ids[1], info.NextInLine.ID, "the first reservation is the key's next row")

			// No claim, promotion or sweep takes a reserved row.
			c, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "other", Limit: 10, Lease: time.Minute})
			require.NoError(t, err)
			require.Empty(t, c.Claimed)
			_, err = s.Reconcile(ctx, 0, time.Time{})
			require.NoError(t, err)
			for _, r := range reserved {
				require.Equal(t, store.StatusBlocked, rowOf(t, s, r.ID).Status)
			}
			hb, err := s.Heartbeat(ctx, "w", []store.ClaimRef{{ID: reserved[0].ID, Fence: reserved[0].Fence},
				{ID: reserved[1].ID, Fence: reserved[1].Fence}}, time.Minute, time.Time{})
			require.NoError(t, err)
			require.Empty(t, hb.Lost, "a heartbeat renews reservations")

			// The chain: handed[0] → reserved[0] → reserved[1], the first
			// two outcomes in one batch.
			a, b := doneOf(handed[0]), doneOf(reserved[0])
			a.Successor = store.ClaimRef{ID: reserved[0].ID, Fence: reserved[0].Fence}
			b.Successor = store.ClaimRef{ID: reserved[1].ID, Fence: reserved[1].Fence}
			res, got, err := s.CompleteHandOff(ctx, "w", []store.Outcome{b, a}, time.Time{},
				store.HandOff{Room: map[string]int{}, Lease: time.Minute, Reserve: true})
			require.NoError(t, err)
			require.False(t, res[0].Stale, "the outcome of a reserved row whose predecessor's is in the batch")
			require.False(t, res[1].Stale)
			require.Len(t, got, 1, "the chain's end is passed the slot; the last waiting row is beyond Ahead 0")
			require.Equal(t, reserved[1].ID, got[0].ID)
			require.Equal(t, reserved[1].Fence, got[0].Fence, "the reservation's fence")
			require.Equal(t, store.StatusExecuting, rowOf(t, s, reserved[1].ID).Status)
			require.Equal(t, store.StatusDone, rowOf(t, s, reserved[0].ID).Status)
			require.Equal(t, store.StatusDone, rowOf(t, s, handed[0].ID).Status)
			require.Equal(t, before, gateAvailable(t, s, kc.key))

			// Its outcome frees the slot the usual way.
			_, err = s.Complete(ctx, "w", []store.Outcome{doneOf(got[0])}, time.Time{})
			require.NoError(t, err)
			if before >= 0 {
				require.Equal(t, before+1, gateAvailable(t, s, kc.key))
			}
			c, err = s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "other", Limit: 10, Lease: time.Minute})
			require.NoError(t, err)
			require.Len(t, c.Claimed, 1)
			require.Equal(t, ids[3], c.Claimed[0].ID)
		})
	}
}

// TestReservationGivenBack: a released reservation, and an expired one
// reaped, go back to ready in their place, crediting nothing; a reserved
// row canceled stays reserved, marked, until its claim ends.
func TestReservationGivenBack(t *testing.T) {
	for _, kc := range reserveKeys {
		t.Run(kc.key, func(t *testing.T) {
			ctx := context.Background()
			s, holder, _ := reserveSetup(t, kc.key, kc.limits, 4)
			before := gateAvailable(t, s, kc.key)
			handed, reserved := reserve(t, s, holder, 3)
			require.Len(t, handed, 1)
			require.Len(t, reserved, 3)

			require.NoError(t, s.Release(ctx, "w", []store.ClaimRef{{ID: reserved[0].ID, Fence: reserved[0].Fence}}, time.Time{}))
			in := rowOf(t, s, reserved[0].ID)
			require.Equal(t, store.StatusReady, in.Status)
			require.Empty(t, in.Worker)
			require.Equal(t, before, gateAvailable(t, s, kc.key), "a reservation holds no slot to give back")

			require.NoError(t, s.Cancel(ctx, reserved[1].ID, time.Time{}))
			in = rowOf(t, s, reserved[1].ID)
			require.Equal(t, store.StatusBlocked, in.Status, "its step may run in its predecessor's slot")
			require.True(t, in.CancelRequested)
			require.NoError(t, s.Cancel(ctx, reserved[1].ID, time.Time{}), "a second cancel is a no-op")
			require.NoError(t, s.Release(ctx, "w", []store.ClaimRef{{ID: reserved[1].ID, Fence: reserved[1].Fence}}, time.Time{}))
			require.Equal(t, store.StatusCanceled, rowOf(t, s, reserved[1].ID).Status)

			// Past every lease: the claim and the last reservation are reaped.
			n, err := s.Reap(ctx, time.Now().Add(time.Hour))
			require.NoError(t, err)
			require.Equal(t, 2, n)
			in = rowOf(t, s, reserved[2].ID)
			require.Equal(t, store.StatusReady, in.Status)
			require.Empty(t, in.Worker)
			if before >= 0 {
				require.Equal(t, before, gateAvailable(t, s, kc.key), "a reaped claim does not credit (the reconciler does)")
			}

			// An outcome naming a reservation that was given back frees
			// its slot the usual way instead.
			o := doneOf(handed[0])
			o.Successor = store.ClaimRef{ID: reserved[0].ID, Fence: reserved[0].Fence}
			res, got, err := s.CompleteHandOff(ctx, "w", []store.Outcome{o}, time.Time{},
				store.HandOff{Room: map[string]int{}, Lease: time.Minute})
			require.NoError(t, err)
			require.True(t, res[0].Stale, "the reaper took the claim back")
			require.Empty(t, got)
		})
	}
}

// TestReservationLostFreesTheSlot: when the reservation an outcome names
// was released meanwhile, the outcome frees its slot as without one.
func TestReservationLostFreesTheSlot(t *testing.T) {
	for _, kc := range reserveKeys {
		t.Run(kc.key, func(t *testing.T) {
			ctx := context.Background()
			s, holder, _ := reserveSetup(t, kc.key, kc.limits, 2)
			before := gateAvailable(t, s, kc.key)
			handed, reserved := reserve(t, s, holder, 1)
			require.Len(t, reserved, 1)
			require.NoError(t, s.Release(ctx, "w", []store.ClaimRef{{ID: reserved[0].ID, Fence: reserved[0].Fence}}, time.Time{}))
			o := doneOf(handed[0])
			o.Successor = store.ClaimRef{ID: reserved[0].ID, Fence: reserved[0].Fence}
			res, got, err := s.CompleteHandOff(ctx, "w", []store.Outcome{o}, time.Time{},
				store.HandOff{Room: map[string]int{}, Lease: time.Minute})
			require.NoError(t, err)
			require.False(t, res[0].Stale)
			require.Empty(t, got)
			if before >= 0 {
				require.Equal(t, before+1, gateAvailable(t, s, kc.key), "credited")
			}
			c, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "other", Limit: 10, Lease: time.Minute})
			require.NoError(t, err)
			require.Len(t, c.Claimed, 1)
			require.Equal(t, reserved[0].ID, c.Claimed[0].ID)
		})
	}
}

// TestSuccessorOnlyWithHandOff: Complete, which cannot pass a slot on,
// refuses an outcome that names a successor rather than free the slot
// under a step that may run in it.
func TestSuccessorOnlyWithHandOff(t *testing.T) {
	ctx := context.Background()
	s, holder, ids := reserveSetup(t, "acct:1", nil, 1)
	o := doneOf(holder)
	o.Successor = store.ClaimRef{ID: ids[0], Fence: 1}
	_, err := s.Complete(ctx, "w", []store.Outcome{o}, time.Time{})
	require.ErrorIs(t, err, store.ErrInvalid)
	require.Equal(t, store.StatusExecuting, rowOf(t, s, holder.ID).Status, "nothing committed")
}

// TestClaimReservesSuccessors: a claim asked for successors reserves, for
// the row it admits of a key it finds full, the key's next rows of its
// window, as a hand-off does; the row's outcome passes its slot to the
// first without touching the counter. Without Reserve it blocks them.
func TestClaimReservesSuccessors(t *testing.T) {
	for _, kc := range reserveKeys {
		t.Run(kc.key, func(t *testing.T) {
			ctx := context.Background()
			s, ids := freshKeyRows(t, kc.key, kc.limits, 4)
			res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 10, Lease: time.Minute, Reserve: 2})
			require.NoError(t, err)
			require.Len(t, res.Claimed, 3, "the key's first row, then its next two reserved")
			holder := res.Claimed[0]
			require.Equal(t, ids[0], holder.ID)
			require.Empty(t, holder.After)
			require.True(t, holder.Contended, "its outcome hands its slot on")
			require.Equal(t, store.StatusExecuting, holder.Status)
			for i, r := range res.Claimed[1:] {
				require.Equal(t, ids[i+1], r.ID, "in the key's line")
				require.Equal(t, ids[0], r.After)
				require.True(t, r.Contended)
				require.NotZero(t, r.Fence)
				in := rowOf(t, s, r.ID)
				require.Equal(t, store.StatusBlocked, in.Status)
				require.Equal(t, "w", in.Worker)
			}
			last := rowOf(t, s, ids[3])
			require.Equal(t, store.StatusBlocked, last.Status, "beyond Reserve: blocked as before")
			require.Empty(t, last.Worker)
			before := gateAvailable(t, s, kc.key)
			if before >= 0 {
				require.Equal(t, 0, before, "the holder took the slot; reservations take none")
			}

			// The holder's outcome passes its slot to its first successor.
			o := doneOf(holder)
			o.Successor = store.ClaimRef{ID: res.Claimed[1].ID, Fence: res.Claimed[1].Fence}
			out, got, err := s.CompleteHandOff(ctx, "w", []store.Outcome{o}, time.Time{},
				store.HandOff{Room: map[string]int{}, Lease: time.Minute})
			require.NoError(t, err)
			require.False(t, out[0].Stale)
			require.Len(t, got, 1)
			require.Equal(t, res.Claimed[1].ID, got[0].ID)
			require.Equal(t, store.StatusExecuting, rowOf(t, s, got[0].ID).Status)
			require.Equal(t, before, gateAvailable(t, s, kc.key))

			// A second claim finds the key full and nothing to take.
			again, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "other", Limit: 10, Lease: time.Minute, Reserve: 2})
			require.NoError(t, err)
			require.Empty(t, again.Claimed)
		})
	}
}

// TestClaimWithoutReserveReservesNothing: the default claim blocks a full
// key's further rows, as before.
func TestClaimWithoutReserveReservesNothing(t *testing.T) {
	for _, kc := range reserveKeys {
		t.Run(kc.key, func(t *testing.T) {
			ctx := context.Background()
			s, ids := freshKeyRows(t, kc.key, kc.limits, 4)
			res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 10, Lease: time.Minute})
			require.NoError(t, err)
			require.Len(t, res.Claimed, 1)
			require.Empty(t, res.Claimed[0].After)
			for _, id := range ids[1:] {
				in := rowOf(t, s, id)
				require.Equal(t, store.StatusBlocked, in.Status)
				require.Empty(t, in.Worker)
			}
		})
	}
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
