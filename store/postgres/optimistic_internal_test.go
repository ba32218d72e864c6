package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
)

// storeWithLimits is a store of a schema of its own with limits synced.
func storeWithLimits(t *testing.T, limits ...gate.Limit) *Store {
	t.Helper()
	s := newInternalStore(t)
	_, err := s.SyncLimits(context.Background(), limits)
	require.NoError(t, err)
	return s
}

// gateRows inserts n ready rows of key in queue q.
func gateRows(t *testing.T, s *Store, key string, n int) {
	t.Helper()
	var ins []store.NewInstance
	for range n {
		ins = append(ins, store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s",
			State: json.RawMessage(`{}`), Key: key})
	}
	_, err := s.Insert(context.Background(), ins)
	require.NoError(t, err)
}

func claimN(t *testing.T, s *Store, n int) []store.Claimed {
	t.Helper()
	res, err := s.Claim(context.Background(), store.ClaimRequest{Queue: "q", Worker: "w", Limit: n, Lease: time.Minute})
	require.NoError(t, err)
	return res.Claimed
}

// slotsOf returns shard -> (capacity, available) of key's counters, and the
// executing rows of the key per shard.
func slotsOf(t *testing.T, s *Store, key string) (counters map[int][2]int, executing map[int]int) {
	t.Helper()
	ctx := context.Background()
	counters, executing = map[int][2]int{}, map[int]int{}
	rows, err := s.pool.Query(ctx, s.q(`SELECT shard, capacity, available FROM {schema}.key_slots WHERE key = $1`), key)
	require.NoError(t, err)
	var sh, c, a int
	_, err = pgx.ForEachRow(rows, []any{&sh, &c, &a}, func() error { counters[sh] = [2]int{c, a}; return nil })
	require.NoError(t, err)
	rows, err = s.pool.Query(ctx, s.q(`SELECT key_shard, count(*) FROM {schema}.instances
		WHERE key = $1 AND status = 'executing' GROUP BY key_shard`), key)
	require.NoError(t, err)
	var n int
	_, err = pgx.ForEachRow(rows, []any{&sh, &n}, func() error { executing[sh] = n; return nil })
	require.NoError(t, err)
	return counters, executing
}

// claimWhileHeld locks key's counters in a transaction of its own, starts a
// claim of up to limit rows, and returns once the claim waits for those
// counters in its last statement: the transaction, for the test to change
// the counters and commit, and the channel the claim's rows arrive on. The
// claim waits for as long as the test takes (not optimisticLockWait, which
// a loaded machine could pass between two statements of the test).
func claimWhileHeld(t *testing.T, s *Store, key string, limit int) (pgx.Tx, <-chan []store.Claimed) {
	t.Helper()
	ctx := context.Background()
	s.optimisticWait = "60s"
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, s.q(`SELECT 1 FROM {schema}.key_slots WHERE key = $1 ORDER BY shard FOR UPDATE`), key)
	require.NoError(t, err)
	got := make(chan []store.Claimed, 1)
	go func() {
		res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: limit, Lease: time.Minute})
		if err != nil {
			t.Error(err)
		}
		got <- res.Claimed
	}()
	require.Eventually(t, lockWaiting(s, "%{schema}.key_slots%(key, shard) IN%FOR UPDATE%"), 10*time.Second, 5*time.Millisecond, "the claim never waited for the counters at its end")
	return tx, got
}

// TestOptimisticClaimDebitsLastAndOnlyWhatItRead: once a claim that locked
// a gate key's counters found them as the limit makes them, the next claims
// read them without locks and lock them only in their last statement,
// debiting exactly what they admitted; a transaction that holds the
// counters meanwhile (a flush crediting them) makes such a claim wait for
// it, not fail.
func TestOptimisticClaimDebitsLastAndOnlyWhatItRead(t *testing.T) {
	ctx := context.Background()
	s := storeWithLimits(t, gate.Limit{Name: "api", Limit: 6, Shards: 2})
	const key = "api:k"
	gateRows(t, s, key, 6)

	require.False(t, s.settled.has(key))
	first := claimN(t, s, 1)
	require.Len(t, first, 1)
	require.True(t, s.settled.has(key), "a claim that locked every counter as the limit makes them settles the key")

	tx, got := claimWhileHeld(t, s, key, 3)
	// Meanwhile the first row ends and its slot is credited, as a flush
	// does: the claim must debit the counter as this commit leaves it, not
	// as it read it.
	_, err := tx.Exec(ctx, s.q(`UPDATE {schema}.instances SET status = 'done', worker = NULL, lease_expires_at = NULL,
		key_shard = NULL WHERE id = $1`), first[0].ID)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, s.q(`UPDATE {schema}.key_slots SET available = available + 1 WHERE key = $1 AND shard = $2`),
		key, first[0].KeyShard)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	claimed := <-got
	require.Len(t, claimed, 3)
	require.False(t, s.hot.has(key))

	counters, executing := slotsOf(t, s, key)
	total := 0
	for sh, c := range counters {
		require.Equal(t, c[0]-executing[sh], c[1], "shard %d: capacity %d, %d free, %d executing", sh, c[0], c[1], executing[sh])
		total += executing[sh]
	}
	require.Equal(t, 3, total)
}

// severalRows inserts a ready row for each of accts, holding the K = 1
// key acct:<a> and the gate key key, in queue q.
func severalRows(t *testing.T, s *Store, key string, accts ...int) {
	t.Helper()
	var ins []store.NewInstance
	for _, a := range accts {
		ins = append(ins, store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s",
			State: json.RawMessage(`{}`), Key: fmt.Sprintf("acct:%d", a), Also: []store.KeyRef{{Key: key}}})
	}
	_, err := s.Insert(context.Background(), ins)
	require.NoError(t, err)
}

// gateHolds returns, per shard of gate key, the holds of the rows of
// several keys that hold it as another key.
func gateHolds(t *testing.T, s *Store, key string) map[int]int {
	t.Helper()
	holds := map[int]int{}
	rows, err := s.pool.Query(context.Background(), s.q(`SELECT shard, count(*) FROM {schema}.key_holds WHERE key = $1 GROUP BY shard`), key)
	require.NoError(t, err)
	var sh, n int
	_, err = pgx.ForEachRow(rows, []any{&sh, &n}, func() error { holds[sh] = n; return nil })
	require.NoError(t, err)
	return holds
}

// TestOptimisticClaimOfSeveralKeysDebitsLast: a window of rows of several
// keys whose gate is settled, not hot and not filled by them is claimed
// optimistically, as a window of rows of one key is: its gate's counters
// are read without a lock and locked, waiting, only in its last
// statement, after the rows' K = 1 keys were locked and their holds
// written; a transaction holding the counters meanwhile (a flush crediting
// the slot of a row that ended) makes it wait, and it debits the counters
// as that commit left them.
func TestOptimisticClaimOfSeveralKeysDebitsLast(t *testing.T) {
	ctx := context.Background()
	s := storeWithLimits(t, gate.Limit{Name: "api", Limit: 6, Shards: 2})
	const key = "api:k"
	severalRows(t, s, key, 0)
	first := claimN(t, s, 1)
	require.Len(t, first, 1)
	require.True(t, s.settled.has(key), "a claim that locked every counter as the limit makes them settles the key")
	require.False(t, s.hot.has(key))

	severalRows(t, s, key, 1, 2, 3)
	tx, got := claimWhileHeld(t, s, key, 3)
	// The first row ends as a flush ends it: done, its hold deleted and
	// that shard credited.
	_, err := tx.Exec(ctx, s.q(`UPDATE {schema}.instances SET status = 'done', worker = NULL, lease_expires_at = NULL
		WHERE id = $1`), first[0].ID)
	require.NoError(t, err)
	var shard int
	require.NoError(t, tx.QueryRow(ctx, s.q(`DELETE FROM {schema}.key_holds WHERE instance_id = $1 AND key = $2 RETURNING shard`),
		first[0].ID, key).Scan(&shard))
	_, err = tx.Exec(ctx, s.q(`UPDATE {schema}.key_slots SET available = available + 1 WHERE key = $1 AND shard = $2`), key, shard)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	claimed := <-got
	require.Len(t, claimed, 3)
	for _, c := range claimed {
		require.Regexp(t, `^acct:[123]$`, c.Key)
		require.Equal(t, []string{c.Key, key}, c.KeyList(), "row %s holds its gate as another key", c.ID)
	}
	require.Zero(t, s.debitsLost.Load())
	counters, _ := slotsOf(t, s, key)
	holds := gateHolds(t, s, key)
	require.Len(t, counters, 2)
	used := map[int]int{}
	for sh, c := range counters {
		if c[0] > c[1] {
			used[sh] = c[0] - c[1]
		}
	}
	require.Equal(t, holds, used, "each shard's slots in use are the holds of the rows that run under it")
	total := 0
	for _, n := range holds {
		total += n
	}
	require.Equal(t, 3, total)
}

// TestOptimisticClaimFailsAndLocksWhenALimitChangedUnderIt: a limit change
// that commits between an optimistic claim's read and its debit rewrites
// the counters with new epochs. Here it lowers the limit from 4 over two
// shards to 2 over one, which leaves shard 0's capacity as it was (2, one
// slot free) while shard 1 keeps only the slot its row holds; the claim had
// planned on shard 0 under the old limit. Its debit must fail on the epoch
// (the capacity and the room still match), and the claim, made again with
// the counters locked, must see the key full under the new limit: without
// the epoch, three rows would execute under a limit of two.
func TestOptimisticClaimFailsAndLocksWhenALimitChangedUnderIt(t *testing.T) {
	ctx := context.Background()
	s := storeWithLimits(t, gate.Limit{Name: "api", Limit: 4, Shards: 2})
	const key = "api:k"
	gateRows(t, s, key, 4)
	require.Len(t, claimN(t, s, 2), 2) // one row on each shard
	require.True(t, s.settled.has(key))

	tx, got := claimWhileHeld(t, s, key, 1)
	// The limit change, as applyLimitChanges writes it (resizeShards: shard
	// 0 keeps capacity 2 with its one row, shard 1 shrinks to its row).
	_, err := tx.Exec(ctx, s.q(`UPDATE {schema}.limits SET "limit" = 2, shards = 1 WHERE name = 'api'`))
	require.NoError(t, err)
	_, err = tx.Exec(ctx, s.q(sqlSlotsInsert), []string{key, key}, []int32{0, 1}, []int32{2, 1}, []int32{1, 0})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	require.Empty(t, <-got, "the key is full under its new limit")
	require.True(t, s.hot.has(key), "the claim was made again with its counters locked, and found the key full")
	_, executing := slotsOf(t, s, key)
	require.Equal(t, 2, executing[0]+executing[1])
	var blocked int
	require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT count(*) FROM {schema}.instances WHERE key = $1 AND status = 'blocked'`), key).Scan(&blocked))
	require.Equal(t, 2, blocked, "the locking claim blocks the key's rows")
}

// TestOptimisticClaimNeverBlocks: an optimistic claim that finds no room
// leaves the rows ready (it holds no counter, so a transaction freeing a
// slot could miss a row it blocked) and marks the key hot; the next claim
// locks the counters and blocks them.
func TestOptimisticClaimNeverBlocks(t *testing.T) {
	ctx := context.Background()
	s := storeWithLimits(t, gate.Limit{Name: "api", Limit: 2})
	const key = "api:k"
	gateRows(t, s, key, 1)
	require.Len(t, claimN(t, s, 1), 1)
	gateRows(t, s, key, 1)
	require.Len(t, claimN(t, s, 1), 1) // optimistic: the last free slot
	require.False(t, s.hot.has(key))
	gateRows(t, s, key, 2)

	require.Empty(t, claimN(t, s, 2)) // optimistic: full
	status := func() (ready, blocked int) {
		require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT count(*) FILTER (WHERE status = 'ready'),
			count(*) FILTER (WHERE status = 'blocked') FROM {schema}.instances WHERE key = $1`), key).Scan(&ready, &blocked))
		return ready, blocked
	}
	ready, blocked := status()
	require.Equal(t, [2]int{2, 0}, [2]int{ready, blocked})
	require.True(t, s.hot.has(key))

	require.Empty(t, claimN(t, s, 2)) // locking: full, blocks
	ready, blocked = status()
	require.Equal(t, [2]int{0, 2}, [2]int{ready, blocked})
}

// TestOptimisticClaimsOfSeveralStoresNeverExceedK runs four stores (four
// engines' worth of hot and settled sets) with two claimers each against
// one gate of limit 6 over three shards, while a reconciler sweeps (it
// rewrites counters with new epochs). Each claimer forgets which keys are
// hot before every claim, so that claims are optimistic whenever the key is
// settled and race one another for the last slots: some must find a
// counter changed and be made again with the counters locked. No claim may
// fail, no more than 6 rows may be in flight at once by the workers' own
// count, and once everything ran the counters must be whole again. The
// rows hold the gate alone, or (several keys) the gate as another key
// beside one of ten K = 1 keys, each of which may run one row at a time.
func TestOptimisticClaimsOfSeveralStoresNeverExceedK(t *testing.T) {
	t.Run("one key", func(t *testing.T) { optimisticRace(t, false) })
	t.Run("several keys", func(t *testing.T) { optimisticRace(t, true) })
}

func optimisticRace(t *testing.T, several bool) {
	const (
		stores   = 4
		claimers = 2
		rows     = 300
		limit    = 6
		key      = "wide:k"
		accts    = 10
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	first := storeWithLimits(t, gate.Limit{Name: "wide", Limit: limit, Shards: 3})
	ss := []*Store{first}
	for range stores - 1 {
		s, err := New(ctx, first.pool, Options{Schema: first.schema})
		require.NoError(t, err)
		ss = append(ss, s)
	}
	if several {
		ids := make([]int, rows)
		for i := range ids {
			ids[i] = i % accts
		}
		severalRows(t, first, key, ids...)
	} else {
		gateRows(t, first, key, rows)
	}

	var (
		inFlight, maxSeen, done atomic.Int64
		acctMu                  sync.Mutex
		acctRunning             = map[string]int{}
		acctOver                []string
		wg                      sync.WaitGroup
	)
	// acctRun records that the claimed rows' K = 1 keys start (d = 1) or
	// end (d = -1) running, noting any key that runs two rows at once.
	acctRun := func(cs []store.Claimed, d int) {
		if !several {
			return
		}
		acctMu.Lock()
		defer acctMu.Unlock()
		for _, c := range cs {
			if acctRunning[c.Key] += d; acctRunning[c.Key] > 1 {
				acctOver = append(acctOver, c.Key)
			}
		}
	}
	errs := make(chan error, stores*claimers+1)
	for i, s := range ss {
		for c := range claimers {
			worker := fmt.Sprintf("w%d-%d", i, c)
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(i), uint64(c)))
				for ctx.Err() == nil && done.Load() < rows {
					s.hot.cool(key)
					res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: worker, Limit: 1 + rng.IntN(3), Lease: time.Minute})
					if err != nil {
						errs <- fmt.Errorf("%s: claim: %w", worker, err)
						return
					}
					if len(res.Claimed) == 0 {
						time.Sleep(200 * time.Microsecond)
						continue
					}
					n := inFlight.Add(int64(len(res.Claimed)))
					for m := maxSeen.Load(); n > m && !maxSeen.CompareAndSwap(m, n); m = maxSeen.Load() {
					}
					acctRun(res.Claimed, 1)
					time.Sleep(time.Millisecond + time.Duration(rng.IntN(3000))*time.Microsecond)
					outs := make([]store.Outcome, len(res.Claimed))
					for j, cl := range res.Claimed {
						outs[j] = store.Outcome{ID: cl.ID, Fence: cl.Fence, Kind: store.OutcomeDone}
					}
					acctRun(res.Claimed, -1)
					inFlight.Add(-int64(len(res.Claimed)))
					if _, err := s.Complete(ctx, worker, outs, time.Time{}); err != nil {
						errs <- fmt.Errorf("%s: complete: %w", worker, err)
						return
					}
					done.Add(int64(len(outs)))
				}
			})
		}
	}
	wg.Go(func() {
		for ctx.Err() == nil && done.Load() < rows {
			if _, err := first.Reconcile(ctx, 0, time.Time{}); err != nil {
				errs <- fmt.Errorf("reconcile: %w", err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.EqualValues(t, rows, done.Load(), "every row ran")
	require.LessOrEqual(t, maxSeen.Load(), int64(limit), "rows in flight at once")
	require.Empty(t, acctOver, "K = 1 keys that ran two rows at once")
	lost := int64(0)
	for _, s := range ss {
		lost += s.debitsLost.Load()
	}
	t.Logf("max in flight %d of %d; optimistic claims made again: %d", maxSeen.Load(), limit, lost)
	require.Positive(t, lost, "no optimistic claim raced another for the last slots")
	counters, executing := slotsOf(t, first, key)
	for sh, c := range counters {
		require.Equal(t, 0, executing[sh])
		require.Equal(t, c[0], c[1], "shard %d: every slot back", sh)
	}
	if several {
		require.Empty(t, gateHolds(t, first, key), "every hold deleted")
	}
}

// TestClaimLocksNoBusyKeyItWouldLeaveReady: a K = 1 key that was busy when
// the window was read and has a single row in it is not locked by the
// claim (its row would be left ready anyway), so that its holder's outcome,
// which frees the key under the key's lock, does not wait for the claim's
// commit; a busy key with more rows in the window is locked (the claim may
// block them), and so is a free one (the claim may admit its row).
func TestClaimLocksNoBusyKeyItWouldLeaveReady(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	tx, err := s.beginBatch(ctx)
	require.NoError(t, err)
	defer tx.end()
	require.NoError(t, tx.send(ctx, &pgx.Batch{}, false))
	row := func(id, key string) admission.Candidate { return admission.Candidate{ID: id, Key: key} }
	cc := &claimContext{queue: "q", limit: 10, now: time.Now(),
		candidates: []admission.Candidate{row(uuid.NewString(), "acct:lone"),
			row(uuid.NewString(), "acct:two"), row(uuid.NewString(), "acct:two"), row(uuid.NewString(), "acct:free")},
		busyOne: map[string]bool{"acct:lone": true, "acct:two": true}}
	// acct:tried's lock was tried by the window's statement and refused:
	// admit does not try it again.
	cc.candidates = append(cc.candidates, row(uuid.NewString(), "acct:tried"))
	cc.tried = map[string]bool{"acct:tried": false}
	_, _, err = s.admit(ctx, tx.q(), cc, false)
	require.NoError(t, err)
	var locks int
	require.NoError(t, tx.q().QueryRow(ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted`).Scan(&locks))
	require.Equal(t, 2, locks, "acct:two and acct:free, not acct:lone nor acct:tried")
}

// TestClaimWindowReadsWhichKeysAreBusy: the window's statement says, per
// row of a K = 1 key, what it found of the key (oneState): busy when the key
// had an executing row, and otherwise whether it took the key's lock (held
// by another transaction: refused), or, in a queue with a policy, that it
// left the lock to admit; never anything for a gate key or a keyless row.
// The lock it takes is held by the claim's transaction.
func TestClaimWindowReadsWhichKeysAreBusy(t *testing.T) {
	ctx := context.Background()
	s := storeWithLimits(t, gate.Limit{Name: "api", Limit: 2})
	gateRows(t, s, "acct:busy", 1)
	gateRows(t, s, "api:k", 1)
	require.Len(t, claimN(t, s, 2), 2) // acct:busy and api:k execute
	gateRows(t, s, "acct:busy", 1)     // in blocked behind its holder: made ready here, as a promotion would
	_, err := s.pool.Exec(ctx, s.q(`UPDATE {schema}.instances SET status = 'ready' WHERE key = 'acct:busy' AND status = 'blocked'`))
	require.NoError(t, err)
	gateRows(t, s, "acct:free", 1)
	gateRows(t, s, "acct:held", 1)
	gateRows(t, s, "api:k", 1)
	gateRows(t, s, "", 1)

	// Another transaction holds acct:held's lock.
	other, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	_, err = other.Exec(ctx, s.q(sqlKeyTryLock), []string{"acct:held"}, s.keySalt)
	require.NoError(t, err)

	window := func(tx pgx.Tx) map[string]int32 {
		rows, err := tx.Query(ctx, s.q(sqlClaimCandidates), "q", nil, []string{}, 10, 10, s.keySalt, []int32{})
		require.NoError(t, err)
		found := map[string]int32{}
		var id, key string
		var limit, shards, rLimit, rBurst *int32
		var rPeriod *int64
		var rPerKey *bool
		var one int32
		var extra, intents []string
		var intent *string
		_, err = pgx.ForEachRow(rows, []any{&id, &key, &limit, &shards, &rLimit, &rPeriod, &rBurst, &rPerKey, &one,
			&extra, &intents, &intent}, func() error {
			found[key] = one
			return nil
		})
		require.NoError(t, err)
		return found
	}
	locks := func(tx pgx.Tx) int {
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted`).Scan(&n))
		return n
	}

	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]int32{"acct:busy": oneBusy, "acct:free": oneLocked, "acct:held": oneRefused,
		"api:k": oneNone, "": oneNone}, window(tx))
	require.Equal(t, 1, locks(tx), "acct:free's lock, held by the claim's transaction")
	require.NoError(t, tx.Rollback(ctx))

	// A queue with a policy takes its queue's lock before its keys' (admit).
	_, err = s.SyncConcurrencyPolicies(ctx, "ns", []store.ConcurrencyPolicy{{Queue: "q", MaxActive: 100}}, store.SyncOptions{})
	require.NoError(t, err)
	tx, err = s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.Equal(t, map[string]int32{"acct:busy": oneBusy, "acct:free": oneUntried, "acct:held": oneUntried,
		"api:k": oneNone, "": oneNone}, window(tx))
	require.Equal(t, 0, locks(tx))
}

// TestClaimUpdateLeavesARowOfABusyKeyReady: the window's statement reads a
// K = 1 key before it takes the key's lock, so the claim's update moves a
// row admitted under K = 1 only while no row of its key executes. Here a
// row of the key executes (as if made so by a transaction that committed
// between the window's snapshot and its lock): the admitted row stays ready,
// and a keyless row and a row of a free key are claimed.
func TestClaimUpdateLeavesARowOfABusyKeyReady(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	gateRows(t, s, "acct:a", 1)
	require.Len(t, claimN(t, s, 1), 1) // acct:a executes
	gateRows(t, s, "acct:a", 1)
	_, err := s.pool.Exec(ctx, s.q(`UPDATE {schema}.instances SET status = 'ready' WHERE key = 'acct:a' AND status = 'blocked'`))
	require.NoError(t, err)
	gateRows(t, s, "acct:b", 1)
	gateRows(t, s, "", 1)
	var ids []string
	rows, err := s.pool.Query(ctx, s.q(`SELECT id::text FROM {schema}.instances WHERE status = 'ready' ORDER BY key NULLS FIRST`))
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, ids, 3) // keyless, acct:a, acct:b

	rows, err = s.pool.Query(ctx, s.q(sqlClaim), uuidArg(ids), "w", int64(60e6), []int32{-1, -1, -1}, nil, nil, nil, nil)
	require.NoError(t, err)
	claimed := map[string]bool{}
	var cs claimScan
	for rows.Next() {
		c, err := scanClaimed(rows, &cs)
		require.NoError(t, err)
		claimed[c.Key] = true
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]bool{"": true, "acct:b": true}, claimed)
	var status string
	require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT status FROM {schema}.instances WHERE id = $1`), ids[1]).Scan(&status))
	require.Equal(t, "ready", status)
}

// TestOptimisticClaimGivesUpWaitingForItsCounters: an optimistic claim
// waits for its counters in its last statement for optimisticLockWait at
// most; past it, the claim is made again with the counters locked (tried,
// never waited for), so that it never sits in a wait cycle with a
// transaction freeing slots (see optimisticLockWait). Here another
// transaction holds the key's counters for two seconds: the claim returns
// well before that, with the row left ready, and the key marked hot.
func TestOptimisticClaimGivesUpWaitingForItsCounters(t *testing.T) {
	ctx := context.Background()
	s := storeWithLimits(t, gate.Limit{Name: "api", Limit: 2})
	const key = "api:k"
	gateRows(t, s, key, 1)
	require.Len(t, claimN(t, s, 1), 1) // locks the counters: the key is settled
	require.True(t, s.settled.has(key))
	require.False(t, s.hot.has(key))

	holder, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, s.q(`SELECT 1 FROM {schema}.key_slots WHERE key = $1 FOR UPDATE`), key)
	require.NoError(t, err)
	released := make(chan struct{})
	go func() {
		time.Sleep(2 * time.Second)
		_ = holder.Rollback(ctx)
		close(released)
	}()
	defer func() { <-released }()

	gateRows(t, s, key, 1)
	began := time.Now()
	claimed := claimN(t, s, 1)
	took := time.Since(began)
	require.Empty(t, claimed, "the counters are held: the claim made again with locks leaves the row ready")
	require.Less(t, took, time.Second, "the optimistic claim gave up its wait")
	require.EqualValues(t, 1, s.debitsLost.Load())
	require.True(t, s.hot.has(key))
	var ready int
	require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT count(*) FROM {schema}.instances WHERE key = $1 AND status = 'ready'`), key).Scan(&ready))
	require.Equal(t, 1, ready)
}
