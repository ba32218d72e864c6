package postgres

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// This file holds the admission rules: how a claim turns the ready rows at
// the head of a queue into executing rows without ever admitting more than
// a key's K, a queue's policy or a rate limit's tokens allow. The whole
// claim is one READ COMMITTED transaction:
//
//  1. Due delayed rows and due await timeouts of the queue become ready
//     (with their rounds: see store.Store, Order).
//  2. The window: the first ready rows of the queue in claim order
//     (priority, round, run_at, insertion), locked FOR UPDATE SKIP LOCKED,
//     so that concurrent claimers take disjoint rows and never wait on each
//     other; the claim's now and the queue's policy are read alongside.
//     Keyless rows (Limit of them) and keyed rows (the window) come from
//     separate indexes, merged in claim order: keyed rows waiting for their
//     keys never crowd keyless work out of the window.
//  3. Locks, always in this order (see sql.go): the queue's advisory lock
//     when it has a policy, then its executing rows are counted (a new
//     statement, so it sees every claim committed before the lock); the
//     K = 1 keys' advisory locks (tried, never waited for: in a queue
//     without a policy, by the window's statement itself for the keys not
//     busy in its snapshot, which saves the claim a round trip, so the
//     claim's update checks again that no row of such a key executes; not
//     even tried for a key that was busy when the window was read and has
//     one row in it, which is left ready either way); gate counters
//     in (key, shard) order (tried too: FOR UPDATE SKIP LOCKED); rate
//     buckets in bucket order. A claim never waits for a lock that a
//     transaction freeing slots holds while it holds a counter or a
//     bucket, so such a transaction may wait for the row locks a claim
//     holds (see sqlPromote). An optimistic claim (see optimistic) reads
//     its gate counters here without locking them, and locks them,
//     waiting, only in its last statement (step 5).
//  4. Admission, decided by the planner (admission.Decide, no I/O) from
//     what steps 2 and 3 read, walking the window in order; a row is
//     admitted only when every limit admits it, and only then is anything
//     debited:
//     - a row without a key needs nothing of its own;
//     - a K = 1 key is admitted only by the claimer holding its advisory
//     lock (a claimer that does not get it leaves the row ready for the
//     next claim) and only if no row of the key is executing; the first
//     row of the key is admitted and the rest of the key's rows become
//     blocked;
//     - a gated key needs a shard with a free slot while the key's slots in
//     use over all its counters are below its limit, and is blocked
//     otherwise. When another transaction holds some of its counters, it
//     may still take a slot of a locked shard if the key's shards are clean
//     (see admission.Decide), but it is never blocked: the holder may be freeing
//     a slot, and its promotion might not see the row;
//     - with a MaxActivePerKey, a keyed row is blocked while that many rows
//     of its key execute in the queue (admitted ones included);
//     - with a MaxActive, rows stay ready once that many rows of the queue
//     execute;
//     - a key with a rate limit needs a token in its bucket, refilled to
//     the claim's now; a row without one is rescheduled to when its token
//     is due (the i-th such row of a bucket in this claim to when the
//     bucket holds i tokens) and keeps its round.
//     Every path that takes a keyed row out of executing takes the same
//     lock (the advisory lock, waiting; or the counter row) before it
//     promotes the key's first blocked row, so a row can never be blocked
//     by a claim while its key frees unseen (a lost promotion).
//     A saturated key's ready rows beyond the window are blocked too, in
//     bounded chunks, so that its backlog leaves the pick path: by the
//     first claim that finds the key full and admits none of its rows (see
//     admission.Plan.Backlog).
//  5. The debits are written (counters, buckets), the admitted rows become
//     executing with a new fence and the lease, the refused rows are
//     blocked or rescheduled. An optimistic claim debits its counters
//     last, each only if it still has the capacity, epoch and room the
//     claim read, and otherwise fails as a whole (nothing of it commits)
//     and is made again, locking its counters. It waits for those counters
//     for optimisticLockWait at most, and past it fails the same way.
//  6. NextDue when fewer than Limit rows were claimed.
//
// The unique index on executing K = 1 keys and the CHECKs on counters and
// buckets stay as the guarantee that over-admission cannot commit even if
// these rules had a flaw.

// DefaultLease is the lease of a claim whose request has none.
const DefaultLease = store.DefaultLease

const (
	// minWindow is the smallest keyed window a claim looks at; the window is
	// Limit rows and what the queue's last claim passed over, up to Limit
	// more (see windows), at least minWindow, at most max(Limit, maxWindow). A claim
	// holds one advisory lock per distinct K = 1 key of its window, so at
	// most max(2 × Limit, minWindow) and never more than max(Limit,
	// maxWindow) (an engine's Limit is its free executors: 32 locks at the
	// default 10), and an outcome batch one per K = 1 key it frees.
	// PostgreSQL's lock table holds max_locks_per_transaction ×
	// (max_connections + max_prepared_transactions) locks for every
	// session at once (6,400 with the defaults); the reconciler takes at
	// most reconcileKeyChunk at a time to leave them to the claims.
	minWindow = 32
	maxWindow = 1000
	// promoteChunk bounds how many delayed rows and await timeouts of the
	// queue one claim makes ready.
	promoteChunk = 1000
	// backlogChunk bounds how many ready rows of one saturated key one claim
	// moves to blocked beyond the window.
	backlogChunk = 1000
)

type slotRow struct {
	shard, capacity, available int
}

type shardKey struct {
	key   string
	shard int
}

// claimContext is what a claim reads about its queue before admission.
type claimContext struct {
	now               time.Time // the claim's now (the database's when the request has none)
	maxActive, perKey *int32    // the queue's policy (nil: none)
	paused            bool      // the queue is paused (store.ClaimResult.Paused)
	queue             string
	limit             int
	reserve           int // successors asked for each admitted row of a full key (admission.State.Reserve)
	candidates        []admission.Candidate
	nextDue           *time.Time
	// busyOne holds the K = 1 keys of the window that had an executing row
	// when the window was read (before any lock: a hint; see admit), and
	// tried the ones whose advisory lock the window statement tried, with
	// whether it was had (see oneLocked).
	busyOne, tried map[string]bool
	// busyLocked holds the K = 1 keys admit read busy under their locks
	// (admission.State.Busy): every K = 1 key of a row of several keys, and
	// the keys of rows of one key whose lock the window did not try.
	busyLocked map[string]bool
	// multi holds the window's rows of several keys, by id.
	multi map[string]multiRow
	// free holds, for the gate keys of the rows of several keys, the free
	// slots of their counters as alsoLimits read them, without a lock: a
	// hint of which rows a full gate will refuse (see admit).
	free map[string]int
}

// The window statement's last column (sqlClaimCandidates) says what it
// found of a row's K = 1 key:
const (
	oneNone    = 0 // the row is keyless or of a gate key
	oneBusy    = 1 // the key had an executing row in the statement's snapshot
	oneLocked  = 2 // not busy, and the statement took the key's lock
	oneRefused = 3 // not busy, and another transaction held the key's lock
	oneUntried = 4 // not busy, in a queue with a policy: admit takes the lock
	oneMulti   = 5 // a row of several keys: admit takes the lock with its other keys'
)

// multiRow is what a claim knows of a row of several keys in its window:
// the key in its key column (Candidate.Key, which is the key it waits in
// line for, see migration 025) and its other keys, with their intents.
type multiRow struct {
	key    store.KeyRef
	others []store.KeyRef
}

// atFirst reports whether the row's key column holds its first key
// (store.NormalizeKeys), the key it executes under, so that it waits in
// that key's line (admission.Waiting.AtFirst).
func (m multiRow) atFirst() bool {
	first, rest := m.key, slices.Clone(m.others)
	return store.NormalizeKeys(&first.Key, &first.Intent, &rest) == nil && first.Key == m.key.Key
}

// shards maps each key of the row to the shard a plan's admission of it
// debited (-1: K = 1).
func (m multiRow) shards(a admission.Admitted) map[string]int {
	shardOf := map[string]int{m.key.Key: a.Shard}
	for _, h := range a.Also {
		shardOf[h.Key] = h.Shard
	}
	return shardOf
}

// Claim admits and claims up to req.Limit rows of req.Queue (see the rules above).
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := s.check(); err != nil {
		return store.ClaimResult{}, err
	}
	if ok, err := store.NormalizeClaim(&req); !ok {
		return store.ClaimResult{}, err
	}
	defer s.claimed.fire()
	res, err := s.claim(ctx, req, false)
	switch {
	case isDebitLost(err):
		// An optimistic claim found a counter changed (nothing of it was
		// committed): claim again, locking the counters.
		s.debitsLost.Add(1)
		res, err = s.claim(ctx, req, true)
	case errors.Is(err, errCountersUnsettled):
		res, err = s.claim(ctx, req, true)
	}
	return res, err
}

// errCountersUnsettled ends an optimistic claim (nothing of it committed)
// that left rows of a gate key whose counters it found missing or made
// under another limit than the key's: only a claim that locks them can
// tell whether those rows have room.
var errCountersUnsettled = errors.New("gate counters not as the limit makes them")

// isDebitLost reports whether err is an optimistic claim's failed debit
// (debit_check), or its wait for its counters given up (lock_timeout: see
// optimisticLockWait).
func isDebitLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "GD001" || pgErr.Code == "55P03") // lock_not_available
}

// optimisticLockWait bounds how long an optimistic claim waits for its
// counters in its last statement (lock_timeout); past it, the claim fails
// as a lost debit and is made again with its counters locked (tried, never
// waited for). A transaction freeing slots holds its counters for a few
// milliseconds: in three runs of make bench's scenario 4 (20,000 steps
// each) the server logged no lock timeout. The bound is there to break this
// wait cycle: a freeing transaction that holds counters promotes a key's
// blocked rows SKIP LOCKED, but PostgreSQL does not skip, it waits, when
// the row it finds was updated since its snapshot and the newer version is
// being written by a transaction still in progress ("while locking updated
// version" of the tuple). That transaction can be an optimistic claim that
// admitted the row and now waits for those counters. Seen once under
// TestOptimisticClaimsOfSeveralStoresNeverExceedK (two outcome batches
// failed with deadlock detected).
const optimisticLockWait = 50 * time.Millisecond

// workflowArrays returns the names and the versions of ws, pairwise, as
// the statements that take a worker's workflow versions read them (never
// NULL: an empty list runs every row).
func workflowArrays(ws []store.WorkflowVersion) (names []string, versions []int32) {
	names, versions = make([]string, len(ws)), make([]int32, len(ws))
	for i, w := range ws {
		names[i], versions[i] = w.Workflow, int32(w.Version)
	}
	return names, versions
}

// claim is one attempt of Claim; lock makes it lock its gate counters
// whatever their keys (see optimistic).
func (s *Store) claim(ctx context.Context, req store.ClaimRequest, lock bool) (store.ClaimResult, error) {
	lease := req.Lease
	window := s.windows.size(req.Queue, req.Limit)
	now := tsArg(req.Now)
	workflows, versions := workflowArrays(req.Workflows)

	cc := &claimContext{queue: req.Queue, limit: req.Limit, reserve: min(req.Reserve, aheadMax),
		busyOne: map[string]bool{}, tried: map[string]bool{}}
	tx, err := s.beginGeneric(ctx)
	if err != nil {
		return store.ClaimResult{}, fmt.Errorf("claim %s: %w", req.Queue, err)
	}
	defer tx.end()
	b := &pgx.Batch{}
	b.Queue(s.q(sqlPromoteScheduled), req.Queue, now, promoteChunk)
	b.Queue(s.q(sqlFireQueueTimers), req.Queue, now, promoteChunk)
	b.Queue(s.q(sqlClaimContext), req.Queue, now).QueryRow(func(row pgx.Row) error {
		return row.Scan(&cc.now, &cc.maxActive, &cc.perKey, &cc.paused)
	})
	b.Queue(s.q(sqlNextDue), req.Queue).QueryRow(func(row pgx.Row) error { return row.Scan(&cc.nextDue) })
	// The whole claim runs its generic plans from the start (see
	// sqlNoSeqScanGeneric), the window included: PostgreSQL never settles
	// on the window's generic plan by itself, and its custom plan took
	// longer to make than to run.
	b.Queue(s.q(sqlClaimCandidates), req.Queue, now, workflows, window, req.Limit, s.keySalt, versions).Query(func(rows pgx.Rows) error {
		var (
			c              admission.Candidate
			lc             limitColumns
			one            int32
			extra, intents []string
			intent         *string
		)
		_, err := pgx.ForEachRow(rows, []any{&c.ID, &c.Key, &lc.limit, &lc.shards, &lc.rLimit, &lc.rPeriod, &lc.rBurst, &lc.rPerKey,
			&one, &extra, &intents, &intent}, func() error {
			c.Also = nil
			if len(extra) > 0 {
				m := multiRow{key: store.KeyRef{Key: c.Key}}
				if intent != nil {
					m.key.Intent = gate.Intent(*intent)
				}
				for i, k := range extra {
					m.others = append(m.others, store.KeyRef{Key: k, Intent: gate.Intent(intents[i])})
				}
				if cc.multi == nil {
					cc.multi = map[string]multiRow{}
				}
				cc.multi[c.ID] = m
				c.Also = make([]admission.Need, len(extra)) // filled by alsoLimits
			}
			switch one {
			case oneBusy:
				cc.busyOne[c.Key] = true
			case oneLocked, oneRefused:
				// A lock once had is held to the end of the transaction.
				cc.tried[c.Key] = cc.tried[c.Key] || one == oneLocked
			}
			c.Gate, c.Rate = lc.limits(c.Key)
			cc.candidates = append(cc.candidates, c)
			return nil
		})
		return err
	})
	if err := tx.send(ctx, b, false); err != nil {
		return store.ClaimResult{}, fmt.Errorf("claim %s: %w", req.Queue, err)
	}
	if len(cc.multi) > 0 {
		if err := s.alsoLimits(ctx, tx.q(), cc); err != nil {
			return store.ClaimResult{}, fmt.Errorf("claim %s: %w", req.Queue, err)
		}
	}

	plan, seen, err := s.admit(ctx, tx.q(), cc, lock)
	if err != nil {
		return store.ClaimResult{}, fmt.Errorf("claim %s: %w", req.Queue, err)
	}
	passed := s.windows.record(req.Queue, req.Limit, cc.candidates, plan.Admitted)

	res := store.ClaimResult{PassedOver: passed, Paused: cc.paused}
	b = &pgx.Batch{}
	var debitKeys []string
	var debitShards, debitNs []int32
	if len(plan.Debits) > 0 {
		sks := plan.SortedDebits()
		debitKeys, debitShards, debitNs = make([]string, len(sks)), make([]int32, len(sks)), make([]int32, len(sks))
		for i, sk := range sks {
			debitKeys[i], debitShards[i], debitNs[i] = sk.Key, int32(sk.Shard), int32(plan.Debits[sk])
		}
		if seen == nil {
			b.Queue(s.q(sqlDebit), debitKeys, debitShards, debitNs)
		}
	}
	if len(plan.Buckets) > 0 {
		ids := mapKeys(plan.Buckets)
		credits, ats := make([]int64, len(ids)), make([]time.Time, len(ids))
		for i, id := range ids {
			credits[i], ats[i] = plan.Buckets[id].Credit, plan.Buckets[id].At
		}
		b.Queue(s.q(sqlBucketsSet), ids, credits, ats)
	}
	var mc multiClaim // what the admitted rows of several keys write
	if len(plan.Admitted) > 0 {
		ids := make([]string, len(plan.Admitted))
		shards := make([]int32, len(plan.Admitted))
		for i, a := range plan.Admitted {
			ids[i], shards[i] = a.ID, int32(a.Shard)
		}
		res.Claimed = make([]store.Claimed, 0, len(plan.Admitted))
		mc = claimMulti(cc.multi, plan.Admitted, shards)
		b.Queue(s.q(sqlClaim), uuidArg(ids), req.Worker, micros(lease), shards, now, mc.firsts, mc.intents, mc.extras).Query(func(rows pgx.Rows) error {
			var cs claimScan
			for rows.Next() {
				c, err := scanClaimed(rows, &cs)
				if err != nil {
					return err
				}
				res.Claimed = append(res.Claimed, c)
			}
			return rows.Err()
		})
	}
	if len(plan.Reserved) > 0 {
		ids, afters := make([]string, len(plan.Reserved)), make([]string, len(plan.Reserved))
		after := make(map[string]string, len(plan.Reserved))
		for i, r := range plan.Reserved {
			ids[i], afters[i], after[r.ID] = r.ID, r.After, r.After
		}
		b.Queue(s.q(sqlClaimReserve), uuidArg(ids), req.Worker, micros(lease), now, uuidArg(afters)).Query(func(rows pgx.Rows) error {
			var cs claimScan
			for rows.Next() {
				c, err := scanClaimed(rows, &cs)
				if err != nil {
					return err
				}
				c.After = after[c.ID]
				res.Claimed = append(res.Claimed, c)
			}
			return rows.Err()
		})
	}
	var throttled []string
	var throttledAt []time.Time
	for _, t := range plan.Throttled {
		throttled, throttledAt = append(throttled, t.ID), append(throttledAt, t.RunAt)
	}
	if len(throttled) > 0 {
		b.Queue(s.q(sqlThrottle), throttled, throttledAt, cc.now)
	}
	// The holders of K = 1 keys with rows left waiting are marked before
	// any row is blocked behind them (see sqlFlagHolders).
	waited := waitedKeys(cc, plan)
	if len(waited) > 0 {
		b.Queue(s.q(sqlFlagHolders), waited)
	}
	s.queueHolds(b, mc, req.Worker)
	// Blocking runs after the claim: the backlog statement must not see the admitted rows as ready.
	blocked := plan.Blocked
	if len(plan.BlockedOn) > 0 {
		blocked = slices.DeleteFunc(slices.Clone(blocked), func(id string) bool { _, ok := plan.BlockedOn[id]; return ok })
		s.queueBlockMulti(b, cc, plan, now, waited)
	}
	if len(blocked) > 0 {
		b.Queue(s.q(sqlBlock), blocked, now, waited)
	}
	if len(plan.Backlog) > 0 {
		b.Queue(s.q(sqlBlockBacklog), plan.Backlog, backlogChunk, now, admission.ReadyCap, waited)
	}
	s.hot.mark(plan.Saturated...)
	s.hot.cool(plan.Roomy...) // gate keys with slots to spare: the usual path serves them (see recentKeys)
	if seen != nil {
		// An optimistic claim locks its counters last, so that it holds
		// them for this statement and the commit only.
		if len(debitKeys) > 0 {
			caps, epochs := make([]int32, len(debitKeys)), make([]int64, len(debitKeys))
			for i, k := range debitKeys {
				c := seen[shardKey{k, int(debitShards[i])}]
				caps[i], epochs[i] = int32(c.capacity), c.epoch
			}
			b.Queue(sqlLockTimeout, s.optimisticWait)
			b.Queue(s.q(sqlSlotsLockExisting), debitKeys, debitShards)
			b.Queue(s.q(sqlDebitChecked), debitKeys, debitShards, debitNs, caps, epochs)
		}
	}
	if err := tx.send(ctx, b, true); err != nil {
		if seen != nil && isDebitLost(err) {
			// Claims race for these keys' slots: lock them for a while.
			s.hot.mark(debitKeys...)
		}
		return store.ClaimResult{}, fmt.Errorf("claim %s: %w", req.Queue, err)
	}
	if len(cc.multi) > 0 {
		holdsOf(res.Claimed, cc.multi, plan.Admitted)
	}
	admitted := 0
	for i, c := range res.Claimed {
		res.Claimed[i].Contended = c.After != "" || s.anyKeyHot(c.Instance)
		if c.After == "" {
			admitted++
		}
	}
	if admitted < req.Limit {
		next := fromPtr(cc.nextDue)
		for _, at := range throttledAt {
			if next.IsZero() || at.Before(next) {
				next = at
			}
		}
		res.NextDue = next
	}
	return res, nil
}

// waitedKeys returns, sorted, the K = 1 keys of a claim's window whose
// holders are to be marked as having waiters (see sqlFlagHolders): those of
// which the plan blocks rows, and those with a row the plan left ready
// while the key was held (busy when the window was read, or taken by this
// claim), so that the holder's end notifies its queue. A key the plan
// blocks no row of and passed over for want of room is not waiting on
// anyone. An empty list when there are none, never nil: a statement
// argument.
func waitedKeys(cc *claimContext, plan admission.Plan) []string {
	keys := []string{}
	isOne := func(c admission.Candidate) bool { return c.Key != "" && c.Gate == nil }
	if !slices.ContainsFunc(cc.candidates, isOne) && len(plan.BlockedOn) == 0 {
		return keys // no K = 1 row in the window: the usual claim of keyless or gated work
	}
	const (
		admitted = 1 + iota
		settled  // reserved or rescheduled: waiting on no holder
		blocked
	)
	fate := make(map[string]int, len(cc.candidates))
	for _, a := range plan.Admitted {
		fate[a.ID] = admitted
	}
	for _, r := range plan.Reserved {
		fate[r.ID] = settled
	}
	for _, t := range plan.Throttled {
		fate[t.ID] = settled
	}
	for _, id := range plan.Blocked {
		fate[id] = blocked
	}
	taken := map[string]bool{} // K = 1 keys this claim admitted a row of
	for _, c := range cc.candidates {
		if isOne(c) && len(c.Also) == 0 && fate[c.ID] == admitted {
			taken[c.Key] = true
		}
	}
	waited := map[string]bool{}
	for _, c := range cc.candidates {
		f := fate[c.ID]
		if k, ok := plan.BlockedOn[c.ID]; ok {
			// A row of several keys blocked on a K = 1 key waits on that
			// key's holder.
			if !waited[k] && oneKey(c, k) {
				waited[k] = true
				keys = append(keys, k)
			}
			continue
		}
		if len(c.Also) > 0 && isOne(c) && f == 0 && !waited[c.Key] && (cc.busyLocked[c.Key] || taken[c.Key]) {
			// A row of several keys left ready as the only row in sight of
			// the busy K = 1 key in its key column waits on that key's
			// holder, as a row of one key does.
			waited[c.Key] = true
			keys = append(keys, c.Key)
			continue
		}
		if len(c.Also) > 0 || !isOne(c) || f == admitted || f == settled || waited[c.Key] {
			continue
		}
		if f == blocked || cc.busyOne[c.Key] || taken[c.Key] {
			waited[c.Key] = true
			keys = append(keys, c.Key)
		}
	}
	slices.Sort(keys)
	return keys
}

// seenCounter is a counter's capacity and epoch as an optimistic claim read
// them: it debits the counter only if they are unchanged (sqlDebitChecked).
type seenCounter struct {
	capacity int
	epoch    int64
}

// admit reads the state of the window's keys and queue, taking the locks
// admission needs in the documented order, and hands it to the planner
// (package admission), which decides; the caller writes the plan. When the
// claim is optimistic (see optimistic), admit reads the gate counters
// without locking them and returns what it read of each (seen); the caller
// then debits them with sqlDebitChecked. Otherwise seen is nil.
func (s *Store) admit(ctx context.Context, tx querier, cc *claimContext, lock bool) (plan admission.Plan, seen map[shardKey]seenCounter, err error) {
	var (
		oneKeys   []string                  // K = 1 keys of the window
		gateKeys  []string                  // gated keys of the window
		allKeys   []string                  // every key of the window
		gateLimit = map[string]gate.Limit{} // gated key -> its limit
		bucketCap = map[string]int64{}      // rate bucket -> its capacity
		inSight   = map[string]int{}        // K = 1 key -> its rows in the window (admission.State.InSight)
	)
	var multiOne []string // K = 1 keys of rows of several keys: always locked here
	// A key's limit comes from the window for the rows it is the key column
	// of, and from sqlKeyLimits, a later statement, for the rows it is
	// another key of: a limit change committed in between gives the key
	// two limits in one window (two gated ones, or gated and K = 1). Such a
	// key decides nothing this claim (its rows are left ready for the next,
	// which reads one limit), so that no row is admitted or blocked under
	// the limit the key no longer has (limitMoved, as for a limit that
	// changed after the window: below).
	limitMoved := map[string]bool{}
	refused, filled := refusedByFullGates(cc.candidates, cc.free)
	for _, c := range cc.candidates {
		if c.Key == "" {
			continue
		}
		for _, n := range append([]admission.Need{{Key: c.Key, Gate: c.Gate, Rate: c.Rate}}, c.Also...) {
			allKeys = append(allKeys, n.Key)
			if n.Rate != nil {
				bucketCap[n.Rate.BucketFor(n.Key)] = n.Rate.Capacity()
			}
			switch {
			case n.Gate == nil:
				inSight[n.Key]++
				if refused[c.ID] {
					continue // left unlocked: its gate refuses it (see refusedByFullGates)
				}
				oneKeys = append(oneKeys, n.Key)
				if len(c.Also) > 0 {
					multiOne = append(multiOne, n.Key)
				}
			default:
				if l, ok := gateLimit[n.Key]; !ok {
					gateLimit[n.Key] = *n.Gate
					gateKeys = append(gateKeys, n.Key)
				} else if l.Limit != n.Gate.Limit || l.Shards != n.Gate.Shards {
					limitMoved[n.Key] = true
				}
			}
		}
	}
	if len(cc.multi) > 0 {
		for k := range inSight {
			if _, gated := gateLimit[k]; gated {
				limitMoved[k] = true
			}
		}
	}
	// A K = 1 key that was busy when the window was read, with a single
	// row in the window, is not locked: that row would be left ready
	// whether the key is still busy (see admission.Decide: its only row in
	// sight) or not (the lock could be had only if its holder ended since,
	// and then its freeing transaction notifies the queue of this ready row,
	// which the next claim takes). Its holder's outcome frees the key with
	// the key's lock, waiting: a claim that held the lock of its next row
	// made that flush wait for the claim's commit (the peers' keyed run:
	// 3.9 ms per flush).
	//
	// A key whose lock the window statement tried is settled too: had, it
	// is held; refused, another claim or a freeing transaction holds it,
	// and the row is left ready (no second try: that holder will most
	// likely still hold it). What is left to lock here is a busy key with
	// several rows in the window (its rows beyond the first are blocked if
	// it is still busy once locked) and, in a queue with a policy, every
	// key, after the queue's lock.
	//
	// A row of several keys is decided on the state of each of them read
	// here, under their locks, whatever the window found: the window reads
	// whether a key is busy before it tries the key's lock, and sqlClaim's
	// check of that read covers a row's key column alone. So a key of such
	// a row is locked (again, if the window had it: a lock is re-entrant)
	// and read busy or not here, and that read decides for every row of
	// the key.
	slices.Sort(multiOne)
	oneKeys = slices.DeleteFunc(oneKeys, func(k string) bool {
		if _, multi := slices.BinarySearch(multiOne, k); multi {
			return false
		}
		_, tried := cc.tried[k]
		return tried || cc.busyOne[k] && inSight[k] < 2
	})
	for _, ks := range []*[]string{&oneKeys, &allKeys} {
		slices.Sort(*ks)
		*ks = slices.Compact(*ks)
	}
	slices.Sort(gateKeys)

	st := admission.State{
		Now:       cc.now,
		Limit:     cc.limit,
		Reserve:   cc.reserve,
		Locked:    map[string]bool{},
		Busy:      map[string]bool{},
		InSight:   inSight,
		Gates:     map[string]admission.GateState{},
		KeyActive: map[string]int{},
		Buckets:   map[string]gate.Bucket{},
	}
	maps.Copy(st.Locked, cc.tried) // refused ones are false
	b := &pgx.Batch{}
	if cc.maxActive != nil {
		st.Policy = &admission.Policy{MaxActive: int(*cc.maxActive)}
		perKeyKeys := []string{}
		if cc.perKey != nil {
			st.Policy.MaxActivePerKey = int(*cc.perKey)
			perKeyKeys = allKeys
		}
		if perKeyKeys == nil {
			perKeyKeys = []string{}
		}
		b.Queue(s.q(sqlQueueLock), cc.queue, s.queueSalt)
		b.Queue(s.q(sqlQueueActive), cc.queue, perKeyKeys).Query(func(rows pgx.Rows) error {
			var k string
			var n int64
			_, err := pgx.ForEachRow(rows, []any{&k, &n}, func() error {
				if k == "" {
					st.Active = int(n)
				} else {
					st.KeyActive[k] = int(n)
				}
				return nil
			})
			return err
		})
	}
	if len(oneKeys) > 0 {
		b.Queue(s.q(sqlKeyTryLock), oneKeys, s.keySalt).Query(func(rows pgx.Rows) error {
			i := 0
			var got bool
			_, err := pgx.ForEachRow(rows, []any{&got}, func() error {
				if got {
					st.Locked[oneKeys[i]] = true
				}
				i++
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlKeyBusy), oneKeys).Query(func(rows pgx.Rows) error {
			var k string
			_, err := pgx.ForEachRow(rows, []any{&k}, func() error { st.Busy[k] = true; return nil })
			return err
		})
	}
	cc.busyLocked = st.Busy
	if len(gateKeys) > 0 && !lock && s.optimistic(gateKeys, len(bucketCap) > 0, filled) {
		seen = map[shardKey]seenCounter{}
		b.Queue(s.q(sqlSlotsRead), gateKeys).Query(func(rows pgx.Rows) error {
			var k string
			var r admission.Counter
			var epoch int64
			var limit, shards *int32
			_, err := pgx.ForEachRow(rows, []any{&k, &r.Shard, &r.Capacity, &r.Available, &epoch, &limit, &shards}, func() error {
				seen[shardKey{k, r.Shard}] = seenCounter{capacity: r.Capacity, epoch: epoch}
				if limitDiffers(gateLimit[k], limit, shards) {
					limitMoved[k] = true
				}
				g := st.Gates[k]
				g.Counters = append(g.Counters, r)
				g.HeldElsewhere, g.Count = true, g.Count+1
				st.Gates[k] = g
				return nil
			})
			return err
		})
	} else if len(gateKeys) > 0 {
		var keys []string
		var shards, caps []int32
		for _, k := range gateKeys {
			for i, c := range gateLimit[k].ShardCapacities() {
				keys, shards, caps = append(keys, k), append(shards, int32(i)), append(caps, int32(c))
			}
		}
		b.Queue(s.q(sqlSlotsEnsure), keys, shards, caps)
		b.Queue(s.q(sqlSlotsTryLock), gateKeys).Query(func(rows pgx.Rows) error {
			var k string
			var r admission.Counter
			_, err := pgx.ForEachRow(rows, []any{&k, &r.Shard, &r.Capacity, &r.Available}, func() error {
				g := st.Gates[k]
				g.Counters = append(g.Counters, r)
				st.Gates[k] = g
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlSlotsCount), gateKeys).Query(func(rows pgx.Rows) error {
			var k string
			var n int64
			var limit, shards *int32
			_, err := pgx.ForEachRow(rows, []any{&k, &n, &limit, &shards}, func() error {
				if limitDiffers(gateLimit[k], limit, shards) {
					limitMoved[k] = true
				}
				if g := st.Gates[k]; len(g.Counters) < int(n) {
					g.HeldElsewhere, g.Count = true, int(n)
					st.Gates[k] = g
				}
				return nil
			})
			return err
		})
	}
	if len(bucketCap) > 0 {
		ids := mapKeys(bucketCap)
		credits := make([]int64, len(ids))
		for i, id := range ids {
			credits[i] = bucketCap[id]
		}
		b.Queue(s.q(sqlBucketsLock), ids, credits, cc.now)
		b.Queue(s.q(sqlBucketsRead), ids).Query(func(rows pgx.Rows) error {
			var id string
			var bk gate.Bucket
			_, err := pgx.ForEachRow(rows, []any{&id, &bk.Credit, &bk.At}, func() error {
				st.Buckets[id] = bk
				return nil
			})
			return err
		})
	}
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return admission.Plan{}, nil, fmt.Errorf("admission locks: %w", err)
		}
	}
	if seen != nil {
		for _, k := range gateKeys {
			lim := gateLimit[k]
			if g := st.Gates[k]; g.Count != lim.Shards || limitMoved[k] {
				// Counters missing (an idle key's are deleted), left over
				// from a re-shard, or read under another limit than the
				// window's rows: none is taken to be as the limit makes
				// it, and the next claim locks them (creating the missing
				// ones).
				st.Gates[k] = admission.GateState{HeldElsewhere: true}
				s.settled.cool(k)
			}
		}
	} else {
		for _, k := range gateKeys {
			if limitMoved[k] {
				// Its limit changed since the window was read: its rows
				// are left ready for the next claim, which reads the new
				// limit, rather than blocked by the old one.
				st.Gates[k] = admission.GateState{HeldElsewhere: true}
				continue
			}
			if g := st.Gates[k]; !g.HeldElsewhere && admission.CleanShards(gateLimit[k], g.Counters, len(g.Counters)) {
				s.settled.mark(k)
			}
		}
	}
	for k := range limitMoved {
		delete(st.Locked, k) // its rows under K = 1 too, when the window read it two ways
	}
	plan = admission.Decide(cc.candidates, st)
	if seen != nil {
		// Keys with counters as their limit makes them that it left rows
		// of for want of room it could see: the next claims lock them,
		// and so may block those rows.
		for _, k := range plan.Unsettled {
			if st.Gates[k].Count > 0 && !limitMoved[k] {
				s.hot.mark(k)
				continue
			}
			// Its counters are missing (an idle key's are deleted) or
			// from another limit: the rows left say nothing of its room,
			// so this claim is made again, locking (and creating) them,
			// rather than leave admissible rows to a later claim.
			return admission.Plan{}, nil, errCountersUnsettled
		}
	}
	return plan, seen, nil
}

// refusedByFullGates returns the rows of several keys of window that a
// gate key of theirs will refuse, by free, the gates' free slots read
// without a lock: walked in claim order, a row of a gate takes one of its
// free slots, and a row of several keys that one of its gates has none left
// for is refused. Their K = 1 keys are not locked (see admit): a claim
// holds its locks to its commit, and a freeing transaction waits for the
// lock of each K = 1 key it frees and tries those of the rows it may hand a
// slot to, which are these rows, at the heads of the full gates' lines. A
// row is decided on its locked counters all the same: one of its gates
// full, it is blocked on that gate; none full after all, its unlocked key
// leaves it ready for the next claim (admission.Decide). A gate free does
// not name has as many free slots as rows ask. filled reports whether a
// gate free names has no slot left once the walk is done: the window's
// rows would take its last slots, or refused rows want more.
func refusedByFullGates(window []admission.Candidate, free map[string]int) (refused map[string]bool, filled bool) {
	if len(free) == 0 {
		return nil, false
	}
	left := maps.Clone(free)
	var gates []string // the row's gate keys whose free slots were read
	for _, c := range window {
		gates = gates[:0]
		if _, ok := left[c.Key]; ok && c.Gate != nil {
			gates = append(gates, c.Key)
		}
		for _, n := range c.Also {
			if _, ok := left[n.Key]; ok && n.Gate != nil {
				gates = append(gates, n.Key)
			}
		}
		switch {
		case slices.ContainsFunc(gates, func(k string) bool { return left[k] <= 0 }):
			if len(c.Also) > 0 {
				if refused == nil {
					refused = map[string]bool{}
				}
				refused[c.ID] = true
			}
		default:
			for _, k := range gates {
				left[k]--
			}
		}
	}
	for _, n := range left {
		if n <= 0 {
			return refused, true
		}
	}
	return refused, false
}

// anyKeyHot reports whether a key of r was recently found saturated (see
// recentKeys): its outcome may hand that key's slot on
// (store.Claimed.Contended), as the memory store's anyKeyBlocked says. A
// row of several keys may hold a saturated gate as another key: its
// outcome then asks for a hand-off of the gate's slot to the next rows of
// the gate's line, which a slot otherwise reaches by a credit, a promotion
// and a claim.
func (s *Store) anyKeyHot(r store.Instance) bool {
	return r.Key != "" && s.hot.has(r.Key) || slices.ContainsFunc(r.Also, func(k store.KeyRef) bool { return s.hot.has(k.Key) })
}

// limitDiffers reports whether a key's limit as read beside its counters
// (limit and shards; nil: none) differs from l, the one the claim's window
// read.
func limitDiffers(l gate.Limit, limit, shards *int32) bool {
	return limit == nil || int(*limit) != l.Limit || int(*shards) != l.Shards
}

// optimistic reports whether a claim reads the counters of its window's
// gate keys without locking them and takes their locks only in its last
// statement (sqlDebitChecked), so that it holds them for that statement and
// its commit rather than from its second round trip on: a transaction
// crediting those counters then waits for about a commit, not for a whole
// claim (make bench's scenario 4 measured 5–6 ms per flush).
//
// A claim is optimistic when every gate key of its window is settled (a
// claim that locked its counters recently found them as its limit makes
// them: an optimistic claim neither creates counters nor tells a full key
// from one mid re-shard), none is hot (one found full recently must be
// locked so that its rows can be blocked: see
// admission.GateState.HeldElsewhere; one whose optimistic debit lost a race
// is marked hot too, so that claims racing for its last slots lock it
// rather than fail in turn), and it locks no rate bucket. A window with
// rows of several keys is optimistic on the same terms, unless the unlocked
// read of their gates' free slots has its rows fill a gate (filled, see
// refusedByFullGates): an optimistic claim blocks no row on a gate, and a
// row a full gate refuses is to wait in that gate's line, as a row of one
// key that finds its gate full at its insert does; and a claim that takes
// a gate's last slots races the others for them, where a lost optimistic
// debit is a claim made twice. Waiting for counters at its end keeps the
// lock order of sql.go: the claim holds instance rows and K = 1 advisory
// locks, which come before counters, and no counter (the holds
// sqlClaimMulti writes before the debit are new rows that no freeing
// transaction waits for: two holds of one K = 1 key never race, as each
// writer holds the key's lock); buckets come after counters, so a claim
// holding one must not wait for a counter.
func (s *Store) optimistic(gateKeys []string, buckets, filled bool) bool {
	if buckets || filled {
		return false
	}
	for _, k := range gateKeys {
		if s.hot.has(k) || !s.settled.has(k) {
			return false
		}
	}
	return true
}

// shardCounts flattens per-(key, shard) counts into sorted arrays.
func shardCounts(m map[shardKey]int) (keys []string, shards, ns []int32) {
	sks := make([]shardKey, 0, len(m))
	for sk := range m {
		sks = append(sks, sk)
	}
	slices.SortFunc(sks, func(a, b shardKey) int {
		return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.shard, b.shard))
	})
	for _, sk := range sks {
		keys, shards, ns = append(keys, sk.key), append(shards, int32(sk.shard)), append(ns, int32(m[sk]))
	}
	return keys, shards, ns
}

// scanClaimed scans a claimed row into cs, which it clears first: a
// query's rows share one (it escapes to the heap, as the destinations of
// the row's scan), where one per row made a sixth of the engine's
// allocations in the peers' keyed run, 1.4 KB a row.
func scanClaimed(rows pgx.Rows, cs *claimScan) (store.Claimed, error) {
	*cs = claimScan{}
	r, err := cs.scan(rows, &cs.sigID, &cs.sigName, &cs.sigPayload, &cs.sigDedup, &cs.sigCreated)
	if err != nil {
		return store.Claimed{}, err
	}
	c := store.Claimed{Instance: r.Instance, TimedOut: r.timedOut}
	if cs.sigID.Valid {
		created, err := timeOf(cs.sigCreated, "sig_created")
		if err != nil {
			return store.Claimed{}, err
		}
		c.Signal = &store.Signal{ID: cs.sigID.Int64, InstanceID: r.ID, Name: cs.sigName.String,
			Payload: json.RawMessage(cs.sigPayload), DedupKey: cs.sigDedup.String, CreatedAt: created}
	}
	return c, nil
}
