package postgres

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
)

// freedSlot is a slot a row gave up when it left executing: a K = 1 key
// (shard -1) or a gate key's shard.
type freedSlot struct {
	key   string
	shard int
	// successor is the reservation the freeing outcome named that takes
	// the slot (see sqlSucceed), and queue its queue; ahead is how many
	// successors the row that takes it wants reserved.
	successor, queue string
	ahead            int
	// waiters is false when the slot is a K = 1 key whose holder had no
	// rows waiting on it (see migration 013): an outcome then skips the
	// key's freeing (see skipUnwaited).
	waiters bool
	// also are, for a slot that passes to a successor, the keys of the
	// holds that pass with it (admission.Freed.Also).
	also []string
}

// queueFree queues, on b, what must follow rows leaving executing: the
// advisory locks of their K = 1 keys (waiting for any claim that holds one,
// so that the promotion below sees that claim's blocked rows), the credit of
// their gate shards when credit is set (counters locked in (key, shard)
// order; a shard larger than a lowered limit gives it shrinks instead of
// freeing, and one the limit no longer has is deleted once empty: see
// sqlCredit), and the promotion of each key's first blocked rows, one per freed
// slot. Reaped claims do not credit gates (under-credit is the safe
// direction; the reconciler repairs it) and so promote only K = 1 keys.
// The returned keys, filled when b runs, are the ones the promotion left
// stranded (see sqlStranded): the caller passes them to heal once it has
// committed, having added to their queues those of the other rows its
// transaction makes ready, which heal notifies after the commit.
func (s *Store) queueFree(b *pgx.Batch, freed []freedSlot, credit bool, now time.Time) *strandedKeys {
	var one []string
	gates := map[shardKey]int{}
	for _, f := range freed {
		switch {
		case f.key == "":
		case f.shard < 0:
			one = append(one, f.key)
		case credit:
			gates[shardKey{f.key, f.shard}]++
		}
	}
	slices.Sort(one)
	one = slices.Compact(one)
	st := &strandedKeys{} // returned even when nothing is freed: the caller may add queues
	if len(one) == 0 && len(gates) == 0 {
		return st
	}
	if len(one) > 0 {
		b.Queue(s.q(sqlKeyLock), one, s.keySalt)
	}
	promote := map[string]int{}
	for _, k := range one {
		promote[k] = 1
	}
	if len(gates) > 0 {
		keys, shards, ns := shardCounts(gates)
		b.Queue(s.q(sqlSlotsLockExisting), keys, shards)
		b.Queue(s.q(sqlCredit), keys, shards, ns)
		b.Queue(s.q(sqlSlotsDropEmpty), keys, shards)
		for i, k := range keys {
			promote[k] += int(ns[i])
		}
	}
	keys := make([]string, 0, len(promote))
	for k := range promote {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	ns := make([]int32, len(keys))
	for i, k := range keys {
		ns[i] = int32(promote[k])
	}
	isOne := make([]bool, len(keys))
	for i, k := range keys {
		_, isOne[i] = slices.BinarySearch(one, k)
	}
	b.Queue(s.q(sqlPromote), keys, ns, tsArg(now), isOne).Query(func(rows pgx.Rows) error {
		_, err := scanPromoted(rows, &st.queues, func(k string) {
			i, _ := slices.BinarySearch(keys, k)
			st.keys, st.one = append(st.keys, k), append(st.one, isOne[i])
		}, func(k string) {
			// A credited slot of gate k went to a blocked row: the gate
			// had rows waiting (an insert may have put them in its line:
			// see blockAtGates), so its holders' outcomes may hand off.
			s.hot.mark(k)
		})
		return err
	})
	return st
}

// skipUnwaited drops, from the slots an outcome batch frees, the K = 1 keys
// whose holders had no rows waiting on them (freedSlot.waiters: see
// migration 013), so that their freeing takes no advisory lock and reads
// no waiting row. Every transaction that leaves a row of such a key
// waiting marks the holder first, under a row lock the outcome read the
// mark under, or does not leave it waiting (sqlFlagHolders, and sqlBlock's waited-on check);
// a heal that found a holder it could not mark tries again once the
// holder's outcome has committed (the stranded check of sqlStranded). Other paths that free
// slots (release, cancel, reap) free them all, marked or not.
func skipUnwaited(freed []freedSlot) []freedSlot {
	return slices.DeleteFunc(freed, func(f freedSlot) bool {
		return f.key != "" && f.shard < 0 && f.successor == "" && !f.waiters
	})
}

// scanPromoted reads sqlPromote's rows: it returns how many rows were
// promoted, appends the queues to notify to queues (wakeAfterCommit drops
// repeats), calls stranded with each key left stranded and, when
// promotedGate is not nil, with each gate key of which rows were promoted.
func scanPromoted(rows pgx.Rows, queues *[]string, stranded, promotedGate func(key string)) (int, error) {
	total := 0
	var q, k string
	var n int64
	_, err := pgx.ForEachRow(rows, []any{&q, &n, &k}, func() error {
		switch {
		case k == "":
			total += int(n)
			*queues = append(*queues, q)
		case n == 0:
			stranded(k)
		case promotedGate != nil:
			promotedGate(k)
		}
		return nil
	})
	return total, err
}

// strandedKeys are keys a freeing transaction left with a free slot and
// only blocked rows, all of them skipped by its promotion because someone
// held their row locks (see sqlPromote).
type strandedKeys struct {
	keys []string
	one  []bool // K = 1 key
	// queues are the queues of the rows the transaction made ready
	// (sqlPromote, and the statements whose rows scanWoken reads: a parent
	// woken by its children, a row woken by its inbox), notified once it
	// has committed (heal).
	queues []string
}

func (s *Store) queueStranded(b *pgx.Batch, keys []string, one []bool, st *strandedKeys) {
	isOne := map[string]bool{}
	for i, k := range keys {
		isOne[k] = one[i]
	}
	st.keys, st.one = nil, nil
	b.Queue(s.q(sqlStranded), keys, one).Query(func(rows pgx.Rows) error {
		var k string
		_, err := pgx.ForEachRow(rows, []any{&k}, func() error {
			st.keys, st.one = append(st.keys, k), append(st.one, isOne[k])
			return nil
		})
		return err
	})
}

// healAttempts bounds how often heal retries a stranded key; the waits
// double from 1 ms, about a quarter of a second in all. The locks that make
// a promotion skip a row are held by a claim or another freeing transaction
// for a few milliseconds; past this, the late heal takes the key over.
const healAttempts = 8

// heal retries the promotion of the keys a committed freeing transaction
// left stranded, each attempt a transaction of its own that takes the keys'
// locks (K = 1 advisory locks, waiting) and promotes a key's first blocked
// row where the key still has room and no ready row. The keys it has not
// healed when its attempts end, or when one fails, go to the late heal
// (healLater); the reconciler is the safety net.
func (s *Store) heal(ctx context.Context, st *strandedKeys, now time.Time) {
	if st == nil {
		return
	}
	s.wakeAfterCommit(st.queues)
	keys, one := st.keys, st.one
	wait := time.Millisecond
attempts:
	for attempt := 0; attempt < healAttempts && len(keys) > 0; attempt++ {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			break attempts
		case <-t.C:
		}
		wait *= 2
		left, err := s.healPass(ctx, keys, one, now)
		keys, one = left.keys, left.one
		if err != nil {
			break
		}
	}
	s.healLater(keys, one)
}

// healPass runs healOnce over keys, healChunk keys to a transaction, and
// returns the keys left stranded: those its chunks found stranded and, if
// a chunk fails, that chunk's keys and the keys after it, with the error.
func (s *Store) healPass(ctx context.Context, keys []string, one []bool, now time.Time) (*strandedKeys, error) {
	left := &strandedKeys{}
	for i := 0; i < len(keys); i += healChunk {
		j := min(i+healChunk, len(keys))
		more := &strandedKeys{}
		if err := s.healOnce(ctx, keys[i:j], one[i:j], more, now); err != nil {
			left.keys, left.one = append(left.keys, keys[i:]...), append(left.one, one[i:]...)
			return left, err
		}
		left.keys, left.one = append(left.keys, more.keys...), append(left.one, more.one...)
	}
	return left, nil
}

// lateHeal holds the stranded keys heal gave up on, which a goroutine of
// the store keeps trying (see healLater).
type lateHeal struct {
	mu      sync.Mutex
	keys    map[string]lateKey
	running bool
}

type lateKey struct {
	one   bool
	since time.Time
}

const (
	// lateHealFirst is the first wait of the late heal; the waits double
	// up to lateHealEvery.
	lateHealFirst = 50 * time.Millisecond
	lateHealEvery = time.Second
	// lateHealFor is how long the late heal keeps trying a key: about the
	// reconciler's interval, whose sweep promotes whatever is left.
	lateHealFor = 30 * time.Second
)

// healLater hands the keys heal could not heal in its attempts, or at all
// (an error), to a goroutine of the store that keeps trying them, every
// lateHealEvery at most, for lateHealFor: a row left blocked behind a free
// key otherwise waits for the reconciler's sweep, up to its interval
// (30 s by default). heal's attempts end after about a quarter of a second
// so as not to hold up its caller (an insert, an outcome's flush), and on
// a busy server the locks that make it fail are held longer, for as long
// as the server stalls. The goroutine ends when no key is left, and with
// the store (Close); a process that dies meanwhile leaves the keys to the
// reconciler.
func (s *Store) healLater(keys []string, one []bool) {
	if len(keys) == 0 || s.closed.Load() {
		return
	}
	since := time.Now()
	s.late.mu.Lock()
	defer s.late.mu.Unlock()
	if s.late.keys == nil {
		s.late.keys = map[string]lateKey{}
	}
	for i, k := range keys {
		if _, ok := s.late.keys[k]; !ok {
			s.late.keys[k] = lateKey{one: one[i], since: since}
		}
	}
	if !s.late.running {
		s.late.running = true
		go s.healLate()
	}
}

// healLate is healLater's goroutine. Each attempt takes the store's clock
// (Options.Clock) when it runs, as healInserted does.
func (s *Store) healLate() {
	wait := lateHealFirst
	for {
		time.Sleep(wait)
		var now time.Time
		if t := s.clockNow(); t != nil {
			now = *t
		}
		wait = min(2*wait, lateHealEvery)
		s.late.mu.Lock()
		if len(s.late.keys) == 0 || s.closed.Load() {
			clear(s.late.keys)
			s.late.running = false
			s.late.mu.Unlock()
			return
		}
		keys := slices.Sorted(maps.Keys(s.late.keys))
		one := make([]bool, len(keys))
		for i, k := range keys {
			one[i] = s.late.keys[k].one
		}
		s.late.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		stranded, _ := s.healPass(ctx, keys, one, now) // a failure leaves its keys for the next attempt
		cancel()
		left := map[string]bool{}
		for _, k := range stranded.keys {
			left[k] = true
		}
		s.late.mu.Lock()
		for _, k := range keys {
			if lk := s.late.keys[k]; !left[k] || time.Since(lk.since) > lateHealFor {
				delete(s.late.keys, k)
			}
		}
		s.late.mu.Unlock()
	}
}

// healInserted heals the K = 1 keys a committed insert put blocked rows
// behind (see sqlInsert: the K = 1 busy check and the ready count), and
// marks them hot (the outcome of their holders can hand off: see
// recentKeys): one healOnce at once, then heal's retries for the keys it
// left stranded. On an error the keys go to the late heal (healLater): the
// rows are in, and the reconciler's sweep is the safety net.
//
// This closes the lost wakeup of an insert racing the end of its key's
// holder. The insert does not take the key's advisory lock, so a freeing
// transaction (an outcome, a release, a cancel, a reap: every path that
// frees a K = 1 key takes its advisory lock, waiting, before it reads the
// key's waiting rows, each statement with a snapshot taken after the lock
// was granted) may look for the key's blocked rows before the insert
// commits, find none, and commit: nothing would ever promote the new row.
// An outcome whose holder was not marked as having waiters does not free
// the key at all (see skipUnwaited): the heal marks the holder it finds
// (sqlPromoteIfRoom), and one it cannot mark, locked by that outcome,
// leaves the key stranded (the stranded check of sqlStranded), to be tried again after the
// outcome committed.
// healOnce runs after the insert committed and takes the same lock, so the
// two serialize on it: a freeing transaction that took the lock first has
// committed when the heal reads the key, which the heal then sees free (no
// executing row: it promotes the first blocked row unless a ready row of
// the key is already in line, whose claim and end pass the turn on); one
// that takes the lock after the heal reads the key after the insert's
// commit, so it sees the blocked row and promotes it or hands the slot to
// it. A key held only by a gate-admitted row (its limit was removed since)
// frees without the advisory lock: the K = 1 busy check does not count such a
// holder, so the insert puts its rows in ready, as before.
func (s *Store) healInserted(ctx context.Context, keys []string) {
	if len(keys) == 0 {
		return
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	s.hot.mark(keys...) // found saturated: their holders' outcomes may hand off
	var now time.Time
	if t := s.clockNow(); t != nil {
		now = *t
	}
	left, err := s.healPass(ctx, keys, slices.Repeat([]bool{true}, len(keys)), now)
	if err != nil {
		s.healLater(left.keys, left.one)
		return
	}
	s.heal(ctx, left, now)
}

// healChunk bounds the keys one heal transaction locks (one advisory lock
// each: PostgreSQL's lock table is shared and finite).
const healChunk = 256

func (s *Store) healOnce(ctx context.Context, keys []string, one []bool, next *strandedKeys, now time.Time) error {
	tx, err := s.beginBatch(ctx)
	if err != nil {
		return err
	}
	defer tx.end()
	var oneKeys []string
	for i, k := range keys {
		if one[i] {
			oneKeys = append(oneKeys, k)
		}
	}
	slices.Sort(oneKeys) // advisory locks in key order, like every freeing path
	b := &pgx.Batch{}
	if len(oneKeys) > 0 {
		b.Queue(s.q(sqlKeyLock), oneKeys, s.keySalt)
	}
	b.Queue(s.q(sqlPromoteIfRoom), keys, promoteChunk, tsArg(now), s.channel, true)
	s.queueStranded(b, keys, one, next)
	return tx.send(ctx, b, true)
}

// cool forgets, among keys whose slots a hand-off tried, those with no row
// waiting in turn, and keeps the others hot. A key whose waiting rows are
// all out of turn (other keys' earlier rounds are ready: see
// admission.Waiting) has its slots refused by the turn rule and going the
// claim's way; reading and locking its next rows at every outcome, with
// the reservations they would want, only cost the flush (with 500 keys of
// 40 rows each, the peers' keyed scenario fell from about 14,000 to 3,000
// steps/s). It is marked hot again when a claim finds it full.
func (s *Store) cool(keys []string, waiting []admission.Waiting) {
	var warm []string
	for _, w := range waiting {
		if admission.InTurn(w.Turn, w.Head) && (len(warm) == 0 || warm[len(warm)-1] != w.Key) {
			warm = append(warm, w.Key)
		}
	}
	var idle []string
	for _, k := range keys {
		if !slices.Contains(warm, k) {
			idle = append(idle, k)
		}
	}
	s.hot.cool(idle...)
	s.hot.mark(warm...)
}

// handOffIDs returns the ids of the contended outcomes whose slots a
// flush with h may hand off, or whose successors may reserve theirs: none
// without h, or without room in it when it does not reserve.
func handOffIDs(outcomes []store.Outcome, h *store.HandOff) []string {
	if h == nil || (!hasRoom(h.Room) && !h.Reserve) {
		return nil
	}
	var ids []string
	for _, o := range outcomes {
		if o.Contended {
			ids = append(ids, o.ID)
		}
	}
	return ids
}

// outcomeChains are the successor links among a hand-off batch's outcomes
// (store.Outcome.Successor): a worker may send the outcome of a reserved
// row together with its predecessor's, and a chain R → S1 → S2 of them
// passes R's slot to S2's successor, the row still running (or, when S2
// names none, frees it): S1 and S2 never hold the slot by the rows, since
// their steps ran in it before the batch commits.
type outcomeChains struct {
	next    map[string]string // outcome id -> the successor it names
	index   map[string]int    // outcome id -> its index in the batch
	chained map[string]bool   // outcomes of reserved rows whose predecessor's outcome is in the batch
}

// chains reads the successor links of a batch; none without h, which only
// a hand-off flush carries.
func chains(outcomes []store.Outcome, h *store.HandOff) outcomeChains {
	ch := outcomeChains{next: map[string]string{}, index: map[string]int{}, chained: map[string]bool{}}
	if h == nil {
		return ch
	}
	for i, o := range outcomes {
		ch.index[o.ID] = i
		if o.Successor.ID != "" {
			ch.next[o.ID] = o.Successor.ID
		}
	}
	for _, nx := range ch.next {
		if _, ok := ch.index[nx]; ok {
			ch.chained[nx] = true
		}
	}
	return ch
}

// pending returns the successors that end chains: rows reserved and named
// by an outcome of the batch, whose own outcome is not in it (the worker
// runs them, or is about to).
func (ch outcomeChains) pending(outcomes []store.Outcome) ([]string, []int64) {
	var ids []string
	var fences []int64
	for _, o := range outcomes {
		nx := o.Successor
		if _, in := ch.index[nx.ID]; nx.ID != "" && !in {
			ids, fences = append(ids, nx.ID), append(fences, nx.Fence)
		}
	}
	return ids, fences
}

// pass follows the chain that starts at the committed outcome o, which
// freed slot f: the slot goes to the successor that ends the chain, when
// that row is still reserved for the worker (held: the ones
// sqlSuccessorsLock found, with their queues), or is freed (credited,
// promoted, handed off) when the chain ends without one, with the last
// outcome's Ahead. It is not freed at all (false) when an outcome of the
// chain was stale: a step after it ran in the slot with no claim of its
// own, so the slot stays taken; an under-credit, which the reconciler
// repairs.
func (ch outcomeChains) pass(outcomes []store.Outcome, results []store.OutcomeResult, o store.Outcome,
	f freedSlot, held map[string]string) (freedSlot, bool) {
	last := o
	for nx := ch.next[o.ID]; nx != ""; nx = ch.next[last.ID] {
		f.waiters = true // a chain's rows are a contended key's: free it the full way
		i, in := ch.index[nx]
		if !in {
			if q, ok := held[nx]; ok {
				f.successor, f.queue = nx, q
			}
			break
		}
		if results[i].Stale {
			return f, false
		}
		last = outcomes[i]
	}
	f.ahead = clampAhead(last.Ahead)
	return f, true
}

// aheadMax bounds store.Outcome.Ahead: the most successors a row gets
// reserved at once.
const aheadMax = 8

func clampAhead(n int) int { return min(max(n, 0), aheadMax) }

// wants is, for each contended outcome of ids, how many of its key's
// waiting rows a hand-off may need for it: one for the row its slot may be
// handed to when it names no successor, and, with reserve, its Ahead when
// it ends its chain (see pass: only the chain's last outcome's Ahead
// counts); at least one for an outcome that ends a chain, whose next row's
// turn tells whether the chain goes on (admission.FreePlan.Yield).
func (ch outcomeChains) wants(ids []string, outcomes []store.Outcome, reserve bool) []int32 {
	wants := make([]int32, len(ids))
	for i, id := range ids {
		nx := ch.next[id]
		_, chainGoesOn := ch.index[nx]
		if nx == "" {
			wants[i]++
		}
		if reserve && !chainGoesOn {
			wants[i] += int32(clampAhead(outcomes[ch.index[id]].Ahead))
		}
		if nx != "" && !chainGoesOn && wants[i] == 0 {
			wants[i] = 1 // the next row's turn (see admission.FreePlan.Yield)
		}
	}
	return wants
}

// handOffReads are the reads a hand-off decides on, queued on the outcome
// transaction's first batch after the outcomes are applied (see
// queueHandOffReads).
type handOffReads struct {
	st      admission.FreeState
	waiting []admission.Waiting
	keys    []string            // the keys read
	multi   map[string]multiRow // the waiting rows of several keys, by id
}

// queueHandOffReads queues on b, after the statement that applies the
// outcomes, what a hand-off of the slots of the contended outcomes ids
// (handOffIDs) needs: the
// advisory locks of their K = 1 keys (waiting, in key order, as queueFree
// takes them) and which still execute, the paused queues, the keys' next
// waiting rows, locked with SKIP LOCKED, and then their gate keys' limits
// and counters (read, not locked: a hand-off does not write them).
func (s *Store) queueHandOffReads(b *pgx.Batch, ids []string, outcomes []store.Outcome, ch outcomeChains, h *store.HandOff) *handOffReads {
	r := &handOffReads{st: admission.NewFreeState(h.Room, func(w string, v int) bool { return store.Runs(h.Workflows, w, v) })}
	uids := uuidArg(ids)
	b.Queue(s.q(sqlHandOffLock), uids, s.keySalt).Query(func(rows pgx.Rows) error {
		var k string
		_, err := pgx.ForEachRow(rows, []any{&k}, func() error { r.keys = append(r.keys, k); return nil })
		return err
	})
	b.Queue(s.q(sqlHandOffBusy), uids).Query(func(rows pgx.Rows) error {
		var k string
		_, err := pgx.ForEachRow(rows, []any{&k}, func() error { r.st.Busy[k] = true; return nil })
		return err
	})
	// The paused queues, of the rows handed off or reserved and of the
	// successors passed a slot (whose chains yield): a table of a few rows.
	b.Queue(s.q(sqlPausedQueues)).Query(func(rows pgx.Rows) error {
		var q string
		var at time.Time
		_, err := pgx.ForEachRow(rows, []any{&q, &at}, func() error {
			if r.st.Paused == nil {
				r.st.Paused = map[string]bool{}
			}
			r.st.Paused[q] = true
			return nil
		})
		return err
	})
	workflows, versions := workflowArrays(h.Workflows)
	b.Queue(s.q(sqlHandOffCandidates), uids, ch.wants(ids, outcomes, h.Reserve), workflows, versions).Query(func(rows pgx.Rows) error {
		var w admission.Waiting
		var round, otherRound, freeRound *int64
		var otherPrio, freePrio *int
		var intent string
		var extraKeys, extraIntents []string
		_, err := pgx.ForEachRow(rows, []any{&w.ID, &w.Key, &w.Queue, &w.Workflow, &w.Version, &w.Turn.Priority, &round,
			&otherPrio, &otherRound, &freePrio, &freeRound, &w.Policy, &w.Rated, &intent, &extraKeys, &extraIntents}, func() error {
			w.Turn.Round = roundOf(round)
			w.Also = nil
			if len(extraKeys) > 0 {
				m := multiRow{key: store.KeyRef{Key: w.Key, Intent: gate.Intent(intent)}}
				for i, k := range extraKeys {
					m.others = append(m.others, store.KeyRef{Key: k, Intent: gate.Intent(extraIntents[i])})
				}
				if r.multi == nil {
					r.multi = map[string]multiRow{}
				}
				r.multi[w.ID] = m
				w.Also = extraKeys
				w.AtFirst = m.atFirst()
				extraKeys, extraIntents = nil, nil
			}
			w.Head = nil
			for _, h := range []*admission.Turn{turnOf(otherPrio, otherRound), turnOf(freePrio, freeRound)} {
				if h != nil && (w.Head == nil || h.Compare(*w.Head) < 0) {
					w.Head = h
				}
			}
			r.waiting = append(r.waiting, w)
			return nil
		})
		return err
	})
	// The counters are read after the candidates, in a newer snapshot: a
	// slot credited and a row promoted for it by a transaction that
	// commits between the two reads then shows as room (admission.Free
	// does not hand off a slot of a key with room), rather than the
	// promoted row showing as a candidate beside counters without room,
	// which would hand it this slot and leave the credited one free with
	// no ready row to fill it.
	b.Queue(s.q(sqlHandOffGates), uids).Query(func(rows pgx.Rows) error {
		var k string
		var l gate.Limit
		var shard, capacity, available *int32
		_, err := pgx.ForEachRow(rows, []any{&k, &l.Limit, &l.Shards, &shard, &capacity, &available}, func() error {
			if _, seen := r.st.Limits[k]; !seen {
				l.Name = gate.NameOf(k)
				r.st.Limits[k] = l
				r.keys = append(r.keys, k)
			}
			if shard != nil {
				r.st.Counters[k] = append(r.st.Counters[k], admission.Counter{Shard: int(*shard), Capacity: int(*capacity), Available: int(*available)})
				r.st.Count[k]++
			}
			return nil
		})
		return err
	})
	return r
}

// tryOthers fills r.st.Tried (see sqlHandOffTry) for the other keys of
// the rows of several keys read in a freed key's line that no slot freed
// reads (r.keys), in one round trip of tx, when there are such keys and
// the transaction already holds the lock of every K = 1 key freed. Every
// row read, not only a line's head: a batch that frees several slots of a
// gate hands them to as many of its rows, each with its own other key.
func (s *Store) tryOthers(ctx context.Context, tx *batchTx, r *handOffReads, freed []freedSlot) error {
	if r == nil || len(r.multi) == 0 {
		return nil
	}
	read := make(map[string]bool, len(r.keys))
	for _, k := range r.keys {
		read[k] = true
	}
	for _, f := range freed {
		if f.successor == "" && f.shard < 0 && f.key != "" && !read[f.key] {
			return nil // its lock is yet to be waited for (queueFree)
		}
	}
	var keys []string
	for _, w := range r.waiting {
		for _, k := range w.Also {
			if !read[k] {
				keys = append(keys, k)
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	locked, busy := map[string]bool{}, map[string]bool{}
	b := &pgx.Batch{}
	b.Queue(s.q(sqlHandOffTry), keys, s.keySalt).Query(func(rows pgx.Rows) error { return collectKeys(rows, locked) })
	b.Queue(s.q(sqlKeyBusy), keys).Query(func(rows pgx.Rows) error { return collectKeys(rows, busy) })
	if err := tx.send(ctx, b, false); err != nil {
		return err
	}
	for k := range locked {
		if !busy[k] {
			if r.st.Tried == nil {
				r.st.Tried = map[string]bool{}
			}
			r.st.Tried[k] = true
		}
	}
	return nil
}

// collectKeys adds the keys rows return to set.
func collectKeys(rows pgx.Rows, set map[string]bool) error {
	var k string
	_, err := pgx.ForEachRow(rows, []any{&k}, func() error { set[k] = true; return nil })
	return err
}

// roundOf is a round as read (nil: the row has none).
func roundOf(r *int64) int64 {
	if r == nil {
		return admission.NoRound
	}
	return *r
}

// turnOf is the turn of a head row as read (nil priority: no such row).
func turnOf(prio *int, round *int64) *admission.Turn {
	if prio == nil {
		return nil
	}
	return &admission.Turn{Priority: *prio, Round: roundOf(round)}
}

// handOff decides, on the reads queueHandOffReads made (nil: none), what
// becomes of the freed slots (admission.Free): those that name a held
// successor pass to it, others go straight to the next waiting rows of
// their keys, and with h.Reserve each row made executing gets a
// successor reserved. It queues on b those moves for worker; their rows
// are appended to *claimed when b runs (successors, then hand-offs, then
// reservations, which carry After). It returns the freed slots that were
// not passed on: the caller credits and promotes them (queueFree). Slots of
// keys that were not read (an outcome not contended, a key an outcome
// changed) are among them. It also returns the successors whose chains
// yield (admission.FreePlan.Yield).
func (s *Store) handOff(b *pgx.Batch, r *handOffReads, worker string, freed []freedSlot,
	h *store.HandOff, now time.Time, claimed *[]store.Claimed) ([]freedSlot, []string) {
	var slots []admission.Freed
	var rest []freedSlot
	for _, f := range freed {
		switch {
		case f.successor != "":
			slots = append(slots, admission.Freed{Key: f.key, Shard: f.shard, Successor: f.successor, Queue: f.queue, Ahead: f.ahead, Also: f.also})
		case r != nil && f.key != "" && slices.Contains(r.keys, f.key):
			slots = append(slots, admission.Freed{Key: f.key, Shard: f.shard, Ahead: f.ahead})
		default:
			rest = append(rest, f)
		}
	}
	if len(slots) == 0 {
		return freed, nil
	}
	st := admission.NewFreeState(nil, nil)
	var waiting []admission.Waiting
	if r != nil {
		st, waiting = r.st, r.waiting
		st.Reserve = h.Reserve
	}
	plan := admission.Free(slots, waiting, st)
	if r != nil {
		s.cool(r.keys, r.waiting)
	}
	s.hot.cool(plan.Roomy...) // not full: claims serve them (see admission.Free)
	for _, f := range plan.Rest {
		rest = append(rest, freedSlot{key: f.Key, shard: f.Shard, waiters: true})
	}
	// The rows come back one by one: room for all of them at once, rather
	// than an array doubled (and copied) as they come, which made a tenth
	// of the engine's allocations in the peers' hot gate.
	*claimed = slices.Grow(*claimed, len(plan.Successions)+len(plan.HandOffs)+len(plan.Reserved))
	scan := func(after map[string]string) func(pgx.Rows) error {
		return func(rows pgx.Rows) error {
			var cs claimScan
			for rows.Next() {
				c, err := scanClaimed(rows, &cs)
				if err != nil {
					return err
				}
				c.Contended = true
				c.After = after[c.ID]
				*claimed = append(*claimed, c)
			}
			return rows.Err()
		}
	}
	if len(plan.Successions) > 0 {
		ids, shards := admittedArrays(plan.Successions)
		b.Queue(s.q(sqlSucceed), ids, worker, micros(h.Lease), shards, tsArg(now)).Query(func(rows pgx.Rows) error {
			var c store.Claimed
			_, err := pgx.ForEachRow(rows, []any{&c.ID, &c.Fence, &c.Queue}, func() error {
				c.Status, c.Contended = store.StatusExecuting, true
				*claimed = append(*claimed, c)
				return nil
			})
			return err
		})
	}
	if len(plan.HandOffs) > 0 {
		ids, shards := admittedArrays(plan.HandOffs)
		var multi []string // rows of several keys, each given a slot of every key
		for _, a := range plan.HandOffs {
			if len(a.Also) > 0 {
				multi = append(multi, a.ID)
			}
		}
		mc := claimMulti(r.multi, plan.HandOffs, shards)
		b.Queue(s.q(sqlHandOff), ids, worker, micros(h.Lease), shards, tsArg(now), uuidArg(multi), mc.firsts, mc.intents, mc.extras).Query(func(rows pgx.Rows) error {
			err := scan(nil)(rows)
			if len(multi) > 0 {
				holdsOf(*claimed, r.multi, plan.HandOffs)
			}
			return err
		})
		s.queueHolds(b, mc, worker)
	}
	if len(plan.Reserved) > 0 {
		ids := make([]string, len(plan.Reserved))
		after := make(map[string]string, len(plan.Reserved))
		for i, a := range plan.Reserved {
			ids[i], after[a.ID] = a.ID, a.After
		}
		b.Queue(s.q(sqlReserve), uuidArg(ids), worker, micros(h.Lease), tsArg(now)).Query(scan(after))
	}
	return rest, plan.Yield
}

// admittedArrays are the ids and shards of rows a plan admits.
func admittedArrays(as []admission.Admitted) (any, []int32) {
	ids := make([]string, len(as))
	shards := make([]int32, len(as))
	for i, a := range as {
		ids[i], shards[i] = a.ID, int32(a.Shard)
	}
	return uuidArg(ids), shards
}
