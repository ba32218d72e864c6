package store

import (
	"slices"
	"strings"
	"time"

	"github.com/godurable/godurable/gate"
)

// HealthScanLimit bounds the per-key work of a Health call: saturated keys
// are counted up to this many (SaturatedKeysCapped tells when more exist),
// and warnings are looked for among at most this many waiting rows, so
// Health costs the same with 10 keys or 10 million. A queue's failed rows
// are counted up to this many too (QueueHealth.FailedCapped), so that the
// failed rows a long retention keeps do not make Health slower.
const HealthScanLimit = 1000

// BlockedReadyLimit bounds QueueHealth.BlockedReady: the ready rows a full
// MaxActive holds back are counted over at most this many rows, so a value
// of BlockedReadyLimit reads "more than 100" (the seed's bound).
const BlockedReadyLimit = 101

// Health is a bounded-cost snapshot of the pressure in a store, taken at
// one instant. Its JSON form is stable: every field is always present
// (empty lists as []), durations are integer nanoseconds, and no field ever
// carries a key's id or an instance id.
//
// Cost: Health counts rows through the partial indexes of each status, so
// it never reads terminal rows other than failed ones, and its per-key work
// is bounded by the executing rows (a fleet's executors) and HealthScanLimit.
// Handed-back rows are read through a partial index of them alone.
type Health struct {
	// Queues, sorted by name: every queue with a ready, scheduled, blocked,
	// executing, awaiting or failed row, or with a ConcurrencyPolicy.
	Queues []QueueHealth `json:"queues"`
	// Gates, sorted by name: every configured limit (see SyncLimits), even
	// one no key uses yet.
	Gates []GateHealth `json:"gates"`
	// Warnings, sorted by kind then name, are prefix-capture findings among
	// the executing rows and the waiting (ready or blocked) keyed rows, of
	// which a backend may look at only HealthScanLimit: a key
	// declared as an identity whose name has a limit (IdentityCaptured), a
	// key declared as a gate whose name has none (GateWithoutLimit); and
	// the limit syncs of the last LiveChangeFor that changed the semantics
	// of keys live instances held (LiveKeysChanged, with their count at the
	// sync), whichever engine or tool made them. They name key names, never
	// key ids.
	Warnings []gate.Warning `json:"warnings"`
	// RateLimits, sorted by name: every stored rate limit.
	RateLimits []RateHealth `json:"rate_limits"`
	// HandedBack, sorted by workflow then version: the ready (or
	// scheduled) rows whose last outcome was a hand-back
	// (Outcome.HandBack): a worker claimed them and could not run them
	// because it does not know their workflow version or step. They are
	// counted over at most the first HealthScanLimit such rows in that
	// order; HandedBackCapped is true when more exist (the last count is
	// then a lower bound, and versions after it may be missing). Rows of a
	// workflow no worker registers are never claimed, so never handed
	// back: they show as ready rows, aged by OldestReady.
	HandedBack       []HandBackHealth `json:"handed_back"`
	HandedBackCapped bool             `json:"handed_back_capped"`
	// BlockedBy, sorted by name, counts the blocked rows per name of the
	// key they wait for, identity (K = 1) names included: a row of several
	// keys counts under the key that blocked it (Instance.BlockedOn), so
	// that the key holding it back shows whichever of its keys that is.
	// Reserved successors (blocked, with a worker) count too.
	BlockedBy []NameCount `json:"blocked_by"`
	// OldestSnapshot is the oldest snapshot that an open transaction in
	// the store's database, or a replication slot, keeps alive, Health's
	// own excluded. While it is kept, PostgreSQL keeps every row version
	// changed since, and each claim reads through those its index holds:
	// claims get slower until it ends (README, Operating it). The memory
	// store has none (its zero value).
	OldestSnapshot SnapshotHealth `json:"oldest_snapshot"`
}

// SnapshotHealth is how old a snapshot is, and what keeps it.
type SnapshotHealth struct {
	// Transactions counts the transaction ids assigned since it was taken
	// (PostgreSQL's age of its xmin; 0: no snapshot is kept). Every claim
	// and every flush of outcomes takes one, so it grows with the fleet's
	// work, and with it the row versions claims read past.
	Transactions int64 `json:"transactions"`
	// Open is how long the transaction that holds it has been open, when
	// the server shows that to the store's role (PostgreSQL shows it for
	// the role's own sessions, and to superusers and members of
	// pg_read_all_stats); 0 when it does not, and for a replication slot.
	Open time.Duration `json:"open"`
	// Holder says what holds it: "pid N", with the session's application
	// name and state when the server shows them, or "replication slot
	// NAME"; "" when nothing does.
	Holder string `json:"holder"`
}

// A snapshot kept this long, or, when how long is not shown, this many
// transactions back, is old (SnapshotHealth.Old).
const (
	oldSnapshotOpen         = time.Minute
	oldSnapshotTransactions = 100_000
)

// Old reports whether the snapshot has been open for a minute, or, when
// how long is not shown (a replication slot, another role's session),
// was taken 100,000 transactions back: a threshold for durable health's
// note and the UI's overview, not a measure of the slowdown, which grows
// with the claims made since.
func (s SnapshotHealth) Old() bool {
	return s.Holder != "" && (s.Open >= oldSnapshotOpen || (s.Open == 0 && s.Transactions >= oldSnapshotTransactions))
}

// NameCount counts rows under one key name.
type NameCount struct {
	Name  string `json:"name"`
	Count int64  `json:"count"`
}

// NameCounts returns counts as NameCounts sorted by name ([] for none).
func NameCounts(counts map[string]int64) []NameCount {
	out := make([]NameCount, 0, len(counts))
	for name, n := range counts {
		out = append(out, NameCount{Name: name, Count: n})
	}
	slices.SortFunc(out, func(a, b NameCount) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// HandBackHealth counts the handed-back rows of one workflow version.
type HandBackHealth struct {
	Workflow string `json:"workflow"`
	Version  int    `json:"version"`
	Count    int    `json:"count"`
}

// RateHealth is the state of one rate limit.
type RateHealth struct {
	// Limit is the rate limit (name, tokens per period, burst, scope).
	Limit gate.RateLimit `json:"limit"`
	// Buckets counts the name's stored buckets (one for a limit per name;
	// one per recently used key for a limit per key), up to HealthScanLimit;
	// EmptyBuckets those with no whole token at the Health time: keys whose
	// waiting rows are throttled. BucketsCapped is true when the name has
	// more buckets than were counted. Idle buckets are deleted by the
	// reconciler once full, so Buckets tracks the recently active keys.
	Buckets       int  `json:"buckets"`
	EmptyBuckets  int  `json:"empty_buckets"`
	BucketsCapped bool `json:"buckets_capped"`
}

// QueueHealth is the state of one queue.
type QueueHealth struct {
	Queue string `json:"queue"`
	// Ready rows are eligible now (run time at or before the Health time)
	// and wait for a worker; Scheduled rows are ready with a future run time
	// (retries, sleeps, delayed inserts).
	Ready     int64 `json:"ready"`
	Scheduled int64 `json:"scheduled"`
	// Blocked rows are ready but wait for a slot of their key (off the pick
	// path until a slot frees).
	Blocked   int64 `json:"blocked"`
	Executing int64 `json:"executing"`
	// Awaiting counts rows parked on a signal or a timer's timeout, and on
	// children (awaiting_children).
	Awaiting int64 `json:"awaiting"`
	// Failed counts failed rows not yet removed by retention, up to
	// HealthScanLimit; FailedCapped is true when the queue has more (read
	// Failed as "HealthScanLimit or more"). List them with ListPage.
	Failed       int64 `json:"failed"`
	FailedCapped bool  `json:"failed_capped"`
	// OldestReady is how long the oldest ready row has been eligible: from
	// its run time, or for a row handed back by workers that cannot run it
	// (see Health.HandedBack) from when it first became ready, whether it
	// is due again yet or not, since a hand-back only postpones it. 0 when
	// the queue has neither a due ready row nor a handed-back one.
	OldestReady time.Duration `json:"oldest_ready_ns"`
	// MaxActive is the queue's fleet-wide limit (0: none); Active is the
	// number of executing rows it counts (every executing row of the queue).
	// MaxActivePerKey is the policy's budget per key (0: none). A queue with
	// a policy is listed even when it holds no row.
	MaxActive       int   `json:"max_active"`
	MaxActivePerKey int   `json:"max_active_per_key"`
	Active          int64 `json:"active"`
	// BlockedReady is the ready work the policy holds back: while the
	// queue has a policy and Active >= MaxActive, its ready rows eligible
	// now (Ready), counted over at most the first BlockedReadyLimit of them
	// (101 reads "more than 100"); 0 otherwise, when a claim would take
	// them. Rows held back by MaxActivePerKey are blocked (see Blocked and
	// SaturatedKeys), not ready.
	BlockedReady int64 `json:"blocked_ready"`
	// SaturatedKeys counts the keys at the policy's MaxActivePerKey: keys
	// with at least MaxActivePerKey executing rows in the queue and at
	// least one row of the queue waiting for them (blocked, or ready and
	// eligible now). The work is bounded by the queue's executing rows; it
	// counts up to HealthScanLimit keys, and SaturatedKeysCapped is true
	// when more are saturated. 0 when the policy has no MaxActivePerKey.
	// Key ids are never reported.
	SaturatedKeys       int  `json:"saturated_keys"`
	SaturatedKeysCapped bool `json:"saturated_keys_capped"`
}

// GateHealth is the state of one configured key limit.
type GateHealth struct {
	// Name is the key name the limit applies to; Limit is K per key and
	// Shards the number of slot counters each key's K is split into.
	Name   string `json:"name"`
	Limit  int    `json:"limit"`
	Shards int    `json:"shards"`
	// Active is the number of executing rows holding keys of this name.
	Active int64 `json:"active"`
	// BlockedReady is the number of rows of keys of this name that are
	// blocked waiting for a slot of their key.
	BlockedReady int64 `json:"blocked_ready"`
	// SaturatedKeys counts keys of this name that have executing rows and
	// no free slot, up to HealthScanLimit; SaturatedKeysCapped is true when
	// more keys than that are saturated.
	SaturatedKeys       int  `json:"saturated_keys"`
	SaturatedKeysCapped bool `json:"saturated_keys_capped"`
	// HighestKeyActive is the most executing rows any one key of this name has.
	HighestKeyActive int `json:"highest_key_active"`
}
