// Package admission decides which rows of a claim's window are admitted,
// in one pure function that a store calls between reading (and locking) the
// state of the window's keys and writing the outcome. The rules are the
// store package's (see store.Store, Admission); this package is where they
// are decided, so that every backend decides them the same way: Decide
// takes the window and the State read for it and returns the Plan.
//
// Decide does no I/O and reads no clock: everything it needs (the claim's
// now, the locks the claimer got, the counters and buckets as read) is in
// its arguments, and everything it decides (admitted rows and their shards,
// blocked rows, rescheduled rows, debits, buckets) is in its result.
package admission

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/godurable/godurable/gate"
)

// Candidate is a ready row of the window, in claim order.
type Candidate struct {
	// ID is the row's id.
	ID string
	// Key is the row's concurrency key ("" for none).
	Key string
	// Gate is the limit of the key's name; nil means K = 1 (when Key is set).
	// Every candidate of one key carries the same limit.
	Gate *gate.Limit
	// Rate is the rate limit of the key's name (nil: none).
	Rate *gate.RateLimit
	// Also are the row's other keys (see Need), when it has several: it is
	// admitted only when each of them admits it too.
	Also []Need
}

// Need is one more key a row needs besides its Candidate.Key, with the
// limits of that key, given as for Candidate.Key.
type Need struct {
	Key  string
	Gate *gate.Limit
	Rate *gate.RateLimit
}

// needs returns every key of c with its limits, in key order (the order
// in which a row's keys are decided, whatever the order of Also), in buf
// (reused from row to row) when they fit.
func (c Candidate) needs(buf []Need) []Need {
	ns := append(buf[:0], Need{Key: c.Key, Gate: c.Gate, Rate: c.Rate})
	if len(c.Also) == 0 {
		return ns
	}
	ns = append(ns, c.Also...)
	slices.SortFunc(ns, func(a, b Need) int { return cmp.Compare(a.Key, b.Key) })
	return ns
}

// Counter is one slot counter of a gate key: a shard with its capacity and
// how many of its slots are free (negative when the shard is in debt after
// its limit was lowered).
type Counter struct {
	Shard, Capacity, Available int
}

// GateState is what a claimer read of a gate key's counters.
type GateState struct {
	// Counters are the counters this claimer locked (or, with
	// HeldElsewhere, read), in shard order.
	Counters []Counter
	// HeldElsewhere is true when the claimer holds the locks of only some
	// of the key's counters, or of none: another transaction holds the
	// others, or the claimer read them all without locks and debits them
	// only if they have not changed (an optimistic claim: see the
	// PostgreSQL store). Count is then how many counters the key has in
	// all. Such a key's rows are admitted only on counters as its limit
	// makes them, each within its own capacity, and are never blocked.
	HeldElsewhere bool
	Count         int
}

// Policy is a queue's concurrency policy.
type Policy struct {
	// MaxActive is the most rows of the queue executing at once.
	MaxActive int
	// MaxActivePerKey, when positive, is the most rows of one key
	// executing at once in the queue.
	MaxActivePerKey int
}

// State is what a claimer read, under its locks, about the window's keys
// and its queue.
type State struct {
	// Now is the claim's now: buckets are refilled to it.
	Now time.Time
	// Limit is the most rows the claim admits.
	Limit int
	// Locked holds the K = 1 keys whose lock this claimer holds; a K = 1
	// key not in it is held by another transaction.
	Locked map[string]bool
	// Busy holds the K = 1 keys with an executing row.
	Busy map[string]bool
	// InSight counts, per K = 1 key, the ready rows of the key the claimer
	// looks at (nil: the window's rows of the key), the row being decided
	// included.
	InSight map[string]int
	// Gates holds the state of each gate key of the window.
	Gates map[string]GateState
	// Policy is the queue's policy (nil: none). Active is how many rows of
	// the queue execute and KeyActive how many of each key do in the queue
	// (read only when the policy has a MaxActivePerKey).
	Policy    *Policy
	Active    int
	KeyActive map[string]int
	// Buckets are the rate buckets of the window as read (a missing bucket
	// is full).
	Buckets map[string]gate.Bucket
	// Rescheduled counts the rows of each bucket the claim has already
	// rescheduled for want of a token, for a store that decides its claim
	// row by row (nil: none): the next such row waits for one more token.
	Rescheduled map[string]int
	// Reserve, when positive, asks for up to that many successors for each
	// row the plan admits of a key it leaves full (Plan.Reserved).
	Reserve int
}

// Admitted is a row the plan admits, with the gate shard it debits (-1:
// none) and, for a row with several keys, what it holds of each of its
// other keys, in the order of its Candidate.Also.
type Admitted struct {
	ID    string
	Shard int
	Also  []Hold
}

// Hold is what an admitted row holds of one of its keys: the gate shard it
// debits, or -1 for a K = 1 key.
type Hold struct {
	Key   string
	Shard int
}

// Throttled is a row that found its bucket empty, rescheduled to RunAt (it
// keeps its place in its round).
type Throttled struct {
	ID    string
	RunAt time.Time
}

// ShardKey names one counter: a gate key and a shard.
type ShardKey struct {
	Key   string
	Shard int
}

// Plan is what admission decided for a window.
type Plan struct {
	// Admitted are the admitted rows, in claim order.
	Admitted []Admitted
	// Blocked are the rows whose key (or per-key budget) is full, in claim
	// order: they leave the pick path.
	Blocked []string
	// BlockedOn names, for each blocked row with several keys, the key
	// that blocked it (nil when there is none): the row waits for that
	// key to free a slot. A row with one key waits for it.
	BlockedOn map[string]string
	// Saturated are the keys found full, sorted.
	Saturated []string
	// Backlog are the Saturated keys of which the plan admitted no row,
	// sorted: their backlog beyond the window is blocked too. A claim
	// that fills a key leaves that to the next claim that finds the key
	// full, so that the rows it admits do not wait for the writes: the
	// first claim of the peers' util run (a gate of 5 over 500 rows)
	// blocked about 300 rows beyond its window in 5 of its 31 ms, while
	// the rows it admitted waited for its commit.
	Backlog []string
	// Roomy are the gate keys of which the plan admitted rows and left
	// slots free, all their counters locked (not HeldElsewhere), sorted:
	// keys not full, whatever a claim found of them before.
	Roomy []string
	// Unsettled are the gate keys with counters held elsewhere (see
	// GateState.HeldElsewhere) of which a row was left ready because no
	// counter it read had room, or its counters were not as its limit
	// makes them, sorted: a claim that locks them all can tell whether to
	// block their rows.
	Unsettled []string
	// Reserved are, with State.Reserve, rows of the window reserved as
	// successors of the admitted rows of keys the plan leaves full (see
	// Decide), in the order they are to run after their row. They are not
	// in Blocked.
	Reserved []Reservation
	// Throttled are the rows rescheduled for want of a token, in claim order.
	Throttled []Throttled
	// Rescheduled counts, when the plan throttled a row, the rows of each
	// bucket rescheduled for want of a token: State.Rescheduled's and this
	// plan's (a row refused by several buckets counts in each).
	Rescheduled map[string]int
	// Debits counts the slots taken from each counter.
	Debits map[ShardKey]int
	// Buckets are the buckets tokens were taken from, as they now are.
	Buckets map[string]gate.Bucket
}

// Decide walks the window in claim order and admits each row that every
// limit admits, debiting them only then:
//
//   - a row without a key needs nothing of its own;
//   - a K = 1 key needs this claimer to hold its lock (otherwise the row is
//     left ready) and no executing row; the key's further rows are blocked,
//     unless the row is the only one of its key in sight (see
//     State.InSight): then it is left ready, since the key's holder will
//     likely have ended by the next claim, and blocking it would cost it a
//     promotion (a write, and the flush's statement that makes it);
//   - a gate key needs a shard with a free slot (the one with the most, the
//     first on ties) while its slots in use are below its limit, and is
//     blocked otherwise; when another transaction holds some of its
//     counters, it may use the locked shards if the key's shards are clean
//     (see CleanShards), and is otherwise left ready, never blocked;
//   - a keyed row is blocked while its key has MaxActivePerKey rows
//     executing in the queue, admitted ones included;
//   - rows are left ready once the claim's Limit, or the queue's MaxActive,
//     is reached;
//   - a rate-limited key needs a token in its bucket refilled to Now; the
//     i-th row of a bucket refused one is rescheduled to when the bucket
//     holds i tokens.
//
// With st.Reserve, the rows it would block of a key it admitted rows of
// and found full are reserved instead, up to st.Reserve for each admitted
// row of the key, dealt to those rows in turn (the first admitted row
// takes the key's first blocked row, the second the next, and so on, so
// that with steps of one length they run in the key's order). A
// reservation runs in its row's slot once that row's step ends (see
// store.Claimed.After), as a hand-off's does (see Free), and under the same
// rule: the queue has no policy, the key no rate limit, and the row is in
// turn, which here means that no row before it in the window was left
// ready (the window is in claim order: a row left ready before it, of
// another key or of none, may be of an earlier round). The first row of a
// key that cannot be reserved ends the key's reservations.
//
// A row with several keys (Candidate.Also) is admitted only when every
// one of its keys, its per-key budgets and its rate limits admit it, and
// debits none of them otherwise. Its keys are decided in key order: it is
// blocked on the first that is full (Plan.BlockedOn), else left ready if
// one of them leaves it ready, so that the key it waits for is one whose
// state the claimer holds. The rule that leaves a K = 1 key's only row in
// sight ready applies to a row of several keys only for the key in its
// key column (Candidate.Key), the line it waits in: the freeing of a key
// finds a ready row by its key column alone, so a row is blocked on a
// busy K = 1 key it holds as another key, and woken by that key. It
// takes a token of each of its rated keys'
// buckets (one of a bucket that two of its keys share), and a row refused
// by one bucket is rescheduled to when every one of them has its token.
// A claim reserves no row with several keys and gives such a row no
// successor (Deal): a key's line stops at such a row blocked on it. A
// hand-off may (see Free).
//
// Decide does not modify st.
func Decide(window []Candidate, st State) Plan {
	d := newDecider(window, st)
	for i, c := range window {
		d.leftReady = len(d.plan.Admitted)+len(d.plan.Blocked)+len(d.plan.Throttled) < i
		d.decide(c)
	}
	return d.finish()
}

// decider is Decide's state as it walks the window: the counters and
// buckets as debited so far, and what it found of each key.
type decider struct {
	st   State
	plan Plan
	// counters are the gate keys' counters, debited as rows are admitted.
	counters map[string][]Counter
	// inUse is a gate key's slots in use, over all its counters: a claim
	// admits only while this is below the limit, whatever the shard
	// counters say (after a limit is lowered or re-sharded, shards may hold
	// more than the new limit gives them until their rows finish).
	inUse     map[string]int
	buckets   map[string]gate.Bucket
	taken     map[string]bool // K = 1 keys admitted by this plan
	keyTaken  map[string]int  // rows of each key admitted by this plan
	waiting   map[string]int  // rows of each bucket rescheduled by this claim
	saturated map[string]bool
	unsettled map[string]bool
	gateLimit map[string]int // gate keys of the window whose counters are all locked -> limit
	inSight   func(k string) int
	// admittedKey is the key of each admitted row ("" for none, or for a
	// row of several keys, which takes no reservation).
	admittedKey []string
	// leftReady is true once a row of the window was left ready: the rows
	// after it are not in turn.
	leftReady bool
	// line holds each full key's blocked rows that may be reserved, in
	// order; stopped the keys whose line a row of several keys stopped.
	line    map[string][]string
	stopped map[string]bool
	// The row being decided: its keys (see needs), the shard each would
	// debit, and its buckets, in buffers reused from row to row, so that
	// a window of rows of one key allocates nothing per row.
	needBuf  [4]Need
	bestBuf  [4]int
	tokenBuf [4]token
}

// token is a bucket a row takes a token of, with its rate limit.
type token struct {
	bucket string
	rate   *gate.RateLimit
}

func newDecider(window []Candidate, st State) *decider {
	d := &decider{st: st, counters: map[string][]Counter{}, inUse: map[string]int{},
		buckets: map[string]gate.Bucket{}, taken: map[string]bool{}, keyTaken: map[string]int{},
		waiting: map[string]int{}, saturated: map[string]bool{}, unsettled: map[string]bool{},
		gateLimit: map[string]int{}}
	for k, g := range st.Gates {
		d.counters[k] = slices.Clone(g.Counters)
		for _, c := range g.Counters {
			d.inUse[k] += c.Capacity - c.Available
		}
	}
	maps.Copy(d.waiting, st.Rescheduled)
	d.inSight = func(k string) int { return st.InSight[k] }
	if st.InSight == nil {
		inWindow := map[string]int{}
		for _, c := range window {
			inWindow[c.Key]++
			for _, n := range c.Also {
				inWindow[n.Key]++
			}
		}
		d.inSight = func(k string) int { return inWindow[k] }
	}
	d.plan.Debits = map[ShardKey]int{}
	d.plan.Buckets = map[string]gate.Bucket{}
	if n := min(len(window), st.Limit); n > 0 {
		d.plan.Admitted = make([]Admitted, 0, n)
	}
	return d
}

// verdict is what one key of a row finds.
type verdict int

const (
	admits     verdict = iota // the key admits the row
	isFull                    // the key is full: the row is blocked on it
	leaveReady                // the row is left ready
	unsettles                 // the row is left ready, and the key is Unsettled
)

// room decides key n of a row whose key column, the line it waits in, is
// line, without debiting: the index in its counters of the shard a gate
// key would debit (-1: none), and the verdict.
func (d *decider) room(n Need, line string) (best int, v verdict) {
	switch {
	case n.Key == "":
		return -1, admits
	case n.Gate == nil:
		if !d.st.Locked[n.Key] {
			return -1, leaveReady // another claim or an outcome holds the key
		}
		if d.st.Busy[n.Key] || d.taken[n.Key] {
			if n.Key == line && d.inSight(n.Key) < 2 {
				return -1, leaveReady // its key's only row in sight, in that key's line
			}
			return -1, isFull
		}
		return -1, admits
	}
	lim := *n.Gate
	rows := d.counters[n.Key]
	g := d.st.Gates[n.Key]
	held := g.HeldElsewhere
	if !held {
		d.gateLimit[n.Key] = lim.Limit
	}
	if held && !CleanShards(lim, rows, g.Count) {
		return -1, unsettles // mid re-shard with a counter held elsewhere
	}
	// With every counter locked, the slots in use over all of them must be
	// below the limit; with some held elsewhere the shards are clean (their
	// capacities add up to the limit), so each locked shard's own capacity
	// bounds it.
	best = -1
	if held || d.inUse[n.Key] < lim.Limit {
		best = pickShard(lim, rows)
	}
	switch {
	case best >= 0:
		return best, admits
	case held:
		// The holder may be freeing a slot, and its promotion may not see
		// a row blocked now.
		return -1, unsettles
	}
	return -1, isFull
}

// decide admits, blocks, throttles or leaves ready row c.
func (d *decider) decide(c Candidate) {
	needs := c.needs(d.needBuf[:])
	multi := len(needs) > 1
	best := d.bestBuf[:0]
	for range needs {
		best = append(best, -1)
	}
	var blockedOn, leftOn string
	var unsettled []string // keys that left the row ready and are Unsettled
	for i, n := range needs {
		var v verdict
		best[i], v = d.room(n, c.Key)
		switch v {
		case isFull:
			if blockedOn == "" {
				blockedOn = n.Key
			}
		case unsettles:
			unsettled = append(unsettled, n.Key)
			fallthrough
		case leaveReady:
			if leftOn == "" {
				leftOn = n.Key
			}
		}
	}
	switch {
	case blockedOn != "":
		d.block(c, blockedOn, multi)
		d.saturated[blockedOn] = true
		return
	case leftOn != "":
		for _, k := range unsettled {
			d.unsettled[k] = true
		}
		return
	}
	// The queue's budgets.
	if p := d.st.Policy; p != nil && p.MaxActivePerKey > 0 {
		for _, n := range needs {
			if n.Key != "" && d.st.KeyActive[n.Key]+d.keyTaken[n.Key] >= p.MaxActivePerKey {
				d.block(c, n.Key, multi)
				return
			}
		}
	}
	if len(d.plan.Admitted) >= d.st.Limit || (d.st.Policy != nil && d.st.Active+len(d.plan.Admitted) >= d.st.Policy.MaxActive) {
		return // full: the row stays ready
	}
	// The rate limits: a token of each bucket, or none of any.
	tokens := d.tokenBuf[:0]
	var due time.Time
	refused := false
	for _, n := range needs {
		if n.Rate == nil {
			continue
		}
		b := n.Rate.BucketFor(n.Key)
		if slices.ContainsFunc(tokens, func(t token) bool { return t.bucket == b }) {
			continue
		}
		tokens = append(tokens, token{b, n.Rate})
		bk, ok := d.buckets[b]
		if !ok {
			bk, ok = d.st.Buckets[b]
			if !ok {
				bk = n.Rate.Full(d.st.Now)
			}
		}
		bk = n.Rate.Refill(bk, d.st.Now)
		d.buckets[b] = bk
		if n.Rate.Tokens(bk) < 1 {
			refused = true
			d.waiting[b]++
			if at := n.Rate.Due(bk, d.waiting[b]); at.After(due) {
				due = at
			}
		}
	}
	if refused {
		d.plan.Throttled = append(d.plan.Throttled, Throttled{ID: c.ID, RunAt: due})
		return
	}
	// Every limit admits the row: debit them all. best then holds the
	// shard each key debits (-1: none).
	for i, n := range needs {
		switch {
		case n.Key == "":
			continue
		case n.Gate == nil:
			d.taken[n.Key] = true
		default:
			rows := d.counters[n.Key]
			rows[best[i]].Available--
			d.inUse[n.Key]++
			best[i] = rows[best[i]].Shard
			d.plan.Debits[ShardKey{n.Key, best[i]}]++
		}
		d.keyTaken[n.Key]++
	}
	for _, t := range tokens {
		bk := d.buckets[t.bucket]
		bk.Credit -= t.rate.TokenCredit()
		d.buckets[t.bucket], d.plan.Buckets[t.bucket] = bk, bk
	}
	a := Admitted{ID: c.ID, Shard: best[0]}
	if multi {
		shardOf := func(k string) int { return best[slices.IndexFunc(needs, func(n Need) bool { return n.Key == k })] }
		a.Shard = shardOf(c.Key)
		for _, n := range c.Also {
			a.Also = append(a.Also, Hold{Key: n.Key, Shard: shardOf(n.Key)})
		}
	}
	d.plan.Admitted = append(d.plan.Admitted, a)
	if multi {
		d.admittedKey = append(d.admittedKey, "")
	} else {
		d.admittedKey = append(d.admittedKey, c.Key)
	}
}

// block blocks row c on key k. A row of one key is a candidate reservation
// while it is in turn (see Decide); a row of several stops k's line, so
// that no later row of k is reserved ahead of it.
func (d *decider) block(c Candidate, k string, multi bool) {
	d.plan.Blocked = append(d.plan.Blocked, c.ID)
	if multi {
		if d.plan.BlockedOn == nil {
			d.plan.BlockedOn, d.stopped = map[string]string{}, map[string]bool{}
		}
		d.plan.BlockedOn[c.ID] = k
		d.stopped[k] = true
		return
	}
	if d.st.Reserve > 0 && d.st.Policy == nil && !d.leftReady && c.Rate == nil && !d.stopped[k] {
		if d.line == nil {
			d.line = map[string][]string{}
		}
		d.line[k] = append(d.line[k], c.ID)
	}
}

// finish completes the plan once every row is decided.
func (d *decider) finish() Plan {
	plan := d.plan
	plan.reserve(d.admittedKey, d.line, d.st.Reserve)
	for k := range d.saturated {
		plan.Saturated = append(plan.Saturated, k)
		if d.keyTaken[k] == 0 {
			plan.Backlog = append(plan.Backlog, k)
		}
	}
	slices.Sort(plan.Saturated)
	slices.Sort(plan.Backlog)
	for k, lim := range d.gateLimit {
		if d.keyTaken[k] > 0 && !d.saturated[k] && d.inUse[k] < lim && slices.ContainsFunc(d.counters[k], func(c Counter) bool {
			return c.Available > 0
		}) {
			plan.Roomy = append(plan.Roomy, k)
		}
	}
	slices.Sort(plan.Roomy)
	for k := range d.unsettled {
		plan.Unsettled = append(plan.Unsettled, k)
	}
	slices.Sort(plan.Unsettled)
	if len(plan.Throttled) > 0 {
		plan.Rescheduled = d.waiting
	}
	return plan
}

// reserve deals each full key's line to the key's admitted rows (see
// Deal) and takes the reserved rows out of Blocked.
func (p *Plan) reserve(admittedKey []string, line map[string][]string, n int) {
	p.Reserved = Deal(p.Admitted, admittedKey, line, n)
	reserved := map[string]bool{}
	for _, r := range p.Reserved {
		reserved[r.ID] = true
	}
	p.Blocked = slices.DeleteFunc(p.Blocked, func(id string) bool { return reserved[id] })
}

// Deal reserves successors for a claim's admitted rows (admittedKey: the
// key of each): each full key's line (its blocked rows that may be
// reserved, in order) is dealt to the key's admitted rows one row each in
// turn, up to n each, so that with steps of one length they run in the
// key's order. A store that decides its claim row by row (the memory
// store) calls it with the lines it gathered under Decide's rule; Decide
// calls it for its window.
func Deal(admitted []Admitted, admittedKey []string, line map[string][]string, n int) []Reservation {
	if len(line) == 0 {
		return nil
	}
	line = maps.Clone(line)
	var out []Reservation
	for range n {
		for i, k := range admittedKey {
			if len(line[k]) == 0 {
				continue
			}
			out = append(out, Reservation{ID: line[k][0], After: admitted[i].ID})
			line[k] = line[k][1:]
		}
	}
	return out
}

// pickShard returns the index in rows of the counter a gate row debits:
// the one of a current shard (below lim.Shards) with the most free slots,
// the first of them on ties, so that load spreads and the choice is
// deterministic; -1 when no shard has a free slot.
func pickShard(lim gate.Limit, rows []Counter) int {
	best := -1
	for i, r := range rows {
		if r.Shard < lim.Shards && r.Available > 0 && (best < 0 || r.Available > rows[best].Available) {
			best = i
		}
	}
	return best
}

// CleanShards reports whether a gate key's counters are as its limit makes
// them: n counters in all (locked or not), one per shard, and each locked
// one with its shard's capacity. Their capacities then add up to the limit,
// so admitting on the locked shards alone, each within its own capacity,
// cannot exceed the limit whatever the others hold. A limit change rewrites
// every counter of a key in one transaction, so the locked counters show
// the same state as the others.
func CleanShards(lim gate.Limit, locked []Counter, n int) bool {
	caps := lim.ShardCapacities()
	if n != len(caps) {
		return false
	}
	for _, r := range locked {
		if r.Shard >= len(caps) || r.Capacity != caps[r.Shard] {
			return false
		}
	}
	return true
}

// SortedDebits returns the debits of p sorted by (key, shard): the order in
// which a store locks and writes counters.
func (p Plan) SortedDebits() []ShardKey {
	sks := make([]ShardKey, 0, len(p.Debits))
	for sk := range p.Debits {
		sks = append(sks, sk)
	}
	slices.SortFunc(sks, func(a, b ShardKey) int {
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Shard, b.Shard))
	})
	return sks
}
