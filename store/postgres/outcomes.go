package postgres

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// applied is one outcome the guarded update committed.
type applied struct {
	ord      int // 1-based index into the outcomes
	oldKey   string
	oldShard int
	status   string
	parentID string
	joinGen  int // the parent's spawn this row belongs to
	spawnGen int // this row's spawns, counting this outcome's
	queue    string
	waiters  bool   // the row held a K = 1 key with rows waiting on it (see migration 013)
	holds    string // a row of several keys: its other keys' holds (see sqlCompleteApply)
}

// join is a parent's spawn that children count against.
type join struct {
	parentID string
	gen      int
}

// Complete commits a batch of outcomes in one transaction (see
// store.Store). The first statement applies every outcome whose claim is
// current and returns what it held; a stale outcome matches nothing, so
// nothing of it (signal consumption, children, parent join, credit) is
// applied. A second batch of statements, one per kind of follow-up and not
// one per outcome, then frees slots, consumes signals, inserts children,
// counts terminal children against their parents, wakes rows that parked on
// a signal already in their inbox, and records history.
func (s *Store) Complete(ctx context.Context, worker string, outcomes []store.Outcome, now time.Time) ([]store.OutcomeResult, error) {
	res, _, err := s.complete(ctx, worker, outcomes, now, nil)
	return res, err
}

// CompleteHandOff is Complete, handing the slots the outcomes free to the
// next waiting rows of their keys as h allows (see store.HandOffer): the
// decision is admission.Free's, the reads and writes are handOff's.
func (s *Store) CompleteHandOff(ctx context.Context, worker string, outcomes []store.Outcome, now time.Time, h store.HandOff) ([]store.OutcomeResult, []store.Claimed, error) {
	if h.Lease <= 0 {
		h.Lease = DefaultLease
	}
	return s.complete(ctx, worker, outcomes, now, &h)
}

var _ store.HandOffer = (*Store)(nil)

// complete commits outcomes (see Complete), handing freed slots off when h
// has room for it.
func (s *Store) complete(ctx context.Context, worker string, outcomes []store.Outcome, now time.Time, h *store.HandOff) ([]store.OutcomeResult, []store.Claimed, error) {
	if err := s.check(); err != nil {
		return nil, nil, err
	}
	if len(outcomes) == 0 {
		return nil, nil, nil
	}
	if err := validateOutcomes(outcomes, h != nil); err != nil {
		return nil, nil, err
	}
	outcomes = keysInOrder(outcomes)
	results := make([]store.OutcomeResult, len(outcomes))
	for i, o := range outcomes {
		results[i] = store.OutcomeResult{ID: o.ID, Stale: true}
	}

	var done []applied
	tx, err := s.beginGeneric(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("complete: %w", err)
	}
	defer tx.end()
	b := &pgx.Batch{}
	handIDs := handOffIDs(outcomes, h)
	ch := chains(outcomes, h)
	succIDs, succFences := ch.pending(outcomes)
	if successorsBefore(outcomes, succIDs) {
		ids := make([]string, 0, len(outcomes)+len(succIDs))
		for _, o := range outcomes {
			ids = append(ids, o.ID)
		}
		b.Queue(s.q(sqlClaimsLock), uuidArg(append(ids, succIDs...)), worker)
	}
	b.Queue(s.q(sqlCompleteApply), s.completeArgs(worker, outcomes, now, ch)...).Query(func(rows pgx.Rows) error {
		var a applied
		_, err := pgx.ForEachRow(rows, []any{&a.ord, &a.oldKey, &a.oldShard, &a.status, &a.parentID, &a.joinGen, &a.spawnGen, &a.queue, &a.waiters, &a.holds}, func() error {
			done = append(done, a)
			return nil
		})
		return err
	})
	succQueue := map[string]string{} // reserved successor still held -> its queue
	if len(succIDs) > 0 {
		b.Queue(s.q(sqlSuccessorsLock), uuidArg(succIDs), succFences, worker).Query(func(rows pgx.Rows) error {
			var id, q string
			_, err := pgx.ForEachRow(rows, []any{&id, &q}, func() error { succQueue[id] = q; return nil })
			return err
		})
	}
	var reads *handOffReads
	if len(handIDs) > 0 {
		reads = s.queueHandOffReads(b, handIDs, outcomes, ch, h)
	}
	if err := tx.send(ctx, b, false); err != nil {
		return nil, nil, fmt.Errorf("complete: %w", refused(err))
	}
	if len(done) == 0 {
		return results, nil, nil // nothing changed: end rolls the empty transaction back
	}
	slices.SortFunc(done, func(a, b applied) int { return a.ord - b.ord })

	b = &pgx.Batch{}
	var (
		freed                []freedSlot
		sigIDs               []int64
		sigOwners, parked    []string
		children             []store.NewInstance
		spawned              = map[string]int{} // parent id -> children planned
		spawnGen             = map[string]int{} // parent id -> the spawn its children join
		terminalChildren     = map[join]int{}   // children that just ended
		histIDs, histSteps   []string
		histKeys, histWorker []string
		histOutcomes, histEr []string
		histAttempts         []int32
		histStart, histEnd   []*time.Time
	)
	leftQueues := map[string]bool{} // queues whose rows left executing
	var passHolds map[string]string // row -> the successor its holds pass to along a chain
	for _, a := range done {
		results[a.ord-1].Stale = false
		results[a.ord-1].Unwaited = true // unless its key may have rows waiting (below)
	}
	for _, a := range done {
		o := outcomes[a.ord-1]
		leftQueues[a.queue] = true
		if a.oldKey != "" && !ch.chained[o.ID] {
			if f, ok := ch.pass(outcomes, results, o, freedSlot{key: a.oldKey, shard: a.oldShard, waiters: a.waiters}, succQueue); ok {
				if f.successor != "" && a.holds != "" {
					// A successor holds the same keys (admission.Free):
					// the row's holds pass to it with its first key's slot.
					if passHolds == nil {
						passHolds = map[string]string{}
					}
					passHolds[o.ID] = f.successor
					hs, err := parseHolds(o.ID, a.holds)
					if err != nil {
						return nil, nil, fmt.Errorf("complete: %w", err)
					}
					for _, h := range hs {
						f.also = append(f.also, h.Key)
					}
				}
				freed = append(freed, f)
			}
		}
		if o.ConsumeSignal != 0 {
			sigIDs, sigOwners = append(sigIDs, o.ConsumeSignal), append(sigOwners, o.ID)
		}
		// The committed status, not the outcome's kind, says what follows:
		// a row canceled while its step ran neither parks nor spawns.
		switch a.status {
		case "awaiting":
			parked = append(parked, o.ID)
		case "awaiting_children":
			spawned[o.ID] = len(o.Children)
			spawnGen[o.ID] = a.spawnGen
			for _, c := range o.Children {
				c.ParentID = o.ID
				if c.Queue == "" {
					c.Queue = a.queue
				}
				children = append(children, c)
			}
		case "done", "failed", "canceled":
			if a.parentID != "" {
				terminalChildren[join{a.parentID, a.joinGen}]++
			}
		}
		if h := o.History; h != nil && s.history {
			histIDs, histSteps, histAttempts = append(histIDs, o.ID), append(histSteps, h.Step), append(histAttempts, int32(h.Attempt))
			histKeys, histWorker = append(histKeys, historyKeys(h)), append(histWorker, cmpOr(h.Worker, worker))
			histStart, histEnd = append(histStart, tsPtr(h.StartedAt)), append(histEnd, tsPtr(h.FinishedAt))
			histOutcomes, histEr = append(histOutcomes, h.Outcome), append(histEr, h.Error)
		}
	}

	// The holds of the rows of several keys whose claims the batch ended:
	// deleted first, and freed with the rows' own slots, unless they pass
	// to a successor.
	holds, held, err := endedHolds(outcomes, done, passHolds)
	if err != nil {
		return nil, nil, fmt.Errorf("complete: %w", err)
	}
	if len(held) > 0 {
		b.Queue(s.q(sqlHoldsDelete), uuidArg(held))
		freed = append(freed, holds...)
	}
	var claimed []store.Claimed
	if h != nil {
		if err := s.tryOthers(ctx, tx, reads, freed); err != nil {
			return nil, nil, fmt.Errorf("complete: %w", refused(err))
		}
		var yield []string
		freed, yield = s.handOff(b, reads, worker, freed, h, now, &claimed)
		if len(passHolds) > 0 { // after sqlSucceed, which gives the successors their fences
			preds := slices.Sorted(maps.Keys(passHolds))
			succs := make([]string, len(preds))
			for i, p := range preds {
				succs[i] = passHolds[p]
			}
			b.Queue(s.q(sqlHoldsPass), uuidArg(preds), uuidArg(succs))
		}
		for _, succ := range yield {
			for i, o := range outcomes { // the outcome that names it ends the chain
				if o.Successor.ID == succ && !results[i].Stale {
					results[i].Yield = true
				}
			}
		}
	}
	// The keys of the slots not passed on may have rows waiting (see
	// OutcomeResult.Unwaited). Only a batch of terminal outcomes (the one
	// kind an engine asks about) reads whether any of them has, after this
	// transaction's promotions, and a batch with one such key reports them
	// all waited: the engine claims then anyway, and the read stops at the
	// first key it finds (in the peers' keyed run, reading every key of a
	// flush took 0.5 ms a flush, most of it for keys that had rows). A
	// K = 1 key that skipUnwaited leaves alone (its holder was not marked)
	// may still have a row left ready: a claim that could not mark the
	// holder, whose outcome had it locked, leaves its row ready. A worker
	// that claims again anyway (store.HandOff.Claiming) is not told: in
	// the peers' keyed run the read took 0.3 ms in each of 47 flushes, 14
	// of the 766 ms the run's statements took; told, 6 flushes of 48 read.
	keys := slotKeys(freed)
	keysWaited := len(keys) > 0 // unless read below
	stranded := s.queueFree(b, skipUnwaited(freed), true, now)
	if len(keys) > 0 && (h == nil || !h.Claiming) && !slices.ContainsFunc(outcomes, func(o store.Outcome) bool { return !o.Kind.Terminal() }) {
		keysWaited = false
		b.Queue(s.q(sqlKeysWaiting), keys).Query(func(rows pgx.Rows) error {
			keysWaited = rows.Next()
			rows.Close()
			return rows.Err()
		})
	}
	b.Queue(s.q(sqlNotifyPolicyQueues), mapKeys(leftQueues), s.channel)
	handing := len(handIDs) > 0 || len(succIDs) > 0
	warming := handing && tx.conn.Conn().PgConn().CustomData()[s.freeWarmKey] == nil // once per connection
	if warming {
		s.queueFreeing(b)
	}
	if !handing && (len(sigIDs) > 0 || len(spawned) > 0 || len(terminalChildren) > 0 || len(parked) > 0 || len(histIDs) > 0) {
		// The follow-ups are planned as PostgreSQL chooses, as before
		// sqlNoSeqScanGeneric: a generic plan made at a statement's first
		// execution, on a table whose statistics then say little, can be
		// a poor one for the rest of the connection's life (make bench's
		// scenario 7: sqlRecheckInbox took 44 ms a call, against 1.6).
		// A hand-off transaction keeps its generic plans, as it always had.
		b.Queue(sqlAutoPlans)
	}
	if len(sigIDs) > 0 {
		b.Queue(s.q(sqlConsumeSignals), sigIDs, sigOwners, tsArg(now))
	}
	var spawn *insertPlan
	if len(spawned) > 0 {
		var inserted map[string]int
		spawn, inserted, err = s.queueChildren(ctx, tx.q(), b, children, spawnGen, !handing)
		if err != nil {
			return nil, nil, fmt.Errorf("complete: %w", refused(err))
		}
		var ids []string
		var ns []int32
		for id, planned := range spawned {
			if n := inserted[id]; n != planned || planned == 0 {
				ids, ns = append(ids, id), append(ns, int32(n))
			}
		}
		if len(ids) > 0 {
			b.Queue(s.q(sqlSetPending), ids, ns, tsArg(now), "").Query(scanWoken(&stranded.queues))
		}
	}
	if len(terminalChildren) > 0 {
		s.queueJoins(b, terminalChildren, now, &stranded.queues)
	}
	if len(parked) > 0 {
		b.Queue(s.q(sqlRecheckInbox), parked, tsArg(now)).Query(scanWoken(&stranded.queues))
	}
	if len(histIDs) > 0 {
		b.Queue(s.q(sqlHistoryInsert), histIDs, histSteps, histAttempts, histKeys, histWorker,
			histStart, histEnd, histOutcomes, histEr, tsArg(now))
	}
	if err := tx.send(ctx, b, true); err != nil {
		return nil, nil, fmt.Errorf("complete: %w", insertErrorIfDuplicate(err))
	}
	if warming {
		tx.conn.Conn().PgConn().CustomData()[s.freeWarmKey] = true
	}
	// A slot passed on leaves no row waiting for it; so do the other
	// slots when the read found no key of them with a ready or blocked
	// row, unless the outcome's own row is ready again.
	for _, a := range done {
		_, freedHere := slices.BinarySearch(keys, a.oldKey) // keys: sorted, no ""
		if keysWaited && (freedHere || len(holds) > 0) || a.status == "ready" {
			results[a.ord-1].Unwaited = false
		}
	}
	s.heal(ctx, stranded, now)
	s.afterInsert(ctx, spawn)
	return results, claimed, nil
}

// keysInOrder returns outcomes with the keys each sets in
// store.NormalizeKeys' order (validateOutcomes has checked them), copied
// when an outcome sets several keys.
func keysInOrder(outcomes []store.Outcome) []store.Outcome {
	if !slices.ContainsFunc(outcomes, func(o store.Outcome) bool { return o.SetKey && len(o.Also) > 0 }) {
		return outcomes
	}
	out := slices.Clone(outcomes)
	for i := range out {
		if out[i].SetKey && len(out[i].Also) > 0 {
			out[i].Also = slices.Clone(out[i].Also)
			_ = store.NormalizeOutcomeKeys(&out[i])
		}
	}
	return out
}

// slotKeys is the distinct keys of slots, sorted.
func slotKeys(slots []freedSlot) []string {
	var keys []string
	for _, f := range slots {
		if f.key != "" {
			keys = append(keys, f.key)
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

func hasRoom(room map[string]int) bool {
	for _, n := range room {
		if n > 0 {
			return true
		}
	}
	return false
}

// queueJoins queues the counting of ended children against their parents'
// joins, parents locked in id order. The queues of the parents it wakes
// are appended to *woken, for the caller to notify once it has committed
// (wakeAfterCommit); with woken nil, the statement notifies them itself
// (see sqlJoinParents).
func (s *Store) queueJoins(b *pgx.Batch, ended map[join]int, now time.Time, woken *[]string) {
	joins := make([]join, 0, len(ended))
	for j := range ended {
		joins = append(joins, j)
	}
	slices.SortFunc(joins, func(a, b join) int { return cmp.Or(cmp.Compare(a.parentID, b.parentID), a.gen-b.gen) })
	ids := make([]string, len(joins))
	ns := make([]int32, len(joins))
	gens := make([]int32, len(joins))
	for i, j := range joins {
		ids[i], ns[i], gens[i] = j.parentID, int32(ended[j]), int32(j.gen)
	}
	b.Queue(s.q(sqlLockParents), ids)
	if woken == nil {
		b.Queue(s.q(sqlJoinParents), ids, ns, tsArg(now), s.channel, gens)
		return
	}
	b.Queue(s.q(sqlJoinParents), ids, ns, tsArg(now), "", gens).Query(scanWoken(woken))
}

// queueTakenBack queues on b what follows claims taken back to ready (a
// release, a reap): the freeing of their slots (queueFree; credit: whether
// their gate shards are credited) and the counting of the ended children
// against their parents' joins. The queues of the rows made ready (queues)
// and of the parents woken go to the returned keys' queues, which heal
// notifies once the caller has committed.
func (s *Store) queueTakenBack(b *pgx.Batch, freed []freedSlot, credit bool, queues map[string]bool, ended map[join]int, now time.Time) *strandedKeys {
	stranded := s.queueFree(b, freed, credit, now)
	stranded.queues = append(stranded.queues, mapKeys(queues)...)
	if len(ended) > 0 {
		s.queueJoins(b, ended, now, &stranded.queues)
	}
	return stranded
}

// scanWoken appends to *queues the queues of the rows a statement woke
// (its rows: queue, count), to be notified after the commit.
func scanWoken(queues *[]string) func(pgx.Rows) error {
	return func(rows pgx.Rows) error {
		var q string
		var n int64
		_, err := pgx.ForEachRow(rows, []any{&q, &n}, func() error { *queues = append(*queues, q); return nil })
		return err
	}
}

// queueChildren inserts spawned children: queued on b when none has a
// unique key, else at once (the unique check needs its own round trip). It
// returns the insert's plan, whose blocked keys (filled once b ran) the
// caller heals after its commit (healInserted), and, per parent, how many
// children were inserted. Like Insert, it inserts the due children of a
// busy K = 1 key, or of one at its cap of ready rows, blocked. With auto,
// the unique check runs on plans PostgreSQL chooses (sqlAutoPlans).
func (s *Store) queueChildren(ctx context.Context, tx querier, b *pgx.Batch, children []store.NewInstance, gens map[string]int, auto bool) (*insertPlan, map[string]int, error) {
	inserted := map[string]int{}
	if len(children) == 0 {
		return nil, inserted, nil
	}
	p, err := prepareInsert(children)
	if err != nil {
		return nil, nil, fmt.Errorf("spawn: %w", err)
	}
	p.block, p.wakeAfter = true, true
	for i := range p.rows {
		p.rows[i].joinGen = gens[p.rows[i].in.ParentID]
	}
	if p.unique {
		if auto {
			// insertUnique runs its statements now, before the batch that
			// leaves generic plans (see complete): leave them first.
			if _, err := tx.Exec(ctx, sqlAutoPlans); err != nil {
				return nil, nil, fmt.Errorf("spawn: %w", err)
			}
		}
		if err := s.insertUnique(ctx, tx, p); err != nil {
			return nil, nil, fmt.Errorf("spawn: %w", err)
		}
	} else {
		s.queueInsert(b, p)
	}
	for _, r := range p.rows {
		inserted[r.in.ParentID]++
	}
	return p, inserted, nil
}

func insertErrorIfDuplicate(err error) error {
	if code, constraint := pgCode(err); code == codeUniqueViolation {
		return fmt.Errorf("%w (%s)", store.ErrDuplicate, constraint)
	}
	return err
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// validateOutcomes checks what PostgreSQL would refuse, or worse accept
// wrongly: a successor (store.Outcome.Successor) passes only with a
// hand-off (handOff), since Complete would free its slot under it.
func validateOutcomes(outcomes []store.Outcome, handOff bool) error {
	for i, o := range outcomes {
		if _, err := uuid.Parse(o.ID); err != nil {
			return fmt.Errorf("complete: %w: outcome %d: id %q is not a UUID", store.ErrInvalid, i, o.ID)
		}
		if nx := o.Successor.ID; nx != "" {
			if !handOff {
				return fmt.Errorf("complete: %w: outcome %d names a successor: only CompleteHandOff passes a slot on", store.ErrInvalid, i)
			}
			if _, err := uuid.Parse(nx); err != nil {
				return fmt.Errorf("complete: %w: outcome %d: successor id %q is not a UUID", store.ErrInvalid, i, nx)
			}
		}
		switch o.Kind {
		case store.OutcomeReady, store.OutcomeDone, store.OutcomeFailed, store.OutcomeSpawn:
		case store.OutcomeAwait:
			if o.AwaitSignal == "" {
				return fmt.Errorf("complete: %w: outcome %d: await without a signal name", store.ErrInvalid, i)
			}
		default:
			return fmt.Errorf("complete: %w: outcome %d: unknown kind %d", store.ErrInvalid, i, o.Kind)
		}
		if len(o.State) > 0 && !json.Valid(o.State) {
			return fmt.Errorf("complete: %w: outcome %d: state is not valid JSON", store.ErrInvalid, i)
		}
		if len(o.Result) > 0 && !json.Valid(o.Result) {
			return fmt.Errorf("complete: %w: outcome %d: result is not valid JSON", store.ErrInvalid, i)
		}
		if err := store.NormalizeOutcomeKeys(&o); err != nil {
			return fmt.Errorf("complete: %w: outcome %d: %w", store.ErrInvalid, i, err)
		}
	}
	return nil
}

// completeArgs are sqlCompleteApply's arguments; chained holds the
// outcomes of reserved rows whose predecessors' outcomes are in the batch
// (see chains).
func (s *Store) completeArgs(worker string, outcomes []store.Outcome, now time.Time, ch outcomeChains) []any {
	n := len(outcomes)
	// The arrays of one type share one allocation.
	texts, int32s, int64s := make(textArray, 9*n), make([]int32, 2*n), make([]int64, 2*n)
	times, bools := make([]*time.Time, 2*n), make([]bool, 3*n)
	var (
		ids           = make([]string, n)
		fences        = make(int8Array, n)
		kinds         = texts[0*n : 1*n : 1*n]
		steps         = texts[1*n : 2*n : 2*n]
		states        = texts[2*n : 3*n : 3*n]
		attempts      = int32s[0*n : 1*n : 1*n]
		runAts        = times[0*n : 1*n : 1*n]
		setKeys       = bools[0*n : 1*n : 1*n]
		keys          = texts[3*n : 4*n : 4*n]
		intents       = texts[4*n : 5*n : 5*n]
		awaits        = texts[5*n : 6*n : 6*n]
		timeouts      = times[1*n : 2*n : 2*n]
		results       = texts[6*n : 7*n : 7*n]
		errs          = texts[7*n : 8*n : 8*n]
		extras        = texts[8*n : 9*n : 9*n]
		children      = int32s[1*n : 2*n : 2*n]
		delays        = int64s[0*n : 1*n : 1*n]
		timeoutDelays = int64s[1*n : 2*n : 2*n]
		handBacks     = bools[1*n : 2*n : 2*n]
		chainedRows   = bools[2*n : 3*n : 3*n]
		heads         = make([]*string, n)
		headFences    = make([]*int64, n)
	)
	prev := make(map[string]int, len(ch.next)) // outcome id -> the index of the outcome that names it
	for i, o := range outcomes {
		if o.Successor.ID != "" {
			prev[o.Successor.ID] = i
		}
	}
	for i, o := range outcomes {
		delays[i], timeoutDelays[i] = micros(o.Delay), micros(o.Timeout)
		ids[i], fences[i], kinds[i], steps[i] = o.ID, int8Elem(o.Fence), textElem(o.Kind.String()), textElem(o.Step)
		states[i], attempts[i], runAts[i] = jsonElem(o.State), int32(o.Attempt), tsPtr(o.RunAt)
		setKeys[i], keys[i], intents[i] = o.SetKey, textElem(o.Key), textElem(string(o.KeyIntent))
		if o.SetKey && o.Key == "" {
			intents[i] = textElem("")
		}
		if o.SetKey {
			extras[i] = textElem(keysText(o.Also))
		}
		awaits[i], timeouts[i], results[i] = textElem(o.AwaitSignal), tsPtr(o.TimeoutAt), jsonElem(o.Result)
		errs[i], children[i], handBacks[i] = textElem(o.Error), int32(len(o.Children)), o.HandBack
		chainedRows[i] = ch.chained[o.ID]
		if chainedRows[i] { // the head of its chain in the batch
			h := prev[o.ID]
			for range n {
				j, ok := prev[outcomes[h].ID]
				if !ok || !ch.chained[outcomes[h].ID] {
					break
				}
				h = j
			}
			heads[i], headFences[i] = &outcomes[h].ID, &outcomes[h].Fence
		}
	}
	return []any{worker, tsArg(now), uuidArg(ids), fences, kinds, steps, states, attempts, runAts, setKeys, keys,
		intents, awaits, timeouts, results, errs, children, delays, timeoutDelays, handBacks, chainedRows, heads, headFences, extras}
}

// Heartbeat extends the leases of worker's current claims and returns the
// ids of the claims it no longer holds (see store.Store).
func (s *Store) Heartbeat(ctx context.Context, worker string, claims []store.ClaimRef, lease time.Duration, now time.Time) (store.HeartbeatResult, error) {
	var res store.HeartbeatResult
	if err := s.check(); err != nil {
		return res, err
	}
	if len(claims) == 0 {
		return res, nil
	}
	if lease <= 0 {
		lease = DefaultLease
	}
	ids, fences, err := claimArrays(claims)
	if err != nil {
		return res, fmt.Errorf("heartbeat: %w", err)
	}
	rows, err := s.pool.Query(ctx, s.q(sqlHeartbeat), worker, ids, fences, tsArg(now), micros(lease))
	if err != nil {
		return res, fmt.Errorf("heartbeat: %w", err)
	}
	if res, err = heldClaims(rows, claims); err != nil {
		return res, fmt.Errorf("heartbeat: %w", err)
	}
	return res, nil
}

// CheckClaims reports the claims worker no longer holds and those whose
// cancel was requested, as Heartbeat does, without extending a lease or
// locking a row (see store.ClaimChecker).
func (s *Store) CheckClaims(ctx context.Context, worker string, claims []store.ClaimRef) (store.HeartbeatResult, error) {
	if err := s.check(); err != nil {
		return store.HeartbeatResult{}, err
	}
	if len(claims) == 0 {
		return store.HeartbeatResult{}, nil
	}
	ids, fences, err := claimArrays(claims)
	if err != nil {
		return store.HeartbeatResult{}, fmt.Errorf("check claims: %w", err)
	}
	rows, err := s.pool.Query(ctx, s.q(sqlCheckClaims), worker, ids, fences)
	if err != nil {
		return store.HeartbeatResult{}, fmt.Errorf("check claims: %w", err)
	}
	res, err := heldClaims(rows, claims)
	if err != nil {
		return res, fmt.Errorf("check claims: %w", err)
	}
	return res, nil
}

// heldClaims reads the rows (id, cancel requested) of the claims that are
// still held, and reports the others of claims as lost and the held ones
// whose cancel was requested as canceled.
func heldClaims(rows pgx.Rows, claims []store.ClaimRef) (store.HeartbeatResult, error) {
	var res store.HeartbeatResult
	held := map[string]bool{} // id -> cancel requested
	var id string
	var canceled bool
	if _, err := pgx.ForEachRow(rows, []any{&id, &canceled}, func() error {
		held[id] = canceled
		return nil
	}); err != nil {
		return res, err
	}
	for _, c := range claims {
		switch canceled, ok := held[c.ID]; {
		case !ok:
			res.Lost = append(res.Lost, c)
		case canceled:
			res.Canceled = append(res.Canceled, c)
		}
	}
	return res, nil
}

// scanTakenBack reads the rows of a statement that took claims back
// (release, reap): each row's freed slot and queue go to took, and a child
// that ended canceled (its cancel was requested) is counted in ended for
// its parent's join.
func scanTakenBack(rows pgx.Rows, took func(freedSlot, string), ended map[join]int) error {
	var f freedSlot
	var q, status, parentID string
	var joinGen int
	_, err := pgx.ForEachRow(rows, []any{&f.key, &f.shard, &q, &status, &parentID, &joinGen}, func() error {
		took(f, q)
		if status == "canceled" && parentID != "" {
			ended[join{parentID, joinGen}]++
		}
		return nil
	})
	return err
}

func claimArrays(claims []store.ClaimRef) ([]string, []int64, error) {
	ids := make([]string, len(claims))
	fences := make([]int64, len(claims))
	for i, c := range claims {
		if _, err := uuid.Parse(c.ID); err != nil {
			return nil, nil, fmt.Errorf("claim id %q is not a UUID", c.ID)
		}
		ids[i], fences[i] = c.ID, c.Fence
	}
	return ids, fences, nil
}

// Release returns worker's unstarted claims to ready with their attempt and
// place in line unchanged, crediting their slots and promoting blocked rows
// of their keys (see store.Store). Stale claims are ignored.
func (s *Store) Release(ctx context.Context, worker string, claims []store.ClaimRef, now time.Time) error {
	if err := s.check(); err != nil {
		return err
	}
	if len(claims) == 0 {
		return nil
	}
	ids, fences, err := claimArrays(claims)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	var freed []freedSlot
	queues := map[string]bool{}
	// On generic plans (see sqlNoSeqScanGeneric): an engine releases a
	// chain's given-back reservations one transaction each, a few times
	// per connection, so under auto PostgreSQL would plan sqlRelease and
	// sqlHoldsEnd anew at each release, at a few milliseconds a plan.
	tx, err := s.beginGeneric(ctx)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	defer tx.end()
	b := &pgx.Batch{}
	ended := map[join]int{}
	b.Queue(s.q(sqlRelease), worker, ids, fences, tsArg(now)).Query(func(rows pgx.Rows) error {
		return scanTakenBack(rows, func(f freedSlot, q string) {
			freed = append(freed, f)
			queues[q] = true
		}, ended)
	})
	b.Queue(s.q(sqlHoldsEnd), uuidArg(ids)).Query(func(rows pgx.Rows) error { return freedHolds(rows, &freed) })
	if err := tx.send(ctx, b, false); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	if len(queues) == 0 {
		return nil
	}
	b = &pgx.Batch{}
	stranded := s.queueTakenBack(b, freed, true, queues, ended, now)
	if err := tx.send(ctx, b, true); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	s.heal(ctx, stranded, now)
	return nil
}

// Cancel cancels a non-terminal instance (see store.Store): an executing
// row is marked cancel-requested and keeps its claim and slot (its worker is
// told on the cancel channel, and its claim's end makes it canceled); a
// ready keyed row passes its turn to the key's first blocked row; a child
// counts as ended for its parent's join.
func (s *Store) Cancel(ctx context.Context, id string, now time.Time) error {
	if err := s.check(); err != nil {
		return err
	}
	if _, err := uuid.Parse(id); err != nil {
		return fmt.Errorf("cancel %s: %w", id, store.ErrNotFound)
	}
	return s.inTx(ctx, func(tx pgx.Tx) error { return s.cancelIn(ctx, tx, id, now) })
}

// cancelIn cancels instance id (see Cancel) in transaction q.
func (s *Store) cancelIn(ctx context.Context, q querier, id string, now time.Time) error {
	var oldStatus, oldKey, parentID string
	var oldShard, joinGen int
	var requested bool
	err := q.QueryRow(ctx, s.q(sqlCancelLock), id).Scan(&oldStatus, &oldKey, &oldShard, &parentID, &joinGen, &requested)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("cancel %s: %w", id, store.ErrNotFound)
	case err != nil:
		return fmt.Errorf("cancel %s: %w", id, err)
	case oldStatus == "done" || oldStatus == "failed" || oldStatus == "canceled":
		return fmt.Errorf("cancel %s: %w (%s)", id, store.ErrTerminal, oldStatus)
	case requested:
		return nil // its claim's end cancels it already
	}
	if _, err := q.Exec(ctx, s.q(sqlCancel), id, tsArg(now)); err != nil {
		return fmt.Errorf("cancel %s: %w", id, err)
	}
	b := &pgx.Batch{}
	switch {
	case oldStatus == "executing" || oldStatus == "reserved":
		// The step may still run (a reserved row's in its
		// predecessor's slot): it keeps its slot until its claim
		// ends.
		b.Queue(s.q(sqlNotifyCancel), s.cancelChannel, id)
	case oldKey == "":
	case oldStatus == "ready" || oldStatus == statusScheduled:
		// The row may be the one a freed slot promoted: pass the
		// promotion on so that the key's blocked rows do not wait
		// for the reconciler.
		b.Queue(s.q(sqlKeyLock), []string{oldKey}, s.keySalt)
		b.Queue(s.q(sqlPromoteIfRoom), []string{oldKey}, 1, tsArg(now), s.channel, false)
	}
	if parentID != "" && oldStatus != "executing" && oldStatus != "reserved" {
		s.queueJoins(b, map[join]int{{parentID, joinGen}: 1}, now, nil)
	}
	if b.Len() > 0 {
		if err := q.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("cancel %s: %w", id, err)
		}
	}
	return nil
}

// successorsBefore reports whether a successor of succs sorts before an
// outcome row of the batch: the apply statement then locks an outcome row
// after a successor that a heartbeat, locking both in one id order, may
// hold while it waits for that outcome row. Only then is the batch's whole
// set locked in one id order first (sqlClaimsLock); otherwise locking the
// outcome rows, then the successors, each in id order, is already that
// order. With time-ordered ids a successor is usually the newer row.
func successorsBefore(outcomes []store.Outcome, succs []string) bool {
	if len(succs) == 0 {
		return false
	}
	var last uuid.UUID
	for _, o := range outcomes {
		if u, err := uuid.Parse(o.ID); err == nil && bytes.Compare(u[:], last[:]) > 0 {
			last = u
		}
	}
	for _, id := range succs {
		if u, err := uuid.Parse(id); err != nil || bytes.Compare(u[:], last[:]) < 0 {
			return true
		}
	}
	return false
}

// ErrNotRetryable is store.ErrNotRetryable, kept under this name.
var ErrNotRetryable = store.ErrNotRetryable

// Retry makes a failed or canceled instance ready again at its current step
// with attempt 0 (see store.Store). It is store.ErrDuplicate when the
// instance's unique key is now held by another instance.
func (s *Store) Retry(ctx context.Context, id string, now time.Time) error {
	if err := s.check(); err != nil {
		return err
	}
	if _, err := uuid.Parse(id); err != nil {
		return fmt.Errorf("retry %s: %w", id, store.ErrNotFound)
	}
	rows, err := s.pool.Query(ctx, s.q(sqlRetry), id, tsArg(now), s.channel)
	if err != nil {
		return fmt.Errorf("retry %s: %w", id, insertErrorIfDuplicate(err))
	}
	n, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (int64, error) {
		var q string
		var n int64
		return n, row.Scan(&q, &n)
	})
	if err != nil {
		return fmt.Errorf("retry %s: %w", id, insertErrorIfDuplicate(err))
	}
	if len(n) == 0 {
		var status string
		err := s.pool.QueryRow(ctx, s.q(sqlStatusOf), id).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("retry %s: %w", id, store.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("retry %s: %w", id, err)
		}
		return fmt.Errorf("retry %s: %w (status %s)", id, ErrNotRetryable, publicStatus(status))
	}
	return nil
}

func mapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// queueFreeing queues every statement that frees slots (queueFree's and
// sqlKeysWaiting) with nothing to free. A transaction that hands slots
// off queues them once per connection (Store.freeWarmKey marks it), so
// that the connection parses and plans them there. A key whose slots all
// pass on (a saturated gate) frees them the usual way only when its burst
// ends, and that last flush paid for their first use: 5-8 ms of parse and
// plan in the peers' gate of 5 with 50 ms steps, at the very end of the
// run. With them planned early, the end (the last step to the driver's
// count) took 7.9-13.8 ms (median 9.3) against 14.6-40.9 (median 20.6),
// six interleaved pairs; the hot gate (10, 1 ms steps) 8.5-13.7 (median
// 11.8) against 11.3-24.0 (14.8), twelve pairs, its runs faster in 20 of
// 30 pairs (its first hand-off pays the few ms instead, with successors
// running). TestFreeingCoversQueueFree keeps the list whole.
func (s *Store) queueFreeing(b *pgx.Batch) {
	none, noShards := []string{}, []int32{}
	b.Queue(s.q(sqlKeyLock), none, s.keySalt)
	b.Queue(s.q(sqlSlotsLockExisting), none, noShards)
	b.Queue(s.q(sqlCredit), none, noShards, noShards)
	b.Queue(s.q(sqlSlotsDropEmpty), none, noShards)
	b.Queue(s.q(sqlPromote), none, noShards, nil, []bool{})
	b.Queue(s.q(sqlKeysWaiting), none)
}
