package postgres

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
)

// This file holds the admission rules: how a claim turns the ready rows at
// the head of a queue into executing rows without ever admitting more than
// K rows of a key. The whole claim is one READ COMMITTED transaction:
//
//  1. Due delayed rows and due await timeouts of the queue become ready.
//  2. The window: the first ready rows of the queue in admission order
//     (priority, run_at, insertion), locked FOR UPDATE SKIP LOCKED, so that
//     concurrent claimers take disjoint rows and never wait on each other.
//     Keyless rows (Limit of them) and keyed rows (the window) come from
//     separate indexes, merged in admission order: keyed rows waiting for
//     their keys never crowd keyless work out of the window.
//  3. Admission, walking the window in order:
//     - a row without a key is admitted;
//     - a K = 1 key is admitted only by the claimer holding its advisory
//     lock (pg_try_advisory_xact_lock, never waiting: a claimer that does
//     not get it leaves the row ready for the next claim) and only if no
//     row of the key is executing, checked by a statement that starts after
//     the lock is held; the first row of the key is admitted and the rest
//     of the key's rows become blocked;
//     - a gated key's counter rows are created if missing and locked in
//     (key, shard) order; a row is admitted when a shard has a free slot,
//     which it debits, and the key's slots in use over all its counters are
//     below its limit; it is blocked otherwise.
//     Every path that takes a keyed row out of executing takes the same
//     lock (the advisory lock, waiting; or the counter row) before it
//     promotes the key's first blocked row, so a row can never be blocked
//     by a claim while its key frees unseen (a lost promotion).
//     A saturated key's ready rows beyond the window are blocked too, in
//     bounded chunks, so that its backlog leaves the pick path.
//  4. The admitted rows become executing with a new fence and the lease.
//  5. NextDue when fewer than Limit rows were claimed.
//
// The unique index on executing K = 1 keys and the CHECK on counters stay
// as the guarantee that over-admission cannot commit even if these rules
// had a flaw.

// DefaultLease is the lease of a claim whose request has none.
const DefaultLease = 30 * time.Second

const (
	// minWindow is the smallest keyed window a claim looks at; the window is
	// max(2 × Limit, minWindow) rows, at most max(Limit, maxWindow). A claim
	// holds one advisory lock per distinct K = 1 key of its window (and an
	// outcome batch one per K = 1 key it frees): PostgreSQL's lock table
	// (max_locks_per_transaction × max_connections) bounds how many such
	// transactions can run at once.
	minWindow = 32
	maxWindow = 1000
	// promoteChunk bounds how many delayed rows and await timeouts of the
	// queue one claim makes ready.
	promoteChunk = 1000
	// backlogChunk bounds how many ready rows of one saturated key one claim
	// moves to blocked beyond the window.
	backlogChunk = 1000
)

type candidate struct {
	id     string
	key    string
	limit  *int32 // nil: K = 1
	shards *int32
}

type admitted struct {
	id    string
	shard int // -1: no counter debited
}

type slotRow struct {
	shard, capacity, available int
}

type shardKey struct {
	key   string
	shard int
}

// Claim admits and claims up to req.Limit rows of req.Queue (see the rules above).
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := s.check(); err != nil {
		return store.ClaimResult{}, err
	}
	if req.Limit <= 0 {
		return store.ClaimResult{}, nil
	}
	if req.Worker == "" {
		return store.ClaimResult{}, errors.New("claim: empty worker")
	}
	if req.Queue == "" {
		req.Queue = DefaultQueue
	}
	lease := req.Lease
	if lease <= 0 {
		lease = DefaultLease
	}
	window := min(max(2*req.Limit, minWindow), max(req.Limit, maxWindow))
	now := tsArg(req.Now)
	workflows := req.Workflows
	if workflows == nil {
		workflows = []string{}
	}

	var (
		cands   []candidate
		nextDue *time.Time
	)
	tx, err := s.beginBatch(ctx)
	if err != nil {
		return store.ClaimResult{}, fmt.Errorf("claim %s: %w", req.Queue, err)
	}
	defer tx.end()
	b := &pgx.Batch{}
	b.Queue(s.q(sqlPromoteScheduled), req.Queue, now, promoteChunk)
	b.Queue(s.q(sqlFireQueueTimers), req.Queue, now, promoteChunk)
	b.Queue(s.q(sqlClaimCandidates), req.Queue, now, workflows, window, req.Limit).Query(func(rows pgx.Rows) error {
		var c candidate
		_, err := pgx.ForEachRow(rows, []any{&c.id, &c.key, &c.limit, &c.shards}, func() error {
			cands = append(cands, c)
			return nil
		})
		return err
	})
	b.Queue(s.q(sqlNextDue), req.Queue).QueryRow(func(row pgx.Row) error { return row.Scan(&nextDue) })
	if err := tx.send(ctx, b, false); err != nil {
		return store.ClaimResult{}, fmt.Errorf("claim %s: %w", req.Queue, err)
	}

	plan, err := s.admit(ctx, tx.q(), cands, req.Limit)
	if err != nil {
		return store.ClaimResult{}, fmt.Errorf("claim %s: %w", req.Queue, err)
	}

	var res store.ClaimResult
	b = &pgx.Batch{}
	if len(plan.debits) > 0 {
		keys, shards, ns := shardCounts(plan.debits)
		b.Queue(s.q(sqlDebit), keys, shards, ns)
	}
	if len(plan.admitted) > 0 {
		ids := make([]string, len(plan.admitted))
		shards := make([]int32, len(plan.admitted))
		for i, a := range plan.admitted {
			ids[i], shards[i] = a.id, int32(a.shard)
		}
		b.Queue(s.q(sqlClaim), ids, req.Worker, micros(lease), shards, now).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				c, err := scanClaimed(rows)
				if err != nil {
					return err
				}
				res.Claimed = append(res.Claimed, c)
			}
			return rows.Err()
		})
	}
	// Blocking runs after the claim: the backlog statement must not see the admitted rows as ready.
	if len(plan.blocked) > 0 {
		b.Queue(s.q(sqlBlock), plan.blocked, now)
	}
	if len(plan.saturated) > 0 {
		b.Queue(s.q(sqlBlockBacklog), plan.saturated, backlogChunk, now)
	}
	if err := tx.send(ctx, b, true); err != nil {
		return store.ClaimResult{}, fmt.Errorf("claim %s: %w", req.Queue, err)
	}
	if len(res.Claimed) < req.Limit && nextDue != nil {
		res.NextDue = *nextDue
	}
	return res, nil
}

// admissionPlan is what admit decided for the window.
type admissionPlan struct {
	admitted  []admitted
	blocked   []string // ids of window rows whose key is saturated
	saturated []string // saturated keys, sorted: their backlog is blocked too
	debits    map[shardKey]int
}

// admit applies the admission rules to the window (in admission order),
// taking the K = 1 advisory locks and the gate counter locks it needs.
func (s *Store) admit(ctx context.Context, tx querier, cands []candidate, limit int) (admissionPlan, error) {
	var (
		plan      admissionPlan
		oneKeys   []string                  // K = 1 keys of the window
		gateKeys  []string                  // gated keys of the window
		gateLimit = map[string]gate.Limit{} // gated key -> its limit
	)
	for _, c := range cands {
		switch {
		case c.key == "":
		case c.limit == nil:
			oneKeys = append(oneKeys, c.key)
		default:
			if _, ok := gateLimit[c.key]; !ok {
				gateLimit[c.key] = gate.Limit{Name: gate.NameOf(c.key), Limit: int(*c.limit), Shards: int(*c.shards)}
				gateKeys = append(gateKeys, c.key)
			}
		}
	}
	slices.Sort(oneKeys)
	oneKeys = slices.Compact(oneKeys)
	slices.Sort(gateKeys)

	locked := map[string]bool{} // K = 1 keys whose advisory lock this claim holds
	busy := map[string]bool{}   // K = 1 keys with an executing row
	slots := map[string][]slotRow{}
	if len(oneKeys)+len(gateKeys) > 0 {
		b := &pgx.Batch{}
		if len(oneKeys) > 0 {
			b.Queue(s.q(sqlKeyTryLock), oneKeys, s.keySalt).Query(func(rows pgx.Rows) error {
				i := 0
				var got bool
				_, err := pgx.ForEachRow(rows, []any{&got}, func() error {
					if got {
						locked[oneKeys[i]] = true
					}
					i++
					return nil
				})
				return err
			})
			b.Queue(s.q(sqlKeyBusy), oneKeys).Query(func(rows pgx.Rows) error {
				var k string
				_, err := pgx.ForEachRow(rows, []any{&k}, func() error { busy[k] = true; return nil })
				return err
			})
		}
		if len(gateKeys) > 0 {
			var keys []string
			var shards, caps []int32
			for _, k := range gateKeys {
				for i, c := range gateLimit[k].ShardCapacities() {
					keys, shards, caps = append(keys, k), append(shards, int32(i)), append(caps, int32(c))
				}
			}
			b.Queue(s.q(sqlSlotsLock), keys, shards, caps)
			b.Queue(s.q(sqlSlotsRead), gateKeys).Query(func(rows pgx.Rows) error {
				var k string
				var r slotRow
				_, err := pgx.ForEachRow(rows, []any{&k, &r.shard, &r.capacity, &r.available}, func() error {
					slots[k] = append(slots[k], r)
					return nil
				})
				return err
			})
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return plan, fmt.Errorf("admission locks: %w", err)
		}
	}

	// A gate key's slots in use, over all its counters: a claim admits only
	// while this is below the limit, whatever the shard counters say (after
	// a limit is lowered or re-sharded, shards may hold more than the new
	// limit gives them until their rows finish).
	inUse := map[string]int{}
	for k, rows := range slots {
		for _, r := range rows {
			inUse[k] += r.capacity - r.available
		}
	}
	taken := map[string]bool{} // K = 1 keys admitted by this claim
	saturated := map[string]bool{}
	plan.debits = map[shardKey]int{}
	for _, c := range cands {
		full := len(plan.admitted) >= limit
		switch {
		case c.key == "":
			if !full {
				plan.admitted = append(plan.admitted, admitted{id: c.id, shard: -1})
			}
		case c.limit == nil:
			if !locked[c.key] {
				continue // another claim or an outcome holds the key: leave the row ready
			}
			if busy[c.key] || taken[c.key] {
				plan.blocked = append(plan.blocked, c.id)
				saturated[c.key] = true
				continue
			}
			if !full {
				plan.admitted = append(plan.admitted, admitted{id: c.id, shard: -1})
				taken[c.key] = true
			}
		default:
			lim := gateLimit[c.key]
			rows := slots[c.key]
			best := -1
			if inUse[c.key] < lim.Limit {
				for i, r := range rows {
					if r.shard < lim.Shards && r.available > 0 && (best < 0 || r.available > rows[best].available) {
						best = i
					}
				}
			}
			if best < 0 {
				plan.blocked = append(plan.blocked, c.id)
				saturated[c.key] = true
				continue
			}
			if !full {
				rows[best].available--
				inUse[c.key]++
				plan.debits[shardKey{c.key, rows[best].shard}]++
				plan.admitted = append(plan.admitted, admitted{id: c.id, shard: rows[best].shard})
			}
		}
	}
	for k := range saturated {
		plan.saturated = append(plan.saturated, k)
	}
	slices.Sort(plan.saturated)
	return plan, nil
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

func scanClaimed(rows pgx.Rows) (store.Claimed, error) {
	var (
		sigID      *int64
		sigName    *string
		sigPayload []byte
		sigDedup   *string
		sigCreated *time.Time
	)
	r, err := scanInstanceRow(rows, &sigID, &sigName, &sigPayload, &sigDedup, &sigCreated)
	if err != nil {
		return store.Claimed{}, err
	}
	c := store.Claimed{Instance: r.Instance, TimedOut: r.timedOut}
	if sigID != nil {
		c.Signal = &store.Signal{ID: *sigID, InstanceID: r.ID, Name: *sigName,
			Payload: json.RawMessage(slices.Clone(sigPayload)), DedupKey: *sigDedup, CreatedAt: *sigCreated}
	}
	return c, nil
}
