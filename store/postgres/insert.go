package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
)

// DefaultQueue is the queue of an instance inserted with an empty Queue.
const DefaultQueue = store.DefaultQueue

// Insert inserts instances atomically (see store.Store). A batch without
// unique keys is one statement (in a transaction that reads its gates
// first when it has due rows of several keys: insertSeveral), or, from
// copyInsertMin (500) rows on, one transaction that copies the rows in
// (COPY). Any batch size fits.
//
// Due rows of a K = 1 key go in blocked, off the pick path, with the rounds
// they would have had ready, when the key is busy or has
// admission.ReadyCap rows ready (admission.InsertBlocked); once the insert
// has committed, Insert heals the keys it blocked behind rows already there
// (see healInserted). Due rows of several keys go in blocked in the line
// of their first gate when it has no free slot for them, or behind a row
// of their first key (see blockAtGates).
func (s *Store) Insert(ctx context.Context, instances []store.NewInstance) ([]store.InsertResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	p, err := prepareInsert(instances)
	if err != nil {
		return nil, err
	}
	if len(p.rows) == 0 {
		return nil, nil
	}
	// Beside another, the insert notifies after its commit, so that the
	// two do not commit one at a time (see sqlInsert). Alone, it notifies
	// in its statement: its notification then goes out with its commit,
	// not a round trip later from another connection (on a local server
	// make bench's scenario 9 shows no difference either way).
	concurrent := s.inserting.Add(1) > 1
	defer s.inserting.Add(-1)
	p.block, p.atGates, p.wakeAfter = true, true, concurrent
	switch {
	case !p.unique && len(p.rows) >= s.copyMin:
		err = s.inTx(ctx, func(tx pgx.Tx) error {
			if err := s.blockAtGates(ctx, tx, p); err != nil {
				return err
			}
			return s.copyInsert(ctx, tx, p)
		})
	case !p.unique && p.several():
		err = s.insertSeveral(ctx, p)
	case !p.unique:
		err = s.runInsert(ctx, s.pool, p)
	default:
		err = s.inTx(ctx, func(tx pgx.Tx) error { return s.insertUnique(ctx, tx, p) })
	}
	if err != nil {
		return nil, err
	}
	s.afterInsert(ctx, p)
	return p.results, nil
}

// InsertTx inserts instances inside the caller's transaction tx, so that
// they commit or roll back with the caller's own writes (it implements
// store.TxInserter). Workers are notified when tx commits. Results are as
// for Insert; unique-key checks hold an advisory lock per unique key until
// tx ends.
//
// Unlike Insert, InsertTx inserts every due row ready, even one whose K = 1
// key is busy or at its cap of ready rows: a row inserted blocked must be healed after its commit (see
// healInserted), which the caller's transaction does not tell the store
// about. The first claim that finds its key busy blocks it.
//
// Prefer durable.Engine.InsertTx (or Workflow.InsertTx): the store does not
// know which workflows the engines have registered, so it refuses only rows
// that no worker could ever run (an empty workflow name or step, a version
// below 1), while the engine also checks the workflow, its version, the
// state's encoding and the key (Strict mode included).
func (s *Store) InsertTx(ctx context.Context, tx pgx.Tx, instances []store.NewInstance) ([]store.InsertResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if tx == nil {
		return nil, fmt.Errorf("postgres: InsertTx: %w: nil transaction", store.ErrInvalid)
	}
	for i, in := range instances {
		if in.Version < 1 {
			return nil, fmt.Errorf("insert: %w: instance %d (workflow %q): version %d: a registered workflow version is 1 or more (insert through durable.Engine.InsertTx)",
				store.ErrInvalid, i, in.Workflow, in.Version)
		}
	}
	p, err := prepareInsert(instances)
	if err != nil {
		return nil, err
	}
	if len(p.rows) == 0 {
		return nil, nil
	}
	switch {
	case !p.unique && len(p.rows) >= s.copyMin:
		err = s.copyInsert(ctx, tx, p)
	case !p.unique:
		err = s.runInsert(ctx, tx, p)
	default:
		err = s.insertUnique(ctx, tx, p)
	}
	if err != nil {
		return nil, err
	}
	return p.results, nil
}

// insertPlan is a validated batch: results in input order, and the rows to
// insert (duplicates by unique key are dropped by insertUnique). With
// block, due rows of K = 1 keys go in as admission.InsertBlocked decides,
// and the insert fills blocked with the keys that received blocked rows
// behind rows already there (whoever commits the insert must then heal
// them: healInserted) and behind with the keys blocked only behind the
// batch's own rows (which commit with them: nothing to heal).
type insertPlan struct {
	rows    []insertRow
	results []store.InsertResult
	unique  bool
	block   bool
	blocked []string
	behind  []string
	gates   []string // the gates rows went in blocked at (see blockAtGates)
	// atGates: with block, due rows of several keys go in as blockAtGates
	// decides (Insert and a schedule's tick; not an outcome's children).
	atGates bool
	// wakeAfter: the store owns the insert's transaction and notifies the
	// queues that received ready rows (queues) once it has committed
	// (afterInsert), not in the statement (see sqlInsert): an outcome's
	// children, a schedule's tick, and an Insert made while another of the
	// store's is in flight. The COPY path (sqlInsertRounds) notifies in
	// its transaction whatever this says.
	wakeAfter bool
	queues    []string
}

type insertRow struct {
	idx       int // index in results
	in        store.NewInstance
	scope     []string
	joinGen   int    // the parent's spawn a child belongs to
	blockedIn string // the key whose line it goes in blocked in: its first gate, or its first key (see blockAtGates)
}

// several reports whether p has a row of several keys.
func (p *insertPlan) several() bool {
	return slices.ContainsFunc(p.rows, func(r insertRow) bool { return len(r.in.Also) > 0 })
}

// blockAtGates decides, for the due rows of several keys of p (with block
// and atGates), which go in blocked in the line of their first gate
// (store.FirstGate) as admission.InsertBlockedAtGate decides from the
// gates' free slots and whether rows wait in their lines (sqlInsertGates,
// whose share locks on the counters the insert's transaction tx holds to
// its commit), and sets their blockedIn
// (decideAtGates; insertSeveral reads and decides the same). A row that
// the K = 1 rule blocks in its first key's line (admission.InsertBlocked,
// from the same statement's reads) stays there. They go in with that gate
// in their key column (waitIn) and the round they would have had ready as
// rows of their first key. A row a full gate would block anyway is then
// written once until a slot of the gate frees, and its first claim does
// not move it into the gate's line. A row is due here when it has neither
// a delay nor a run_at after the clock (the store's, or this host's when
// it has none: a row that the database finds due a moment later goes in
// ready).
func (s *Store) blockAtGates(ctx context.Context, tx querier, p *insertPlan) error {
	keys, now := s.gateReadKeys(p)
	if len(keys) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, s.q(sqlInsertGates), keys, admission.ReadyCap)
	if err != nil {
		return insertError(err)
	}
	read, err := scanGateReads(rows)
	if err != nil {
		return insertError(err)
	}
	p.decideAtGates(read, now)
	return nil
}

// insertSeveral inserts p, a batch with rows of several keys, through the
// single statement: in a transaction of two round trips when blockAtGates
// has keys to read (its BEGIN travels with the read, its COMMIT with the
// insert), else in that statement alone.
func (s *Store) insertSeveral(ctx context.Context, p *insertPlan) error {
	keys, now := s.gateReadKeys(p)
	if len(keys) == 0 {
		return s.runInsert(ctx, s.pool, p)
	}
	tx, err := s.beginGeneric(ctx) // the read is planned at every call otherwise (array parameters)
	if err != nil {
		return insertError(err)
	}
	defer tx.end()
	var read map[string]gateRead
	b := &pgx.Batch{}
	b.Queue(s.q(sqlInsertGates), keys, admission.ReadyCap).Query(func(rows pgx.Rows) (err error) {
		read, err = scanGateReads(rows)
		return err
	})
	if err := tx.send(ctx, b, false); err != nil {
		return insertError(err)
	}
	p.decideAtGates(read, now)
	b = &pgx.Batch{}
	s.queueInsert(b, p)
	if err := tx.send(ctx, b, true); err != nil {
		return insertError(err)
	}
	return nil
}

// gateRead is what sqlInsertGates reads of one key.
type gateRead struct {
	gate  bool
	n     int  // a gate's free slots; a K = 1 key's ready rows
	flag  bool // a gate's counters all locked; a K = 1 key busy
	lined bool // rows wait blocked in a gate's line (reserved rows do not wait)
}

func scanGateReads(rows pgx.Rows) (map[string]gateRead, error) {
	read := map[string]gateRead{}
	var k string
	var kr gateRead
	_, err := pgx.ForEachRow(rows, []any{&k, &kr.gate, &kr.n, &kr.flag, &kr.lined}, func() error { read[k] = kr; return nil })
	return read, err
}

// gateReadKeys clears what the insert of p decides (its rows' blockedIn,
// and the keys it blocks rows behind or at: blocked, behind, gates), and
// returns the keys blockAtGates reads (sorted, none when p has no due row
// of several keys or is not to be blocked at gates) and the time rows are
// due by.
func (s *Store) gateReadKeys(p *insertPlan) ([]string, time.Time) {
	p.blocked, p.behind, p.gates = nil, nil, nil
	for i := range p.rows {
		p.rows[i].blockedIn = ""
	}
	now := time.Now()
	if t := s.clockNow(); t != nil {
		now = *t
	}
	if !p.block || !p.atGates || !p.several() {
		return nil, now
	}
	var keys []string
	for _, r := range p.rows {
		if len(r.in.Also) == 0 || !dueBy(r.in, now) {
			continue
		}
		keys = append(keys, r.in.Key)
		for _, k := range r.in.Also {
			keys = append(keys, k.Key)
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys), now
}

// decideAtGates sets the blockedIn of p's due rows of several keys from
// the keys' reads (see blockAtGates).
func (p *insertPlan) decideAtGates(read map[string]gateRead, now time.Time) {
	waitRow := func(i int, key string) admission.InsertRow {
		in := p.rows[i].in
		at := in.RunAt
		if at.IsZero() {
			at = now
		}
		return admission.InsertRow{Key: key, Priority: in.Priority, At: at, Seq: int64(i)}
	}
	// The K = 1 rule, for the keys read: every due row of them counts.
	var ones []admission.InsertRow
	var onesOf []int
	for i, r := range p.rows {
		if kr, ok := read[r.in.Key]; ok && !kr.gate && dueBy(r.in, now) {
			ones, onesOf = append(ones, waitRow(i, r.in.Key)), append(onesOf, i)
		}
	}
	oneBlocked := map[int]bool{}
	for j, b := range admission.InsertBlocked(ones, func(k string) admission.KeyState {
		return admission.KeyState{Busy: read[k].flag, Ready: read[k].n}
	}) {
		oneBlocked[onesOf[j]] = b
	}
	isGate := func(k string) bool { return read[k].gate }
	var waiting []admission.InsertRow
	var waitingOf []int
	for i, r := range p.rows {
		if len(r.in.Also) == 0 || !dueBy(r.in, now) || oneBlocked[i] {
			continue
		}
		if g := store.FirstGate(r.in.Key, r.in.Also, isGate); g != "" {
			waiting, waitingOf = append(waiting, waitRow(i, g)), append(waitingOf, i)
		}
	}
	lined := func(g string) bool { return read[g].lined }
	blocked := admission.InsertBlockedAtGate(waiting, func(g string) (int, bool) { return read[g].n, read[g].flag }, lined)
	gateBlocked := map[int]bool{}
	var gated, ahead []admission.InsertRow
	var gatedOf []int
	var gates []string
	for j, b := range blocked {
		if b {
			i := waitingOf[j]
			gateBlocked[i] = true
			first := ""
			if kr, ok := read[p.rows[i].in.Key]; ok && !kr.gate {
				first = p.rows[i].in.Key
			}
			gated, gatedOf, gates = append(gated, waitRow(i, first)), append(gatedOf, i), append(gates, waiting[j].Key)
		}
	}
	for j, r := range ones {
		if i := onesOf[j]; !oneBlocked[i] && !gateBlocked[i] {
			ahead = append(ahead, r)
		}
	}
	behind := admission.InsertBehindFirst(gated, gates, ahead, lined)
	for j, i := range gatedOf {
		r := &p.rows[i]
		if behind[j] {
			r.blockedIn = r.in.Key // blocked in its first key's line
			p.behind = append(p.behind, r.in.Key)
			continue
		}
		r.blockedIn = gates[j]
		p.gates = append(p.gates, gates[j])
	}
}

// dueBy reports whether in is due at now: no delay and no run_at after it.
func dueBy(in store.NewInstance, now time.Time) bool { return in.Delay <= 0 && !in.RunAt.After(now) }

func prepareInsert(instances []store.NewInstance) (*insertPlan, error) {
	if err := store.CheckBatchConflicts(instances); err != nil {
		return nil, fmt.Errorf("insert: %w", err)
	}
	p := &insertPlan{results: make([]store.InsertResult, len(instances))}
	for i, in := range instances {
		if err := store.NormalizeNewInstance(i, &in); err != nil {
			return nil, fmt.Errorf("insert: %w", err)
		}
		r := insertRow{idx: i, in: in}
		if in.UniqueKey != "" {
			r.scope = uniqueScope(in.UniqueStatuses)
			p.unique = true
		}
		p.results[i] = store.InsertResult{ID: in.ID}
		p.rows = append(p.rows, r)
	}
	return p, nil
}

// insertUnique drops the rows whose unique key is occupied (in their own
// scope) and inserts the rest. Inserts of the same unique key serialize on
// an advisory lock, so the check and the insert are atomic with respect to
// each other.
func (s *Store) insertUnique(ctx context.Context, q querier, p *insertPlan) error {
	var keys []string
	for _, r := range p.rows {
		if r.in.UniqueKey != "" {
			keys = append(keys, r.in.UniqueKey)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)

	holders := map[string]map[string]holder{} // unique key -> status -> its oldest holder
	var debounceKeys []string
	for _, r := range p.rows {
		if r.in.Debounce.Key != "" {
			debounceKeys = append(debounceKeys, r.in.UniqueKey)
		}
	}
	pending := map[string]string{} // debounce unique key -> its pending instance
	b := &pgx.Batch{}
	b.Queue(s.q(sqlUniqueLock), keys, s.uniqueSalt)
	if len(debounceKeys) > 0 {
		b.Queue(s.q(sqlDebouncePending), debounceKeys).Query(func(rows pgx.Rows) error {
			var k, id string
			_, err := pgx.ForEachRow(rows, []any{&k, &id}, func() error { pending[k] = id; return nil })
			return err
		})
	}
	b.Queue(s.q(sqlUniqueExisting), keys).Query(func(rows pgx.Rows) error {
		var k, st string
		var h holder
		_, err := pgx.ForEachRow(rows, []any{&k, &st, &h.id, &h.unclaimed}, func() error {
			if holders[k] == nil {
				holders[k] = map[string]holder{}
			}
			h.status = st
			holders[k][st] = h
			return nil
		})
		return err
	})
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("insert: unique keys: %w", refused(err))
	}

	// OnConflict's refusals come first, so that a refused batch applies
	// nothing (store.Store.Insert is all or none). A key that a row of the
	// batch cancels or replaces is in no other row of it
	// (store.CheckBatchConflicts).
	for _, r := range p.rows {
		if r.in.Debounce.Key != "" {
			continue
		}
		h, ok := holderIn(holders[r.in.UniqueKey], r.scope)
		if ok && (r.in.OnConflict == store.ConflictReplace && !h.pending() ||
			r.in.OnConflict == store.ConflictCancelOlder && h.terminal()) {
			return fmt.Errorf("insert: %w", store.NewConflictError(r.in.UniqueKey, h.id, contractStatus(h.status), r.in.OnConflict))
		}
	}

	kept := p.rows[:0:0]
	for _, r := range p.rows {
		if r.in.Debounce.Key != "" {
			if id, ok := pending[r.in.UniqueKey]; ok {
				done, err := s.debounce(ctx, q, id, r, p)
				if err != nil {
					return err
				}
				if done {
					continue
				}
			}
			// No pending instance (or it started meanwhile): this one is.
			kept = append(kept, r)
			continue
		}
		if k := r.in.UniqueKey; k != "" {
			if h, ok := holderIn(holders[k], r.scope); ok {
				switch r.in.OnConflict {
				case store.ConflictReplace:
					if err := s.replaceState(ctx, q, h, r, p); err != nil {
						return err
					}
					continue
				case store.ConflictCancelOlder:
					var now time.Time // the store's clock, as the insert's
					if at := s.clockNow(); at != nil {
						now = *at
					}
					if err := s.cancelIn(ctx, q, h.id, now); err != nil {
						return fmt.Errorf("insert: cancel the older holder of unique key %q: %w", k, err)
					}
					p.results[r.idx].Canceled = h.id
				default:
					p.results[r.idx] = store.InsertResult{ID: h.id, Duplicate: true}
					continue
				}
			}
			// A row inserted earlier in this batch holds the key as ready.
			mine := holder{id: r.in.ID, status: "ready", unclaimed: true}
			holders[k] = map[string]holder{"ready": mine, statusScheduled: mine}
		}
		kept = append(kept, r)
	}
	p.rows = kept
	if len(kept) == 0 {
		return nil
	}
	if err := s.blockAtGates(ctx, q, p); err != nil {
		return err
	}
	return s.runInsert(ctx, q, p)
}

// holder is the holder of a unique key an insert found (its stored
// status), or an earlier row of the batch.
type holder struct {
	id, status string
	unclaimed  bool // never claimed nor reserved (fence 0)
}

// pending reports whether h has not started (store.ConflictReplace).
func (h holder) pending() bool {
	return h.unclaimed && (h.status == "ready" || h.status == statusScheduled || h.status == "blocked")
}

func (h holder) terminal() bool { return contractStatus(h.status).Terminal() }

// contractStatus is the contract's name of a stored status.
func contractStatus(st string) store.Status {
	if st == statusScheduled {
		return store.StatusReady
	}
	return store.Status(st)
}

// replaceState gives holder h, which has not started, the state of r
// (store.ConflictReplace), and reports it as r's result.
func (s *Store) replaceState(ctx context.Context, q querier, h holder, r insertRow, p *insertPlan) error {
	var id string
	err := q.QueryRow(ctx, s.q(sqlReplaceState), h.id, jsonArg(r.in.State), s.clockNow()).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		// Its claim committed after the key's holders were read.
		return fmt.Errorf("insert: %w", store.NewConflictError(r.in.UniqueKey, h.id, store.StatusExecuting, r.in.OnConflict))
	}
	if err != nil {
		return fmt.Errorf("insert: replace the state of %s: %w", h.id, err)
	}
	p.results[r.idx] = store.InsertResult{ID: h.id, Replaced: true}
	return nil
}

// debounce replaces the state of pending instance id with r's and moves
// its start (sqlDebounce), and reports whether it did: false when the
// instance started since it was read.
func (s *Store) debounce(ctx context.Context, q querier, id string, r insertRow, p *insertPlan) (bool, error) {
	d := r.in.Debounce
	var got string
	err := q.QueryRow(ctx, s.q(sqlDebounce), id, jsonArg(r.in.State), micros(d.Period), micros(d.MaxWait), s.clockNow()).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("insert: debounce %q: %w", d.Key, err)
	}
	p.results[r.idx] = store.InsertResult{ID: id, Replaced: true}
	return true, nil
}

func holderIn(byStatus map[string]holder, scope []string) (holder, bool) {
	for _, st := range scope {
		if h, ok := byStatus[st]; ok {
			return h, true
		}
	}
	return holder{}, false
}

// runInsert inserts p.rows in one statement.
func (s *Store) runInsert(ctx context.Context, q querier, p *insertPlan) error {
	rows, err := q.Query(ctx, s.q(sqlInsert), s.insertArgs(p)...)
	if err == nil {
		err = scanInserted(rows, p)
	}
	if err != nil {
		return insertError(err)
	}
	return nil
}

// queueInsert queues the insert of p.rows on b, a batch of a transaction.
func (s *Store) queueInsert(b *pgx.Batch, p *insertPlan) {
	b.Queue(s.q(sqlInsert), s.insertArgs(p)...).Query(func(rows pgx.Rows) error {
		return scanInserted(rows, p)
	})
}

// afterInsert runs once a batch with block has committed: it notifies the
// queues that received ready rows (with wakeAfter), heals the busy keys
// that received blocked rows (healInserted) and marks hot the keys whose
// rows went in blocked behind their own first row, so that its outcome may
// hand its slot off (see recentKeys).
func (s *Store) afterInsert(ctx context.Context, p *insertPlan) {
	if p == nil {
		return
	}
	if p.wakeAfter {
		s.wakeAfterCommit(p.queues)
	}
	slices.Sort(p.behind)
	s.hot.mark(slices.Compact(p.behind)...) // one entry per key: the COPY path lists one per row
	slices.Sort(p.gates)
	s.hot.mark(slices.Compact(p.gates)...) // full: their holders' outcomes may hand their slots to these rows
	s.healInserted(ctx, p.blocked)
}

// scanInserted reads sqlInsert's rows: it fills p.queues, p.blocked and
// p.behind.
func scanInserted(rows pgx.Rows, p *insertPlan) error {
	var q, k string
	var n int64
	_, err := pgx.ForEachRow(rows, []any{&q, &n, &k}, func() error {
		switch {
		case k == "":
			p.queues = append(p.queues, q)
		case n == 1:
			p.blocked = append(p.blocked, k)
		default:
			p.behind = append(p.behind, k)
		}
		return nil
	})
	return err
}

func (s *Store) insertArgs(p *insertPlan) []any {
	rows, block := p.rows, p.block
	channel := s.channel
	if p.wakeAfter {
		channel = "" // notified after the commit (afterInsert)
	}
	n := len(rows)
	var (
		ids       = make([]string, n)
		workflows = make([]string, n)
		versions  = make([]int32, n)
		queues    = make([]string, n)
		prios     = make([]int32, n)
		steps     = make([]string, n)
		states    = make([]*string, n)
		keys      = make([]string, n)
		intents   = make([]string, n)
		runAts    = make([]*time.Time, n)
		uniques   = make([]string, n)
		scopes    = make([]string, n)
		parents   = make([]*string, n)
		joinGens  = make([]int32, n)
		delays    = make([]int64, n)
		extras    = make([]string, n)
		atGates   = make([]string, n)
		atIntents = make([]string, n)
	)
	for i, r := range rows {
		in := r.in
		ids[i], workflows[i], versions[i], queues[i] = in.ID, in.Workflow, int32(in.Version), in.Queue
		prios[i], steps[i], states[i] = int32(in.Priority), in.Step, jsonArg(in.State)
		keys[i], intents[i], runAts[i] = in.Key, string(in.KeyIntent), tsPtr(in.RunAt)
		uniques[i], scopes[i] = in.UniqueKey, joinScope(r.scope)
		if in.ParentID != "" {
			parents[i] = &in.ParentID
		}
		joinGens[i] = int32(r.joinGen)
		delays[i] = micros(in.Delay)
		extras[i] = keysText(in.Also)
		if r.blockedIn != "" {
			w := in
			waitIn(&w, r.blockedIn)
			extras[i], atGates[i], atIntents[i] = keysText(w.Also), w.Key, string(w.KeyIntent)
		}
	}
	return []any{ids, workflows, versions, queues, prios, steps, states, keys, intents, runAts,
		uniques, scopes, parents, channel, joinGens, delays, s.clockNow(), block, admission.ReadyCap, extras, atGates, atIntents}
}

func insertError(err error) error {
	if code, constraint := pgCode(err); code == codeUniqueViolation {
		return fmt.Errorf("insert: %w (%s)", store.ErrDuplicate, constraint)
	}
	return fmt.Errorf("insert: %w", refused(err))
}

var _ store.TxInserter = (*Store)(nil)
