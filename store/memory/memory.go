// Package memory is an in-memory store.Store with the same semantics as the
// PostgreSQL backend (the conformance suite in store/storetest proves it). It
// backs durabletest and lets the examples run with no database.
//
// Everything sits behind one mutex, so every method is atomic. Iteration
// never depends on Go map order: results, promotions and notifications are
// ordered by admission order, insertion order or id, so the same sequence of
// calls always gives the same result.
//
// The admission rules live in admission.go; outcomes and signals in
// outcome.go; timers, reaping and reconciling in maintenance.go.
package memory

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
)

// Options configures a Store.
type Options struct {
	// Clock is the store's clock, used whenever a method is given a zero
	// time (and for insert and signal timestamps). Default: time.Now.
	Clock func() time.Time
}

// Store is an in-memory store.Store and store.Notifier. The zero value is
// not usable; call New.
type Store struct {
	mu     sync.Mutex
	clock  func() time.Time
	closed bool

	seq        int64 // insertion order of rows
	nextSignal int64
	limits     gate.Limits
	rates      gate.RateLimits
	// limitOwner and rateOwner name the namespace owning each limit.
	limitOwner map[string]string
	rateOwner  map[string]string
	buckets    map[string]gate.Bucket // rate bucket id -> state
	// liveChanges are the last syncs, per key name, that changed the
	// semantics of live keys (see store.Health).
	liveChanges map[string]liveChange
	leases      map[string]lease                   // named leases (AcquireLease)
	policies    map[string]store.ConcurrencyPolicy // queue -> policy
	schedules   map[string]store.Schedule          // name -> schedule
	worked      map[string]time.Time               // queue -> last worked (MarkQueuesWorked)
	paused      map[string]time.Time               // queue -> when it was paused (PauseQueue)

	rows      map[string]*row
	queues    map[string]*queueState
	keys      map[string]*keyState
	executing map[string]*row
	// reserved holds the successor reservations (see reserve.go).
	reserved map[string]*row
	unique   map[string]map[string]*row // unique key -> rows carrying it
	children map[string][]*row          // parent id -> children, creation order
	signals  map[int64]*signal

	listeners    map[int64]func(store.Notification)
	nextListener int64

	// freeing collects the slots freed while a Complete that may hand them
	// off applies its outcomes (nil otherwise: slots free at once).
	freeing *[]admission.Freed
	// readied collects the rows a Complete's outcomes make ready and due
	// (nil outside a Complete): they take their rounds together once the
	// batch is applied, as admission.Rounds decides for rows made ready
	// together, whatever the order of the outcomes.
	readied *[]*row
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Notifier  = (*Store)(nil)
	_ store.HandOffer = (*Store)(nil)
)

// New returns an empty store.
func New(opts Options) *Store {
	clock := opts.Clock
	if clock == nil {
		clock = time.Now
	}
	limits, _ := gate.NewLimits(nil)
	rates, _ := gate.NewRateLimits(nil)
	return &Store{
		clock:       clock,
		limits:      limits,
		rates:       rates,
		limitOwner:  map[string]string{},
		rateOwner:   map[string]string{},
		buckets:     map[string]gate.Bucket{},
		liveChanges: map[string]liveChange{},
		leases:      map[string]lease{},
		policies:    map[string]store.ConcurrencyPolicy{},
		schedules:   map[string]store.Schedule{},
		paused:      map[string]time.Time{},
		rows:        map[string]*row{},
		queues:      map[string]*queueState{},
		keys:        map[string]*keyState{},
		executing:   map[string]*row{},
		reserved:    map[string]*row{},
		unique:      map[string]map[string]*row{},
		children:    map[string][]*row{},
		signals:     map[int64]*signal{},
		listeners:   map[int64]func(store.Notification){},
	}
}

// lease is the holder of a named lease and when it expires.
type lease struct {
	holder  string
	expires time.Time
}

// liveChange is a limit sync that changed the semantics of live keys.
type liveChange struct {
	w  gate.Warning
	at time.Time
}

// row is one instance and its place in the indexes.
type row struct {
	inst           store.Instance
	seq            int64
	uniqueStatuses []store.Status
	inbox          []*signal // in id order
	dedup          map[string]bool
	// wake is the signal that woke the row from its await; it is handed to
	// every claim until an outcome commits, so a stale run redelivers it.
	wake     *signal
	timedOut bool
	history  []store.HistoryEntry
	// spawns counts the row's spawn outcomes; a child joins its parent only
	// for the spawn that inserted it (joinGen), so a child of an earlier
	// spawn (the parent was canceled and retried meanwhile) never counts
	// off a later spawn's join.
	spawns  int
	joinGen int
	// round is the row's turn among the keys of its queue and priority
	// (valid when hasRound; see store.Store, Order).
	round    int64
	hasRound bool
	// passed is set on an executing row whose slot an outcome passed to
	// its successor (see succeed): leaving executing frees nothing.
	passed bool
	// blockedOn is, for a row of several keys, the key that last blocked
	// it since it was last claimed (see waitsOn): its blocked heap holds it
	// while it is blocked, and once promoted it stays in that key's line
	// until a claim takes it.
	blockedOn string

	pickHeap  *rowHeap // a queue's ready or scheduled heap, or a key's blocked heap
	pickIdx   int
	timerHeap *rowHeap // the queue's await-timeout heap
	timerIdx  int
}

type signal struct {
	sig      store.Signal
	consumed bool
}

// queueState indexes the due ready rows of a queue by priority (each heap
// in round, run_at, insertion order), its ready rows whose run time is in
// the future (the "scheduled" rows of the PostgreSQL backend), its awaits by
// timeout, and counts its executing rows for its ConcurrencyPolicy.
type queueState struct {
	ready     map[int]*rowHeap
	prios     []int // sorted keys of ready
	scheduled *rowHeap
	timers    *rowHeap
	executing int
	keyExec   map[string]int // executing rows per key
}

// keyState is what the store knows about one concurrency key.
type keyState struct {
	key       string
	rows      map[string]*row // non-terminal rows carrying the key, in any place
	executing int             // executing rows carrying the key
	blocked   *rowHeap        // blocked rows, admission order
	counters  []counter       // gate slot counters (nil: none stored)
}

// counter is one shard of a gate key's slots. available is below zero
// while the shard owes slots to rows admitted before its limit was lowered.
type counter struct {
	capacity  int
	available int
}

func (s *Store) now(t time.Time) time.Time {
	if t.IsZero() {
		return s.clock()
	}
	return t
}

// lock takes the mutex and fails if the store is closed.
func (s *Store) lock() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.ErrClosed
	}
	return nil
}

func (s *Store) queue(name string) *queueState {
	q := s.queues[name]
	if q == nil {
		q = &queueState{ready: map[int]*rowHeap{}, scheduled: newSchedHeap(), timers: newTimerHeap(), keyExec: map[string]int{}}
		s.queues[name] = q
	}
	return q
}

func (s *Store) key(k string) *keyState {
	ks := s.keys[k]
	if ks == nil {
		ks = &keyState{key: k, rows: map[string]*row{}, blocked: newPickHeap()}
		s.keys[k] = ks
	}
	return ks
}

// dropKeyIfIdle forgets a key that has nothing left to remember.
func (s *Store) dropKeyIfIdle(k string) {
	ks := s.keys[k]
	if ks != nil && len(ks.rows) == 0 && ks.executing == 0 && ks.blocked.Len() == 0 && ks.counters == nil {
		delete(s.keys, k)
	}
}

// HoldsSeveralKeys reports that the store holds several concurrency keys
// per instance (store.SeveralKeys).
func (s *Store) HoldsSeveralKeys() bool { return true }

// keys returns every concurrency key of r: its Key, then its Also.
func (r *row) keys() []string { return r.inst.KeyList() }

// multi reports whether r has several keys.
func (r *row) multi() bool { return len(r.inst.Also) > 0 }

// otherKeys are the keys of r after its first (nil for one key).
func (r *row) otherKeys() []string {
	var out []string
	for _, o := range r.inst.Also {
		out = append(out, o.Key)
	}
	return out
}

// shardOf is the gate shard executing row r debited of its key k (-1:
// none).
func (r *row) shardOf(k string) int {
	if k == r.inst.Key {
		return r.inst.KeyShard
	}
	for i, a := range r.inst.Also {
		if a.Key == k && i < len(r.inst.AlsoShards) {
			return r.inst.AlsoShards[i]
		}
	}
	return -1
}

// waitsOn is the key in whose line waiting row r is (the blocked heap of
// that key while r is blocked): its Key, or for a row of several keys the
// key that last blocked it, if one has since its last claim.
func (r *row) waitsOn() string {
	if r.multi() && r.blockedOn != "" {
		return r.blockedOn
	}
	return r.inst.Key
}

// inLineOf reports whether waiting row r (ready or blocked) is in key k's
// line: every row of one key is in its key's; a row of several keys is in
// the line of the key it waits on (waitsOn), which the PostgreSQL store
// keeps in the row's key column.
func (r *row) inLineOf(k string) bool {
	return !r.multi() || r.waitsOn() == k
}

// block puts blocked row r in the blocked heap of the key it waits on.
func (s *Store) block(r *row) {
	r.inst.Status = store.StatusBlocked
	s.key(r.waitsOn()).blocked.add(r)
}

// attachKey records r as a holder-or-waiter of each of its keys
// (non-terminal rows).
func (s *Store) attachKey(r *row) {
	for _, k := range r.keys() {
		s.key(k).rows[r.inst.ID] = r
	}
}

func (s *Store) detachKey(r *row) {
	for _, k := range r.keys() {
		if ks := s.keys[k]; ks != nil {
			delete(ks.rows, r.inst.ID)
			s.dropKeyIfIdle(k)
		}
	}
}

// setReady makes r ready at runAt with a fresh round (see store.Store,
// Order): on its queue's scheduled heap when runAt is after now (the round
// is given when it falls due), else on the pick path.
func (s *Store) setReady(r *row, runAt, now time.Time, n *notes) {
	r.hasRound = false
	s.place(r, runAt, now, n)
}

// requeue makes r ready again in its place: its run_at and round are kept
// (a promoted blocked row, a released or reaped claim).
func (s *Store) requeue(r *row, now time.Time, n *notes) {
	s.place(r, r.inst.RunAt, now, n)
}

// place puts r on its queue's scheduled heap when runAt is after now, else
// on the pick path, with a round if it has none.
func (s *Store) place(r *row, runAt, now time.Time, n *notes) {
	r.inst.Status = store.StatusReady
	r.inst.RunAt = runAt
	q := s.queue(r.inst.Queue)
	n.add(r.inst.Queue)
	if runAt.After(now) {
		q.scheduled.add(r)
		return
	}
	if !r.hasRound {
		s.assignRounds([]*row{r})
	}
	s.pushReady(q, r)
}

// pushReady puts a due row that has its round on its queue's pick path.
func (s *Store) pushReady(q *queueState, r *row) {
	h := q.ready[r.inst.Priority]
	if h == nil {
		h = newReadyHeap()
		q.ready[r.inst.Priority] = h
		i, _ := slices.BinarySearch(q.prios, r.inst.Priority)
		q.prios = slices.Insert(q.prios, i, r.inst.Priority)
	}
	h.add(r)
}

// scheduled reports whether r is a ready row waiting for its run time.
func (r *row) scheduled() bool { return r.pickHeap != nil && r.pickHeap.sched }

// onPickPath reports whether r is ready and due: on its queue's pick path,
// where a claim can take it.
func (r *row) onPickPath() bool {
	return r.inst.Status == store.StatusReady && r.pickHeap != nil && !r.pickHeap.sched
}

// unpick takes r off whatever pick heap (ready or blocked) and timer heap it is on.
func (s *Store) unpick(r *row) {
	if r.pickHeap != nil {
		r.pickHeap.remove(r)
	}
	if r.timerHeap != nil {
		r.timerHeap.remove(r)
	}
}

// notes collects the queues to notify, and the executing instances whose
// cancel was requested, once the mutex is released.
type notes struct{ queues, canceled []string }

func (n *notes) add(q string) {
	if !slices.Contains(n.queues, q) {
		n.queues = append(n.queues, q)
	}
}

// unlock releases the mutex, then tells listeners about n.
func (s *Store) unlock(n *notes) {
	var fns []func(store.Notification)
	if n != nil && len(n.queues)+len(n.canceled) > 0 && len(s.listeners) > 0 {
		ids := make([]int64, 0, len(s.listeners))
		for id := range s.listeners {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			fns = append(fns, s.listeners[id])
		}
	}
	s.mu.Unlock()
	if len(fns) == 0 {
		return
	}
	qs := slices.Clone(n.queues)
	slices.Sort(qs)
	for _, fn := range fns {
		for _, id := range n.canceled {
			fn(store.Notification{Canceled: id})
		}
		for _, q := range qs {
			fn(store.Notification{Queue: q})
		}
	}
}

// Listen registers fn and returns at once; fn is called with a queue name
// after every insert, signal wake-up, freed slot that made a row ready, ready
// outcome or fired timer in that queue, and with an instance id when the
// cancel of an executing instance is requested, until ctx is done. fn runs
// on the goroutine of the store call that caused it, after the store's lock
// is released; it must not block.
func (s *Store) Listen(ctx context.Context, fn func(store.Notification)) error {
	if err := s.lock(); err != nil {
		return err
	}
	s.nextListener++
	id := s.nextListener
	s.listeners[id] = fn
	s.mu.Unlock()
	context.AfterFunc(ctx, func() {
		s.mu.Lock()
		delete(s.listeners, id)
		s.mu.Unlock()
	})
	fn(store.Notification{}) // listening from now on
	return nil
}

// Close marks the store closed: every later call returns store.ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.listeners = map[int64]func(store.Notification){}
	return nil
}

// snapshot copies the instance so callers never alias store memory.
func (r *row) snapshot() store.Instance {
	in := r.inst
	in.State = cloneJSON(in.State)
	in.Result = cloneJSON(in.Result)
	in.Also = slices.Clone(in.Also)
	in.AlsoShards = nil
	if in.Status == store.StatusExecuting && r.multi() {
		in.AlsoShards = slices.Clone(r.inst.AlsoShards)
	}
	if in.Status == store.StatusBlocked {
		in.BlockedOn = r.waitsOn()
	}
	return in
}

func cloneJSON(m json.RawMessage) json.RawMessage {
	if m == nil {
		return nil
	}
	return slices.Clone(m)
}

func (sg *signal) snapshot() *store.Signal {
	c := sg.sig
	c.Payload = cloneJSON(c.Payload)
	return &c
}

// validJSON rejects payloads that are not valid JSON: a jsonb column would
// refuse them too.
func validJSON(what string, m json.RawMessage) error {
	if m == nil {
		return nil
	}
	if !json.Valid(m) {
		return fmt.Errorf("%w: %s is not valid JSON", store.ErrInvalid, what)
	}
	return nil
}
