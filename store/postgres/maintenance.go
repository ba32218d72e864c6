package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sweepChunk bounds the rows one statement of a sweep (timers, reaper,
// retention) touches; sweeps loop until a chunk comes back short.
const sweepChunk = 1000

// FireTimers makes awaiting rows whose timeout passed ready and returns how
// many (see store.Store).
func (s *Store) FireTimers(ctx context.Context, now time.Time) (int, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	total := 0
	for {
		rows, err := s.pool.Query(ctx, s.q(sqlFireTimers), tsArg(now), sweepChunk, s.channel)
		if err != nil {
			return total, fmt.Errorf("fire timers: %w", err)
		}
		n, err := sumQueueCounts(rows)
		if err != nil {
			return total, fmt.Errorf("fire timers: %w", err)
		}
		total += n
		if n < sweepChunk {
			return total, nil
		}
	}
}

// sumQueueCounts adds up the (queue, n) rows of a notifying statement.
func sumQueueCounts(rows pgx.Rows) (int, error) {
	total := 0
	var q string
	var n int64
	_, err := pgx.ForEachRow(rows, []any{&q, &n}, func() error { total += int(n); return nil })
	return total, err
}

// Reap takes back claims whose lease expired (see store.Store): each row
// becomes ready with attempt + 1, its K = 1 key is free at once (the first
// blocked row of the key is promoted) and its gate slot is not credited.
func (s *Store) Reap(ctx context.Context, now time.Time) (int, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	total := 0
	for {
		n, err := s.takeBack(ctx, now, s.q(sqlReap), tsArg(now), sweepChunk)
		total += n
		if err != nil {
			return total, fmt.Errorf("reap: %w", err)
		}
		if n < sweepChunk {
			return total, nil
		}
	}
}

// ReclaimWorker takes back every claim held by worker, like Reap.
func (s *Store) ReclaimWorker(ctx context.Context, worker string, now time.Time) (int, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	n, err := s.takeBack(ctx, now, s.q(sqlReclaimWorker), tsArg(now), worker)
	if err != nil {
		return n, fmt.Errorf("reclaim worker %s: %w", worker, err)
	}
	return n, nil
}

// freeEndedHolds deletes the holds of rows of several keys whose claims
// have ended (sqlHoldsOrphaned) and frees their keys: every path that ends
// a claim deletes its holds, so this finds only what a path missed. The
// gates' counters are not credited: the reconciler's repair, which runs
// next, counts them from the holders.
func (s *Store) freeEndedHolds(ctx context.Context, now time.Time) error {
	tx, err := s.beginBatch(ctx)
	if err != nil {
		return err
	}
	defer tx.end()
	var freed []freedSlot
	b := &pgx.Batch{}
	b.Queue(s.q(sqlHoldsOrphaned), holdsSweepChunk).Query(func(rows pgx.Rows) error { return freedHolds(rows, &freed) })
	if err := tx.send(ctx, b, false); err != nil {
		return err
	}
	b = &pgx.Batch{}
	stranded := s.queueFree(b, freed, false, now)
	if err := tx.send(ctx, b, true); err != nil {
		return err
	}
	s.heal(ctx, stranded, now)
	return nil
}

// takeBack runs a reaping statement and frees the K = 1 keys it released,
// in one transaction; a child it ended canceled counts for its parent.
func (s *Store) takeBack(ctx context.Context, now time.Time, stmt string, args ...any) (int, error) {
	var freed []freedSlot
	queues := map[string]bool{}
	n := 0
	tx, err := s.beginBatch(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.end()
	b := &pgx.Batch{}
	ended := map[join]int{}
	b.Queue(stmt, args...).Query(func(rows pgx.Rows) error {
		return scanTakenBack(rows, func(f freedSlot, q string) {
			n++
			freed = append(freed, f)
			queues[q] = true
		}, ended)
	})
	// The holds of rows of several keys taken back (and any other hold
	// whose claim has ended).
	b.Queue(s.q(sqlHoldsOrphaned), holdsSweepChunk).Query(func(rows pgx.Rows) error { return freedHolds(rows, &freed) })
	if err := tx.send(ctx, b, false); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, nil
	}
	b = &pgx.Batch{}
	stranded := s.queueTakenBack(b, freed, false, queues, ended, now)
	if err := tx.send(ctx, b, true); err != nil {
		return 0, err
	}
	s.heal(ctx, stranded, now)
	return n, nil
}

// Reconcile repairs gate counters from the executing rows, promotes blocked
// rows whose key has room, deletes idle counters and, when retention > 0,
// terminal rows last changed more than retention ago (see store.Store).
//
// Counters are recomputed as capacity − executing rows per (key, shard),
// with capacities from the stored limits (see resizeShards for shards that
// hold more rows than a lowered limit gives them).
//
// Every statement of the sweep is bounded, and so is every transaction's
// hold on locks: the blocked keys are read reconcileKeyChunk at a time,
// the K = 1 keys of each such page are promoted in a transaction of their
// own (holding at most reconcileKeyChunk advisory locks), the gate
// counters are repaired reconcileChunk keys per transaction, and the
// deletions go sweepChunk rows per statement. Each step fails on its own:
// the sweep goes on with the next one, and returns every failed step's
// error joined, with the report of what the others did (a sweep whose
// key healing fails still deletes what retention asks).
func (s *Store) Reconcile(ctx context.Context, retention time.Duration, now time.Time) (store.ReconcileReport, error) {
	if err := s.check(); err != nil {
		return store.ReconcileReport{}, err
	}
	var rep store.ReconcileReport
	var errs []error

	// K = 1 keys with blocked rows, a page of keys at a time, promoted
	// as the page is read; blocked gate keys are kept for the gates'
	// repair.
	gateBlocked := map[string]bool{}
	if err := s.freeEndedHolds(ctx, now); err != nil {
		errs = append(errs, fmt.Errorf("reconcile: holds: %w", err))
	}
	if err := s.reconcileKeys(ctx, now, gateBlocked, &rep); err != nil {
		errs = append(errs, fmt.Errorf("reconcile: keys: %w", err))
	}
	if err := s.reconcileAllGates(ctx, now, gateBlocked, &rep); err != nil {
		errs = append(errs, fmt.Errorf("reconcile: gates: %w", err))
	}

	for {
		tag, err := s.pool.Exec(ctx, s.q(sqlBucketsCollect), tsArg(now), sweepChunk)
		if err != nil {
			errs = append(errs, fmt.Errorf("reconcile: rate buckets: %w", err))
			break
		}
		rep.BucketsDeleted += int(tag.RowsAffected())
		if tag.RowsAffected() < sweepChunk {
			break
		}
	}

	if _, err := s.pool.Exec(ctx, s.q(sqlLimitChangesCollect), tsArg(now), micros(store.LiveChangeFor)); err != nil {
		errs = append(errs, fmt.Errorf("reconcile: limit changes: %w", err))
	}

	if retention > 0 {
		cutoff := cmp.Or(now, time.Now()).Add(-retention)
		var from *time.Time // the first chunk starts at the oldest row
		for {
			var n int
			if err := s.pool.QueryRow(ctx, s.q(sqlDeleteTerminal), cutoff, sweepChunk, from).Scan(&n, &from); err != nil {
				errs = append(errs, fmt.Errorf("reconcile: retention: %w", err))
				break
			}
			rep.InstancesDeleted += n
			if n < sweepChunk {
				break
			}
		}
	}
	return rep, errors.Join(errs...)
}

// DeleteTerminal deletes up to limit terminal instances of workflow last
// changed before before and not before from, oldest first (see
// store.Store).
func (s *Store) DeleteTerminal(ctx context.Context, workflow string, from, before time.Time, limit int) (int, time.Time, error) {
	if err := s.check(); err != nil {
		return 0, from, err
	}
	if limit <= 0 {
		return 0, from, nil
	}
	var n int
	var last *time.Time
	if err := s.pool.QueryRow(ctx, s.q(sqlDeleteTerminalOf), workflow, before, limit, tsArg(from)).Scan(&n, &last); err != nil {
		return 0, from, fmt.Errorf("delete terminal instances of %s: %w", workflow, err)
	}
	if last == nil {
		return n, from, nil
	}
	return n, *last, nil
}

// reconcileKeyChunk bounds how many keys one read of the blocked keys
// returns, and so how many K = 1 advisory locks one reconciler transaction
// holds (besides a few relation locks). PostgreSQL's lock table holds
// max_locks_per_transaction × (max_connections + max_prepared_transactions)
// locks for every session at once (6,400 with the defaults), and a claim
// holds one per distinct K = 1 key of its window: a sweep must leave room
// for the fleet's claims.
var reconcileKeyChunk = 256

// holdsSweepChunk bounds how many ended holds of rows of several keys one
// reap or reconcile deletes (sqlHoldsOrphaned).
const holdsSweepChunk = 1000

// reconcileKeys reads the keys with blocked rows in key order,
// reconcileKeyChunk at a time; it promotes, in one transaction per page,
// one blocked row of each K = 1 key of the page that has room and no
// ready row, and adds the page's gate keys to gateBlocked.
func (s *Store) reconcileKeys(ctx context.Context, now time.Time, gateBlocked map[string]bool, rep *store.ReconcileReport) error {
	for after := ""; ; {
		rows, err := s.pool.Query(ctx, s.q(sqlBlockedKeys), after, reconcileKeyChunk)
		if err != nil {
			return err
		}
		var keys, oneKeys []string
		var limit *int32
		var key string
		if _, err := pgx.ForEachRow(rows, []any{&key, &limit}, func() error {
			keys = append(keys, key)
			if limit == nil {
				oneKeys = append(oneKeys, key)
			} else {
				gateBlocked[key] = true
			}
			return nil
		}); err != nil {
			return err
		}
		if len(oneKeys) > 0 {
			slices.Sort(oneKeys) // the lock order (see sql.go)
			if err := s.inTx(ctx, func(tx pgx.Tx) error {
				b := &pgx.Batch{}
				b.Queue(s.q(sqlKeyLock), oneKeys, s.keySalt)
				// Only keys with no ready row: a ready row holds the key's turn
				// (its claim and end pass it on), as the memory store counts it.
				b.Queue(s.q(sqlPromoteIfRoom), oneKeys, 1, tsArg(now), s.channel, true).Query(func(rows pgx.Rows) error {
					n, err := sumQueueCounts(rows)
					rep.Promoted += n
					return err
				})
				return tx.SendBatch(ctx, b).Close()
			}); err != nil {
				return err
			}
		}
		if len(keys) < reconcileKeyChunk {
			return nil
		}
		after = keys[len(keys)-1]
	}
}

// reconcileAllGates repairs the gate counters in chunks of keys (one
// transaction each, in key order), so that a sweep never locks every
// counter at once; the last chunk also promotes the gateBlocked keys that
// have neither counters nor executing rows.
func (s *Store) reconcileAllGates(ctx context.Context, now time.Time, gateBlocked map[string]bool, rep *store.ReconcileReport) error {
	for after := ""; ; {
		var upto *string
		var n int
		if err := s.pool.QueryRow(ctx, s.q(sqlSlotsChunkEnd), after, reconcileChunk).Scan(&upto, &n); err != nil {
			return err
		}
		if n < reconcileChunk {
			upto = nil // the last chunk: every key after, with a counter or not
		}
		var woken []string
		if err := s.inTx(ctx, func(tx pgx.Tx) error {
			return s.reconcileGates(ctx, tx, after, upto, gateBlocked, now, rep, &woken)
		}); err != nil {
			return err
		}
		s.wakeAfterCommit(woken)
		if upto == nil {
			return nil
		}
		after = *upto
	}
}

// reconcileChunk is how many keys' counters one reconciler transaction locks.
var reconcileChunk = 500

// reconcileGates repairs the counters of the keys after `after` up to and
// including upto (nil: every key after), in the database's key order, and
// promotes the blocked rows of the keys it repaired (removing them from
// gateBlocked); the last chunk (upto nil) also promotes the blocked rows of
// the gateBlocked keys no chunk had. The queues of the rows it promotes go
// to woken, to be notified once tx has committed.
func (s *Store) reconcileGates(ctx context.Context, tx pgx.Tx, after string, upto *string, gateBlocked map[string]bool, now time.Time, rep *store.ReconcileReport, woken *[]string) error {
	counters := map[string]map[int]slotTarget{} // key -> shard -> counter
	inUse := map[string]map[int]int{}           // key -> shard (-1: admitted at K = 1) -> executing rows
	b := &pgx.Batch{}
	b.Queue(s.q(sqlSlotsLockAll), after, upto).Query(scanCounters(counters))
	b.Queue(s.q(sqlGateHolders), after, upto).Query(func(rows pgx.Rows) error {
		var k string
		var sh int
		var n int64
		_, err := pgx.ForEachRow(rows, []any{&k, &sh, &n}, func() error {
			if inUse[k] == nil {
				inUse[k] = map[int]int{}
			}
			inUse[k][sh] += int(n)
			return nil
		})
		return err
	})
	var blocked []string // keys of the last chunk outside its range
	if upto == nil {
		blocked = mapKeys(gateBlocked)
	}
	storedLimits := s.queueLimitsFor(b, after, upto, blocked)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	limits, err := storedLimits()
	if err != nil {
		return err
	}

	keys := map[string]bool{}
	for k := range counters {
		keys[k] = true
	}
	for k := range inUse {
		if _, ok := limits.For(k); ok {
			keys[k] = true
		}
	}
	var (
		set slotRows // counters this sweep locked: overwritten
		// Counters this sweep did not lock (none existed when it took its
		// locks): a claim may have created and debited them since, after
		// the holders were read, so they are only created, never
		// overwritten (see sqlSlotsCreate).
		create       slotRows
		idle, orphan []string
		promoteKeys  []string
		promoteNs    []int32
	)
	for _, k := range mapKeys(keys) {
		l, limited := limits.For(k)
		if !limited {
			if len(inUse[k]) == 0 {
				orphan = append(orphan, k)
			}
			continue
		}
		var existing []int
		for sh := range counters[k] {
			existing = append(existing, sh)
		}
		target := resizeShards(l.ShardCapacities(), inUse[k], existing)
		free := 0
		busy := len(inUse[k]) > 0
		for sh, t := range target {
			free += t.available
			old, ok := counters[k][sh]
			if ok && old == t {
				continue
			}
			if !ok {
				create.add(k, sh, t)
				continue
			}
			rep.CountersRepaired++
			rep.Drift += absInt(t.available - old.available)
			set.add(k, sh, t)
		}
		if !busy {
			idle = append(idle, k)
		}
		if free > 0 && (gateBlocked[k] || counters[k] != nil) {
			promoteKeys, promoteNs = append(promoteKeys, k), append(promoteNs, int32(free))
		}
		delete(gateBlocked, k)
	}
	// Blocked rows of gated keys with no counter and nothing executing: the
	// whole limit is free.
	// Keys of every chunk are removed from gateBlocked as they are
	// repaired; what is left after the last chunk had neither counters nor
	// executing rows.
	for _, k := range mapKeys(gateBlocked) {
		if upto != nil {
			break
		}
		if l, ok := limits.For(k); ok {
			promoteKeys, promoteNs = append(promoteKeys, k), append(promoteNs, int32(l.Limit))
		}
	}

	b = &pgx.Batch{}
	set.queue(b, s.q(sqlSlotsInsert))
	if q := create.queue(b, s.q(sqlSlotsCreate)); q != nil {
		q.Exec(func(ct pgconn.CommandTag) error {
			rep.CountersRepaired += int(ct.RowsAffected())
			return nil
		})
	}
	if len(promoteKeys) > 0 {
		// Gate keys only; a key this sweep leaves stranded is the next sweep's.
		gates := make([]bool, len(promoteKeys))
		b.Queue(s.q(sqlPromote), promoteKeys, promoteNs, tsArg(now), gates).Query(func(rows pgx.Rows) error {
			n, err := scanPromoted(rows, woken, func(string) {}, nil)
			rep.Promoted += n
			return err
		})
	}
	if len(idle) > 0 {
		b.Queue(s.q(sqlSlotsDeleteIdle), idle).Exec(func(ct pgconn.CommandTag) error {
			rep.CountersDeleted += int(ct.RowsAffected())
			return nil
		})
	}
	if len(orphan) > 0 {
		b.Queue(s.q(sqlSlotsDelete), orphan).Exec(func(ct pgconn.CommandTag) error {
			rep.CountersDeleted += int(ct.RowsAffected())
			return nil
		})
	}
	if b.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, b).Close()
}

// slotTarget is what a counter holds, or should hold.
type slotTarget struct{ capacity, available int }

// slotRows are counters to write, one entry per (key, shard), as the
// arrays sqlSlotsInsert and sqlSlotsCreate take.
type slotRows struct {
	keys                    []string
	shards, caps, available []int32
}

func (r *slotRows) add(key string, shard int, t slotTarget) {
	r.keys, r.shards = append(r.keys, key), append(r.shards, int32(shard))
	r.caps, r.available = append(r.caps, int32(t.capacity)), append(r.available, int32(t.available))
}

// queue queues stmt over r's counters on b, and returns it; nil when r has
// none.
func (r slotRows) queue(b *pgx.Batch, stmt string) *pgx.QueuedQuery {
	if len(r.keys) == 0 {
		return nil
	}
	return b.Queue(stmt, r.keys, r.shards, r.caps, r.available)
}

// scanCounters reads rows of (key, shard, capacity, available) into into.
func scanCounters(into map[string]map[int]slotTarget) func(pgx.Rows) error {
	return func(rows pgx.Rows) error {
		var k string
		var sh int
		var c slotTarget
		_, err := pgx.ForEachRow(rows, []any{&k, &sh, &c.capacity, &c.available}, func() error {
			if into[k] == nil {
				into[k] = map[int]slotTarget{}
			}
			into[k][sh] = c
			return nil
		})
		return err
	}
}

// scanFreeCounters reads the rows of sqlSlotsOfKeysFree into into: the
// counters of the keys it locked whole. A key of several counters of
// which it did not lock every one goes to skipped, a key of one counter
// that it could not lock to lone; a key without counters goes nowhere.
func scanFreeCounters(into map[string]map[int]slotTarget, skipped, lone *[]string) func(pgx.Rows) error {
	return func(rows pgx.Rows) error {
		shards := map[string]int{}
		locked := map[string]map[int]slotTarget{}
		var order []string
		var k string
		var n int
		var sh, capacity, available *int
		_, err := pgx.ForEachRow(rows, []any{&k, &n, &sh, &capacity, &available}, func() error {
			if _, seen := shards[k]; !seen {
				order = append(order, k)
				shards[k] = n
			}
			if sh == nil {
				return nil
			}
			if locked[k] == nil {
				locked[k] = map[int]slotTarget{}
			}
			locked[k][*sh] = slotTarget{capacity: *capacity, available: *available}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range order {
			switch {
			case shards[k] == 0:
			case len(locked[k]) == shards[k]:
				into[k] = locked[k]
			case shards[k] == 1:
				*lone = append(*lone, k)
			default:
				*skipped = append(*skipped, k)
			}
		}
		return nil
	}
}

// resizeShards computes a key's counters from its limit's shard capacities
// and the slots in use per shard (shard -1: rows holding the key without a
// shard, admitted before its name had a limit, charged to shard 0). A shard
// keeps at least the capacity its holders use, so that no counter goes
// negative and every credit finds its slot; shards beyond the limit's count
// keep exactly what their holders use (nothing once they are empty) and
// claims no longer draw from them. Credits shrink such shards back to
// these targets as their rows finish (see sqlCredit), so that a sweep after
// a limit change finds no drift. A claim admits only while the key's
// slots in use over all its counters are below the limit, so a lowered
// limit holds while the rows admitted under the old one finish.
func resizeShards(caps []int, used map[int]int, existing []int) map[int]slotTarget {
	out := make(map[int]slotTarget, len(caps))
	for sh, c := range caps {
		u := used[sh]
		if sh == 0 {
			u += used[-1]
		}
		capacity := max(c, u)
		out[sh] = slotTarget{capacity: capacity, available: capacity - u}
	}
	for sh, u := range used {
		if sh >= len(caps) {
			out[sh] = slotTarget{capacity: u}
		}
	}
	for _, sh := range existing {
		if _, ok := out[sh]; !ok {
			out[sh] = slotTarget{}
		}
	}
	return out
}

func absInt(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// AcquireLease takes or renews a named lease (see store.Store).
func (s *Store) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (bool, error) {
	if err := s.check(); err != nil {
		return false, err
	}
	if name == "" || holder == "" || ttl <= 0 {
		return false, fmt.Errorf("acquire lease: %w: name, holder and a positive ttl are required", store.ErrInvalid)
	}
	var got string
	err := s.pool.QueryRow(ctx, s.q(sqlLeaseAcquire), name, holder, micros(ttl), tsArg(now)).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("acquire lease %s: %w", name, err)
	}
	return true, nil
}
