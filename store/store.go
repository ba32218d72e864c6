// Package store defines the storage contract every godurable backend
// implements. The engine (package durable) holds no durable state of its own:
// everything it knows about an instance, a key's slots or a signal comes from
// a Store, and every rule of admission is enforced by the Store inside the
// claim, so that two engines sharing one store can never over-admit.
//
// The package doc reads in two parts: first what a user of package durable
// meets of a store and the rules a store keeps for them (admission, order,
// cancel, pause); then, from "Implementing a backend" on, the protocol
// between the engine and a backend, which only a backend's author needs.
//
// # Using a store
//
// A program hands an engine one Store (durable.Config.Store): memory.New for
// tests and demos, postgres.New in production. It does not call the Store
// itself; what it meets of this package is:
//
//   - Status and its constants (an instance's status), and the errors
//     ErrNotFound, ErrTerminal, ErrDuplicate, ErrInvalid, ErrClosed and the
//     others, which durable's calls wrap;
//   - the insert options Conflict (with ConflictError, ErrStarted) and
//     Debounce;
//   - the desired-state syncs: ConcurrencyPolicy, SyncOptions (one value,
//     its zero value the defaults) and ErrNamespaceConflict;
//   - durable.Health's parts: QueueHealth, GateHealth, RateHealth,
//     HandBackHealth, ScheduleHealth, UnworkedQueue, PausedQueue, and
//     QueuePause and ReconcileReport.
//
// durable shows instances and schedules in types of its own
// (durable.Instance, durable.StoredSchedule, durable.TickReport) that leave
// the claim out. The stored rows, claim included (Instance, KeyInfo,
// HistoryEntry, Schedule), are the operator's view: Engine.Store() reads
// them, as cmd/durable and package ui do.
//
// # Admission
//
// The rules below are decided in one place, internal/admission.Decide, a
// pure function both backends call with the state they read and lock; the
// defaults and error classes of requests are NormalizeNewInstance and
// NormalizeClaim.
//
// A claim moves ready rows of one queue to executing, in priority order
// (lower first) and FIFO (run_at, then insertion) within a priority, and
// admits each keyed row in the same atomic step:
//
//   - A row with no key is always admitted.
//   - A key whose name has no limit (see SyncLimits) has K = 1: at most one
//     executing row per key.
//   - A key may have a limit of its own (a gate.Limit named by the full key,
//     allowed only while its name has a limit): it then has that limit's K
//     and shards instead of its name's. gate.Limits.For is the rule: the
//     key's own limit, else its name's, else none (K = 1).
//   - A key whose name has a limit L with S shards has K = L: each key has S
//     slot counters whose capacities sum to L; an admitted row debits one slot
//     of a shard with room and remembers the shard; every outcome that takes
//     the row out of executing credits that shard back (internal/admission.Credit:
//     never above capacity; a shard a lowered limit left larger than its
//     share shrinks instead, and one the limit no longer has goes once empty).
//   - A row that is not admitted because its key is full leaves the pick path
//     (status blocked) so that a saturated key's backlog never sits in front
//     of other work; when a slot of its key frees, the next blocked row of the
//     key (priority, then FIFO) is made ready again. One exception: a claim
//     that finds a K = 1 key busy with only one of its rows in sight leaves
//     that row ready (its holder will likely have ended by the next claim,
//     and blocking it would cost a promotion); whatever frees the key then,
//     having no blocked row to promote, notifies that row's queue
//     (internal/admission.Decide, State.InSight).
//   - A due row inserted (Insert, a spawned child, a schedule's tick) for a
//     K = 1 key that is busy (a row admitted under K = 1 executes), or that
//     already has admission.ReadyCap rows ready, goes in blocked at once,
//     with the round it would have had ready (see Order), behind the key's
//     blocked rows; whatever frees the key passes the turn on to it as to
//     any blocked row. A batch's rows of one key count toward the cap in
//     (priority, run_at, insertion) order, the order in which blocked rows
//     are promoted (internal/admission.InsertBlocked decides, for both
//     backends). So a key's deep backlog is written once and never crowds
//     the claims' windows, while a key with a few rows waiting keeps them
//     ready: taking turns by rounds, each usually comes up after the last
//     one ended. Rows of a gate key go in ready, and so do rows inserted in
//     a caller's transaction (TxInserter), which a claim blocks when it
//     finds their key full.
//   - A queue with a ConcurrencyPolicy admits a row only while fewer than
//     MaxActive rows of the queue execute (fleet-wide: every claimer of the
//     store counts the same rows), and a keyed row only while fewer than
//     MaxActivePerKey rows of its key execute in that queue. A row refused by
//     MaxActive stays ready; one refused by MaxActivePerKey is blocked like a
//     row of a full key. Rows without a key consume queue capacity only.
//   - A key whose name has a gate.RateLimit is admitted only when its bucket
//     (refilled to the claim's Now) holds a token. A row refused for want of
//     a token is rescheduled (it stays ready, with RunAt set to when the
//     bucket will hold a token for it) and keeps its place in its round.
//   - Limits compose: a row is admitted only when it passes every one of
//     them, and none of them is debited (no gate slot, no queue capacity, no
//     token) for a row that another refused.
//   - A row of several keys (NewInstance.Also; a store that holds them
//     implements SeveralKeys) is admitted only when each of its keys would
//     admit it, in the same claim, and holds a slot of each while it
//     executes. Refused by one, it debits none: blocked, it waits in the
//     line of the first full key in key order (Instance.BlockedOn) and is
//     woken by that key's freed slot. It waits in the line of its first
//     key until a key blocks it, then in that key's line until a claim
//     takes it; it takes the only-row-in-sight exception (above) for the
//     key of the line it waits in alone: a busy K = 1 key it holds as
//     another key blocks it. A due row whose first key is a busy
//     K = 1 key goes in blocked at insert as a row of that key would;
//     one inserted (Insert, a schedule's tick) that this leaves ready goes
//     in blocked in the line of its first gate (its Key, or the first of
//     its Also with a limit) when the gate has no free slot for it, the
//     batch's rows of the gate taking its free slots in (priority, run_at,
//     insertion) order, none while rows wait in the gate's line
//     (internal/admission.InsertBlockedAtGate), with the
//     round it would have had ready; in its first key's line instead when
//     a row of that K = 1 key goes in ready ahead of it, the key comes
//     before the gate in key order and no row waits in the gate's line
//     ahead of it (internal/admission.InsertBehindFirst). MaxActivePerKey
//     applies to each of its keys, and it takes a token of each rated
//     key's bucket or none. It
//     takes turns as a row of its Key (see Order). A freed slot of one of
//     its keys is handed to it (HandOffer) only with a slot of each of its
//     other keys in the same transaction: one the same batch frees that no
//     row waiting in that key's line takes, or a free K = 1 key; otherwise
//     the key's hand-offs and reservations stop at it, and a claim that
//     decides every one of its keys admits it. A claim reserves no such row;
//     a hand-off reserves one, in the line of its first key, only as the
//     successor of a row of the same keys, and the chain then passes every
//     key's slot to it (it holds nothing while reserved).
//
// # Order
//
// Within a priority, keys take turns. Every row made ready by an insert or
// by its run time falling due gets a round. Rounds are of two kinds: open
// rounds (odd) and turn rounds (even). The queue's open round is the
// lowest round among its ready rows of that priority (0 when there are
// none) when that is an open round, or else the open round just before it.
// A row without a key takes the open round, and so does a key's row when
// the key has no row ready or blocked there (as many rows as its limit). A
// key takes as many turns a round as its limit (one for a K = 1 key, K for
// a gate key of K): its further rows fill the key's last round among its
// ready and blocked rows of that queue and priority while that round has
// turns left, then take the turn rounds after it, K rows each (rows of one
// key made ready together take their turns in run_at, insertion order).
// Claims take rows in (priority, round, run_at, insertion) order, so a new
// row of a key without a backlog, or without a key, comes ahead of the
// backlogs of every key, however many they are; a key's backlog of any
// size delays another key's backlog by at most one round; and a gate of K
// behind the backlogs of many keys still gets K rows a round. Rows of the
// open round arriving faster than the queue runs them hold the turn rounds
// back meanwhile, as a queue without keys would. A row that becomes ready
// again after running (next step, signal, timeout, children, retry) takes
// a fresh round by the same rule, behind the rows of its key already
// waiting; a released or reaped claim, and a promoted blocked row, keep
// theirs. A row's turns are counted with the key's limit when it is made
// ready; a limit changed later applies to the rows made ready after.
// The rule is internal/admission.Rounds for both backends (PostgreSQL's
// insert statement is its SQL form, pinned equal to it).
//
// # Cancel
//
// A step that is still running holds its slot, whatever happens to its row.
// Cancel of an executing row therefore does not free its slot: it marks the
// claim cancel-requested (Instance.CancelRequested), tells the worker (a
// Notification, and the next Heartbeat), and the row stays executing until
// it leaves executing by one of the usual ways, each of which then makes it
// canceled instead: a Complete whose outcome is not terminal (its state
// and step are kept, children are not spawned, nothing is parked), a
// Release, or the reaper when the lease expires. A done or failed outcome
// commits as it is: the step finished first. Only then is the slot freed
// and, for a child, the parent's join counted. A row whose cancel is
// requested holds its unique key no more (see ConflictCancelOlder).
//
// # Pause
//
// A paused queue (PauseQueue) has none of its rows claimed, handed a slot
// or reserved, while everything else about it goes on (see PauseQueue);
// its claims say so (ClaimResult.Paused), so that an engine starts none of
// the rows it holds for it either.
//
// # Implementing a backend
//
// A backend implements Store, and may implement HandOffer (slot hand-off),
// TxInserter (inserts in a caller's SQL transaction), Notifier (wake-ups
// without polling), ClaimChecker (a worker's claims checked without
// renewing them; the suite's fences/ rules ask for it, as its handoff/
// rules ask for HandOffer) and NameLimitsReader (the names' limits without
// the per-key ones; a limits/ rule asks for it); it is correct when it
// passes the conformance suite, storetest.Run, whose subtests are named
// after the rule they pin ("keys/...", "handoff/..."). docs/backends.md in
// the repository maps each method to the rules that pin it. The decisions
// are pure functions in internal/admission that both backends call with
// the state they read and locked; NormalizeNewInstance and NormalizeClaim
// give every request's defaults and error classes.
//
// The engine and a backend speak through these types, which no user of
// package durable sees:
//
//   - NewInstance, InsertResult, TxInserter: Insert. Pinned by insert/,
//     normalize/, keys/, conflict/ and debounce/.
//   - ClaimRequest (Worker, Lease, Reserve), ClaimResult, Claimed
//     (Contended, After): Claim. Pinned by claim/, keys/, policies/, rate/,
//     fairness/, pause/, races/ and random/.
//   - Outcome (Fence, Successor, Ahead, Contended, HandBack,
//     ConsumeSignal), OutcomeKind, OutcomeResult (Stale, Unwaited, Yield),
//     ClaimRef, HeartbeatResult: Complete, Heartbeat, Release. Pinned by
//     fences/, prefetch/, cancel/, spawn/ and signals/ (see Fences below).
//   - HandOffer, HandOff (Room, Reserve, Claiming): CompleteHandOff, the
//     optional hand-off. Pinned by handoff/ and reserve/ (see Hand-off
//     below).
//   - Notification, Notifier: wake-ups; internal/enginetest's
//     WakesWithoutPolling checks them. ClaimChecker: CheckClaims, what an
//     engine asks of its claims when its store first listens. Pinned by
//     fences/.
//   - SignalRequest, SignalResult, Signal: Signal and Inbox. Pinned by
//     signals/ and inbox/.
//   - Schedule (Epoch), FireRequest, FireResult: SyncSchedules and
//     FireSchedule. Pinned by schedule/ and schedules/.
//   - KeyLimits, LimitsResult: SyncKeyLimits and SyncLimits;
//     NameLimitsReader: what an engine's key checks read. Pinned by limits/
//     and sync/.
//   - WorkedQueue, QueuePause: MarkQueuesWorked, WorkedQueues, PauseQueue.
//     Pinned by queues/ and pause/.
//   - Instance (Worker, Fence, LeaseExpiresAt, KeyShard, ReadySince),
//     KeyInfo, HistoryEntry, ListFilter, Page, Health: the reads. Pinned by
//     list/, history/, keyinfo/ and health/.
//
// A backend without HandOffer is correct: every freed slot is credited
// and its key's next row promoted, and an engine claims it; it is slower on
// a busy key, not different in what it admits.
//
// # Fences
//
// Each claim gives the row a new fence token. Every outcome, heartbeat and
// release names the worker and the fence; one that does not match the row's
// current claim (the lease was reaped, the instance was cancelled) commits
// nothing and is reported stale.
//
// # Hand-off
//
// A store that implements HandOffer may give the slot an outcome frees
// straight to the next waiting row of the key (its ready and blocked rows,
// in round order), in the outcome's transaction, claimed by the completing
// worker: the row goes to executing without passing through ready, and the
// slot's counter does not change. It does so only when the claim would
// have admitted that row at once (see HandOffer) and the row is in turn:
// no ready row of its queue, without a key or of another key, has a better
// priority or, at its priority, an earlier round (internal/admission.InTurn:
// one order for a claim, a hand-off and a reservation). The decision is
// internal/admission.Free, the same for every backend.
//
// Such a transaction may also reserve, for each row it makes executing, the
// key's next waiting row as that row's successor (HandOff.Reserve), and so
// may a claim for the rows it admits of a key it finds full
// (ClaimRequest.Reserve), so that a burst's first steps are followed at once
// too: the reserved row stays blocked, holds no slot, and no claim,
// promotion or hand-off takes it. The worker starts it as soon as its predecessor's step
// ends, in the slot that step still holds by the rows (the predecessor's
// outcome is not committed yet), and that outcome's transaction passes the
// slot to it. So a busy key's slot goes from one step to the next without
// waiting for a commit, and at no time do more steps run than rows hold
// slots: the successor starts after its predecessor's step ended, and its
// lease is bound by its predecessor's until the slot is passed.
//
// Rows claimed and not yet run (a prefetch buffer) hold their slots. Parked
// rows (awaiting a signal, a timer or children) hold none.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/godurable/godurable/gate"
)

// Sentinel errors callers branch on.
var (
	// ErrNotFound: no instance with that id.
	ErrNotFound = errors.New("instance not found")
	// ErrTerminal: the instance is done, failed or canceled.
	ErrTerminal = errors.New("instance is terminal")
	// ErrDuplicate: a unique key or caller-chosen id is already taken.
	ErrDuplicate = errors.New("duplicate instance")
	// ErrClosed: the store (or engine) is closed.
	ErrClosed = errors.New("store closed")
	// ErrInvalid: the store refused a value of the request (an id that is
	// not a UUID, JSON it cannot keep, text it cannot store). Retrying the
	// same request cannot succeed; nothing of it was applied.
	ErrInvalid = errors.New("invalid request")

	// ErrSeveralKeys: the store does not hold several concurrency keys per
	// instance (see NewInstance.Also); it comes wrapped in ErrInvalid.
	ErrSeveralKeys = errors.New("this store does not hold several concurrency keys per instance")
)

// MaxKeys is the most concurrency keys an instance holds at once.
const MaxKeys = 4

// KeyRef is one of an instance's concurrency keys with its declared
// intent.
type KeyRef struct {
	Key    string
	Intent gate.Intent
}

// SeveralKeys is implemented by a store that holds several concurrency
// keys per instance (NewInstance.Also, Outcome.Also); a store that does not
// refuses them with ErrSeveralKeys.
type SeveralKeys interface {
	HoldsSeveralKeys() bool
}

// Status is the lifecycle state of an instance.
type Status string

// Statuses. Ready rows with a future RunAt are "scheduled" (retries, sleeps).
const (
	StatusReady     Status = "ready"
	StatusBlocked   Status = "blocked"
	StatusExecuting Status = "executing"
	StatusAwaiting  Status = "awaiting"
	StatusChildren  Status = "awaiting_children"
	StatusDone      Status = "done"
	StatusFailed    Status = "failed"
	StatusCanceled  Status = "canceled"
)

// Terminal reports whether s is done, failed or canceled.
func (s Status) Terminal() bool {
	return s == StatusDone || s == StatusFailed || s == StatusCanceled
}

// DefaultUniqueStatuses are the statuses in which a unique key is occupied
// when NewInstance.UniqueStatuses is empty: every non-terminal status.
var DefaultUniqueStatuses = []Status{StatusReady, StatusBlocked, StatusExecuting, StatusAwaiting, StatusChildren}

// NewInstance is an instance to insert.
type NewInstance struct {
	// ID is the instance id, a UUID chosen by the caller (the engine fills it).
	ID string
	// Workflow and Version name the definition the instance runs.
	Workflow string
	Version  int
	// Queue is the queue the instance runs on.
	Queue string
	// Priority orders claims: lower first.
	Priority int
	// Step is the first step to run.
	Step string
	// State is the JSON-encoded state (an object or value, never a string of JSON).
	State json.RawMessage
	// Key is the concurrency key ("" for none) and KeyIntent its declared intent.
	Key       string
	KeyIntent gate.Intent
	// Also are the instance's other keys when it has several (see
	// NormalizeKeys): each of its steps runs only when every one of its
	// keys has room.
	Also []KeyRef
	// RunAt is when the instance becomes eligible (zero: the store's now
	// plus Delay). A delay rather than a time keeps every run time on one
	// clock, the store's, whatever the clock of the engine that inserts.
	RunAt time.Time
	Delay time.Duration
	// UniqueKey, if set, makes the insert a no-op returning the existing
	// instance while another instance with the same UniqueKey is in one of
	// UniqueStatuses (default DefaultUniqueStatuses), or what OnConflict
	// says.
	UniqueKey      string
	UniqueStatuses []Status
	// OnConflict is what the insert does when another instance holds
	// UniqueKey (see Conflict): skip (the default), cancel the holder, or
	// replace a holder's state that has not started. An instance whose
	// cancel is requested (CancelRequested) no longer holds its unique key.
	OnConflict Conflict
	// Debounce, with a Key, makes the insert replace the state of the
	// key's pending instance and push its start back instead of inserting
	// (InsertResult.Replaced), as Debounce describes. It sets UniqueKey
	// (DebounceUniqueKey) and takes none of its own, nor an OnConflict; a
	// zero RunAt and Delay start a new instance after Debounce.FirstDelay.
	Debounce Debounce
	// ParentID is set for spawned children.
	ParentID string
}

// InsertResult is the outcome of one NewInstance.
type InsertResult struct {
	// ID is the instance id: the new one, or the existing one on a duplicate.
	ID string
	// Duplicate is true when the unique key was taken and nothing was inserted.
	Duplicate bool
	// Replaced is true when the unique key's holder had its state replaced
	// (ConflictReplace, or a debounce): ID is the holder's, and nothing
	// was inserted.
	Replaced bool
	// Canceled is the holder the insert canceled (ConflictCancelOlder), or
	// asked to cancel when its step runs.
	Canceled string
}

// Instance is the stored view of an instance.
type Instance struct {
	ID        string
	Workflow  string
	Version   int
	Queue     string
	Priority  int
	Status    Status
	Step      string
	State     json.RawMessage
	Attempt   int
	Key       string
	KeyIntent gate.Intent
	// KeyShard is the shard the executing row debited (-1 when none).
	KeyShard int
	// Also are the row's other keys, in key order (see NormalizeKeys),
	// and AlsoShards, while it executes, the shard it debited of each (-1:
	// none).
	Also       []KeyRef
	AlsoShards []int
	// BlockedOn is, for a blocked row, the key it waits for: its Key, or
	// for a row of several keys the one that was full when it was blocked.
	BlockedOn string
	RunAt     time.Time
	// AwaitSignal is the signal an awaiting row waits for.
	AwaitSignal string
	// TimeoutAt is when an await times out (zero: never).
	TimeoutAt time.Time
	// Worker, Fence and LeaseExpiresAt describe the current claim.
	Worker         string
	Fence          int64
	LeaseExpiresAt time.Time
	Result         json.RawMessage
	LastError      string
	ParentID       string
	// PendingChildren counts children not yet terminal.
	PendingChildren int
	UniqueKey       string
	CreatedAt       time.Time
	UpdatedAt       time.Time
	// StartedAt is when the current claim began (executing rows).
	StartedAt time.Time
	// CancelRequested is set on an executing row that Cancel was called
	// for: the row becomes canceled when its step's claim ends (see Cancel
	// in the package doc).
	CancelRequested bool
	// ReadySince is set while the row's last outcome was a hand-back
	// (Outcome.HandBack): when the row first became ready before the
	// hand-backs, which each move RunAt later. Any other outcome and Retry
	// clear it (zero: RunAt tells when the row became ready).
	ReadySince time.Time
}

// KeyList returns every concurrency key of the instance: its Key, then its
// Also in key order (nil for an instance without a key).
func (in Instance) KeyList() []string { return keyList(in.Key, in.Also) }

// KeyList returns every concurrency key of the schedule's instances, as
// Instance.KeyList does.
func (s Schedule) KeyList() []string { return keyList(s.Key, s.Also) }

// KeyList returns every concurrency key the step ran under: its Key, then
// its Also (nil for a step without a key).
func (h HistoryEntry) KeyList() []string {
	if h.Key == "" {
		return nil
	}
	return append([]string{h.Key}, h.Also...)
}

// keyList is key, then the keys of also (nil without a key).
func keyList(key string, also []KeyRef) []string {
	if key == "" {
		return nil
	}
	keys := make([]string, 0, 1+len(also))
	keys = append(keys, key)
	for _, a := range also {
		keys = append(keys, a.Key)
	}
	return keys
}

// WorkflowVersion is one version of a workflow a worker registers: what a
// claim or a hand-off restricted to a worker's workflows may take
// (ClaimRequest.Workflows, HandOff.Workflows).
type WorkflowVersion struct {
	Workflow string
	Version  int
}

// Runs reports whether a worker that runs ws runs a row of workflow at
// version; an empty ws runs every row.
func Runs(ws []WorkflowVersion, workflow string, version int) bool {
	return len(ws) == 0 || slices.Contains(ws, WorkflowVersion{workflow, version})
}

// ClaimRequest asks for up to Limit rows of Queue.
type ClaimRequest struct {
	Queue  string
	Worker string
	Limit  int
	// Lease is how long the claim holds before the reaper may take it back.
	Lease time.Duration
	// Now is the current time; zero means the store's own clock.
	Now time.Time
	// Workflows, when non-empty, restricts the claim to the workflow
	// versions this worker registers (deployment skew: rows of other
	// workflows, or of other versions of its workflows, are left for other
	// workers, and a backlog of them costs the claim nothing).
	Workflows []WorkflowVersion
	// Reserve, when positive, asks for up to that many successors for each
	// row the claim admits of a key it finds full: rows of the key the
	// claim would otherwise block, reserved for the worker as
	// Claimed.After describes, under HandOff.Reserve's rule (see
	// internal/admission.Decide). The claim returns them after the rows it
	// admits. A worker that asks must run or release every reservation it
	// is given, and only a HandOffer can take them over (see
	// Outcome.Successor). Both backends reserve under the same rule
	// (store/storetest's reserve/ rules); a store may reserve fewer.
	Reserve int
}

// Claimed is a row the claim moved to executing.
type Claimed struct {
	Instance
	// Signal is the signal that woke the row from an await (nil otherwise).
	Signal *Signal
	// TimedOut is true when the row runs because its await timed out.
	TimedOut bool
	// Contended is a hint that rows were waiting for one of the row's keys
	// when it was claimed: a slot its outcome frees will likely be handed off
	// (see HandOffer), so a worker keeps the executor that ran it for the
	// row handed back. It never changes what the store admits.
	Contended bool
	// After, when set, makes this row a reservation, not a claim: it stays
	// blocked, holds no slot and belongs to the worker under Fence (its
	// heartbeats, releases and cancels work as for a claim, and an expired
	// one goes back to ready when reaped). It is the successor of the
	// worker's claim of row After, of the same key and queue: the worker
	// may start it in that claim's slot as soon as that claim's step has
	// ended, and names it as that claim's Outcome.Successor, whose commit
	// makes it executing. Until then its step is bound by both leases.
	// Only CompleteHandOff with HandOff.Reserve and Claim with
	// ClaimRequest.Reserve return reservations.
	After string
}

// ClaimResult is what Claim returns.
type ClaimResult struct {
	Claimed []Claimed
	// NextDue is the earliest future time at which a row of the queue
	// becomes eligible or an await of the queue times out (zero: none
	// known). Only set when fewer than Limit rows were claimed.
	NextDue time.Time
	// PassedOver counts the keyed rows the claim passed over: rows of the
	// queue ahead of the last row it admitted (any row it looked at, when it
	// admitted fewer than Limit) that it did not admit, because their key
	// had no room (a K = 1 key taken, a gate or a per-key policy full) or
	// their rate bucket no token. Asking for more rows would not have
	// admitted those: an engine lets its claims grow ahead of its
	// executors only while they pass none over (a few hold them where they
	// are). A store that does not count leaves it 0.
	PassedOver int
	// Paused is true when the queue is paused (Store.PauseQueue): the
	// claim took nothing, and the engine that asked starts none of the
	// queue's rows it holds claimed or reserved and has not started yet
	// (it releases them), so that no step of the queue starts later than
	// that engine's next claim after the pause.
	Paused bool
}

// Signal is a stored signal.
type Signal struct {
	ID         int64
	InstanceID string
	Name       string
	Payload    json.RawMessage
	DedupKey   string
	CreatedAt  time.Time
}

// SignalRequest sends a signal. A signal is stored even when the instance is
// not awaiting it yet, and delivered (at least once) to the first await of
// that name.
type SignalRequest struct {
	InstanceID string
	Name       string
	Payload    json.RawMessage
	// DedupKey, if set, makes a second signal with the same key to the same
	// instance a no-op.
	DedupKey string
	Now      time.Time
}

// SignalResult reports what Signal did.
type SignalResult struct {
	// Duplicate is true when the dedup key was seen before and nothing was stored.
	Duplicate bool
	// Woke is true when the signal moved an awaiting instance to ready.
	Woke bool
}

// OutcomeKind is what an outcome does to its row.
type OutcomeKind int

const (
	// OutcomeReady: the row becomes ready at RunAt (Next, Retry, Sleep).
	OutcomeReady OutcomeKind = iota + 1
	// OutcomeAwait: the row parks until AwaitSignal (or TimeoutAt).
	OutcomeAwait
	// OutcomeSpawn: Children are inserted and the row parks until all are terminal.
	OutcomeSpawn
	// OutcomeDone: terminal success with Result.
	OutcomeDone
	// OutcomeFailed: terminal failure with Error.
	OutcomeFailed
)

// Terminal reports whether the kind ends its instance (done, failed).
func (k OutcomeKind) Terminal() bool { return k == OutcomeDone || k == OutcomeFailed }

// String is the kind's name ("ready", "await", "spawn", "done", "failed"),
// which is also how it travels to a database.
func (k OutcomeKind) String() string {
	switch k {
	case OutcomeReady:
		return "ready"
	case OutcomeAwait:
		return "await"
	case OutcomeSpawn:
		return "spawn"
	case OutcomeDone:
		return "done"
	case OutcomeFailed:
		return "failed"
	}
	return fmt.Sprintf("OutcomeKind(%d)", int(k))
}

// Outcome is the committed result of running one claimed step.
type Outcome struct {
	// ID and Fence identify the claim; the worker is the Complete argument.
	ID    string
	Fence int64
	Kind  OutcomeKind
	// Step is the step to run next (ready, await, spawn).
	Step string
	// State is the new state.
	State json.RawMessage
	// Attempt is the attempt of the next run.
	Attempt int
	// RunAt is when a ready row becomes eligible (zero: the store's now
	// plus Delay: one clock for every run time).
	RunAt time.Time
	Delay time.Duration
	// SetKey replaces the row's keys with Key/KeyIntent and Also ("" and
	// none: it releases them all), as NewInstance gives them.
	SetKey    bool
	Key       string
	KeyIntent gate.Intent
	Also      []KeyRef
	// AwaitSignal and TimeoutAt describe an await (zero TimeoutAt: the
	// store's now plus Timeout, or no timeout when Timeout is zero too).
	AwaitSignal string
	TimeoutAt   time.Time
	Timeout     time.Duration
	// ConsumeSignal is the id of the signal the step consumed (0: none); it
	// is marked consumed only if the outcome commits.
	ConsumeSignal int64
	// Children are inserted by a spawn (ParentID is filled by the store).
	Children []NewInstance
	// Result (done) and Error (failed, or the error of a retried attempt).
	Result json.RawMessage
	Error  string
	// History, if non-nil, is recorded in the instance's step history.
	History *HistoryEntry
	// HandBack marks a ready outcome that offers the row again, unchanged,
	// because the worker cannot run it (it does not know the row's
	// workflow version or step). The row keeps when it first became ready
	// (Instance.ReadySince), so Health ages it from then and counts it
	// among the handed-back rows (Health.HandedBack) until an outcome that
	// is not a hand-back.
	HandBack bool
	// Contended is Claimed.Contended of the claim the outcome ends: a
	// store that hands slots off (HandOffer) reads what the hand-off of
	// such an outcome's slot needs in the same round trip as the outcome.
	// It is a hint: it never changes what is committed.
	Contended bool
	// Successor names the row reserved for this worker as the successor of
	// the outcome's claim (a Claimed whose After is this outcome's ID): the
	// slot the outcome frees passes to it, whatever the key's limit is by
	// now, and its reservation becomes a claim (executing, same fence) in
	// the outcome's transaction. Zero: none. Only the HandOffer that
	// reserved it takes it (see HandOff.Reserve); the worker may already
	// run it (see Claimed.After). The reserved row's own outcome may come
	// in the same call, after this one: the slot then passes on along the
	// chain, and the reserved row never holds it by the rows.
	Successor ClaimRef
	// Ahead is, with HandOff.Reserve, how many successors the worker wants
	// reserved for the row that takes this outcome's slot (the outcome's
	// Successor, or a row handed off); a store may reserve fewer.
	Ahead int
}

// OutcomeResult reports one outcome of a Complete batch.
type OutcomeResult struct {
	ID string
	// Stale is true when the claim was no longer the row's current claim:
	// nothing of the outcome was committed.
	Stale bool
	// Unwaited is true when the store knows that no row waits for the
	// slot the outcome freed: the row held no key's slot, its slot went on
	// to another row (a successor, a hand-off), or its key had no ready
	// row and no blocked row other than reservations once the outcome was
	// applied (the outcome's own row counts: one made ready waits). An
	// engine need not claim again for a batch of terminal (done, failed)
	// outcomes that are all unwaited: nothing they freed can be admitted.
	// A store may leave it false, and does for a stale outcome.
	Unwaited bool
	// Yield is set on an outcome of CompleteHandOff that passed its slot
	// to its Successor when the key's next waiting row is out of turn: a
	// row of another key, or of none, with a better priority or an earlier
	// round waits in its queue (internal/admission.InTurn). The worker
	// gives back the reservations it has not started after that successor
	// (the store reserves no more), so that the slot frees when the
	// successor's step ends and passes over no more rows of better turns.
	Yield bool
}

// ClaimRef names one claim: the row and its fence.
type ClaimRef struct {
	ID    string
	Fence int64
}

// HeartbeatResult is what a Heartbeat found, claim by claim (each as it was
// sent, fence included, so that a worker that claimed the same instance
// again meanwhile does not mistake its new claim for the lost one).
type HeartbeatResult struct {
	// Lost are the claims the worker no longer holds: their outcomes will
	// be stale and their steps should stop.
	Lost []ClaimRef
	// Canceled are held claims whose instance was canceled: the step
	// should stop; its outcome makes the instance canceled.
	Canceled []ClaimRef
}

// HistoryEntry is one run of a step.
type HistoryEntry struct {
	InstanceID string
	Step       string
	Attempt    int
	// Key is the concurrency key the step ran under, and Also its other
	// keys when it held several (Instance.Key and Instance.Also as the step
	// was claimed, in store.NormalizeKeys' order).
	Key        string
	Also       []string
	Worker     string
	StartedAt  time.Time
	FinishedAt time.Time
	// Outcome is the transition kind ("next", "retry", ..., "error", "panic").
	Outcome string
	Error   string
}

// KeyInfo is who holds a key's slots and who waits for them.
type KeyInfo struct {
	Key string
	// K is the key's concurrency: its own limit (a per-key limit), else
	// its name's limit, else 1 (see gate.Limits.For).
	K int
	// LimitName names the stored limit K comes from: the key itself for a
	// per-key limit, the key's name for its name's limit, "" for K = 1.
	LimitName string
	// Shards is the number of counter rows (0 for K = 1 keys).
	Shards int
	// Holders are the executing rows of the key.
	Holders []Instance
	// Waiting counts ready and blocked rows of the key; NextInLine is the
	// first of them in admission order (nil when none).
	Waiting    int
	Blocked    int
	NextInLine *Instance
	// WaitingElsewhere counts the rows of several keys (NewInstance.Also)
	// that carry the key and wait for another of their keys: blocked on
	// another, or ready in the line of their Key. They are not in Waiting.
	WaitingElsewhere int
	// OldestWaiting is the waiting row with the earliest run time, ties in
	// insertion order (nil when none): the one that has waited longest.
	OldestWaiting *Instance
	// Available is how many more rows of the key a claim could admit now:
	// for a gate, the free slots over the key's counters (no more than K
	// less the slots in use); for a K = 1 key, 1 while none of its rows
	// executes, else 0. Never negative.
	Available int
	// RateLimit is the rate limit of the key's name (nil: none). Bucket is
	// the stored state of the bucket the key draws from (nil: none stored,
	// which admits as a full bucket); refill it to a time with
	// RateLimit.Refill to see its tokens then.
	RateLimit *gate.RateLimit
	Bucket    *gate.Bucket
}

// ReconcileReport is what one reconciler sweep did.
type ReconcileReport struct {
	// CountersRepaired is the number of counter rows whose free slots did not
	// match capacity − executing rows; Drift is the total correction.
	CountersRepaired int
	Drift            int
	// Promoted is the number of blocked rows made ready because their key had room.
	Promoted int
	// CountersDeleted are idle counters removed; InstancesDeleted are
	// terminal rows older than the retention removed.
	CountersDeleted  int
	InstancesDeleted int
	// BucketsDeleted are rate buckets removed: full at now, or of a name
	// that no longer has a rate limit of that scope.
	BucketsDeleted int
}

// LimitsResult is what SyncLimits and SyncKeyLimits found.
type LimitsResult struct {
	// Changes are the names whose K changed compared with the stored limits.
	Changes []gate.Change
	// RateChanges are the names whose rate limit was added, removed or changed.
	RateChanges []gate.RateChange
	// Live counts, per changed name or key (either kind of change),
	// non-terminal instances holding such keys, up to gate.LiveCountCap.
	Live map[string]int64
}

// MaintenanceLease is the lease (see AcquireLease) whose holder runs the
// fleet's reconciler and retention sweeps.
const MaintenanceLease = "maintenance"

// LiveChangeFor is how long Health keeps reporting a limit sync that
// changed the semantics of keys live instances held (gate.LiveKeysChanged).
const LiveChangeFor = 24 * time.Hour

// LiveChangeWarnings lists, one per key name in name order, the changes of
// res that affect live instances, with their counts; a name whose limit
// and rate limit both changed gets one warning naming both.
func LiveChangeWarnings(res LimitsResult) []gate.Warning {
	byName := map[string]gate.Warning{}
	add := func(w gate.Warning) {
		if old, ok := byName[w.Name]; ok {
			w.Message, w.Live = old.Message+"; "+w.Message, max(old.Live, w.Live)
		}
		byName[w.Name] = w
	}
	for _, c := range res.Changes {
		if n := res.Live[c.Name]; n > 0 {
			add(c.LiveWarning(n))
		}
	}
	for _, c := range res.RateChanges {
		if n := res.Live[c.Name]; n > 0 {
			add(c.LiveWarning(n))
		}
	}
	out := make([]gate.Warning, 0, len(byName))
	for _, w := range byName {
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b gate.Warning) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// DefaultNamespace owns the limits stored by SyncLimits, and is an engine's
// namespace when its configuration names none.
const DefaultNamespace = "default"

// ErrNamespaceConflict is wrapped by a sync that names a queue or a key
// name owned by another namespace; nothing of that sync is stored.
var ErrNamespaceConflict = errors.New("owned by another namespace")

// SyncOptions modify a desired-state sync; every sync takes one value, and
// the zero SyncOptions is the default (delete what is omitted, store the
// result).
type SyncOptions struct {
	// KeepOmitted keeps what the namespace owns but the sync omits
	// (default: omitted entries are deleted).
	KeepOmitted bool
	// DryRun reports what the sync would change (and its errors) and stores
	// nothing.
	DryRun bool
	// RemoveLimits names concurrency limits (key names, or keys for
	// per-key limits) the namespace owns that the sync deletes, whatever
	// KeepOmitted says; a name not stored is ignored, one another namespace
	// owns is ErrNamespaceConflict. It applies when the sync's Limits is
	// not nil. With KeepOmitted and an empty Limits it deletes one entry
	// and leaves the rest, as `durable limits unset` does.
	RemoveLimits []string
}

// KeyLimits is the desired state of the key limits one namespace owns. A
// nil slice leaves that kind of limit as stored; an empty one removes the
// namespace's limits of that kind.
type KeyLimits struct {
	// Limits are concurrency limits (gates) by key name.
	Limits []gate.Limit `json:"limits"`
	// RateLimits are rate limits (token buckets) by key name.
	RateLimits []gate.RateLimit `json:"rate_limits"`
}

// ConcurrencyPolicy is a fleet-wide budget of one queue, stored in the
// store and read by every claim of that queue, so that it holds however
// many engines claim and changes take effect on the next claim.
type ConcurrencyPolicy struct {
	// Queue is the queue the policy applies to. One namespace owns it.
	Queue string `json:"queue"`
	// Namespace is the owner (set by the store on the rows it returns).
	Namespace string `json:"namespace"`
	// MaxActive is the most rows of the queue executing at once. At least 1.
	MaxActive int `json:"max_active"`
	// MaxActivePerKey, when positive, is the most rows of one key executing
	// at once in the queue (the same key in another queue is independent).
	// Zero: no per-key budget.
	MaxActivePerKey int `json:"max_active_per_key,omitempty"`
}

// Validate checks a policy definition.
func (p ConcurrencyPolicy) Validate() error {
	switch {
	case p.Queue == "":
		return errors.New("concurrency policy: empty queue")
	case p.MaxActive < 1:
		return fmt.Errorf("concurrency policy %q: max active must be at least 1, got %d", p.Queue, p.MaxActive)
	case p.MaxActivePerKey < 0:
		return fmt.Errorf("concurrency policy %q: max active per key must not be negative, got %d", p.Queue, p.MaxActivePerKey)
	}
	return nil
}

// ValidateKeyLimits checks a namespace and its key and rate limit
// definitions, and returns them as gate's indexes.
func ValidateKeyLimits(namespace string, limits []gate.Limit, rates []gate.RateLimit) (gate.Limits, gate.RateLimits, error) {
	if namespace == "" {
		return gate.Limits{}, gate.RateLimits{}, errors.New("sync limits: empty namespace")
	}
	ls, err := gate.NewLimits(limits)
	if err != nil {
		return gate.Limits{}, gate.RateLimits{}, fmt.Errorf("sync limits: %w", err)
	}
	rs, err := gate.NewRateLimits(rates)
	if err != nil {
		return gate.Limits{}, gate.RateLimits{}, fmt.Errorf("sync limits: %w", err)
	}
	return ls, rs, nil
}

// ValidatePolicies checks a namespace and its policy definitions (no queue twice).
func ValidatePolicies(namespace string, defs []ConcurrencyPolicy) error {
	if namespace == "" {
		return errors.New("concurrency policies: empty namespace")
	}
	seen := map[string]bool{}
	for _, d := range defs {
		if err := d.Validate(); err != nil {
			return err
		}
		if seen[d.Queue] {
			return fmt.Errorf("concurrency policy %q defined twice", d.Queue)
		}
		seen[d.Queue] = true
	}
	return nil
}

// ListFilter selects instances for List and ListPage.
type ListFilter struct {
	Workflow string
	Status   Status
	// Key selects the rows that hold or wait for the key, as their Key or
	// one of their Also.
	Key   string
	Queue string
	// Newest orders the results newest first: by id, descending. Ids made
	// by the engine or a store (NewInstanceID) are time-ordered, so this is
	// creation order for them; a caller-chosen id sorts by its value. It
	// reads the primary key backwards, so a page costs a page, not the table.
	Newest bool
	// AfterID pages: only instances that come after AfterID in the result
	// order (ids greater than AfterID; with Newest, ids less than AfterID).
	// The last id of one page is the AfterID of the next, so no page skips
	// or repeats rows.
	AfterID string
	// Limit caps the number of results (0: no limit).
	Limit int
	// ScanLimit bounds the work of a page when matches are rare (0: no
	// bound). With ScanLimit > 0 the store examines at most the first
	// ScanLimit instances in the result order (after AfterID), whatever
	// they match, and returns those among them that match f, at most Limit
	// of them; a page may then hold fewer than Limit rows, or none, and
	// still not be the last. ListPage's Page.Next tells where the next page
	// starts. Both stores read it the same way (PostgreSQL reads at most
	// ScanLimit rows of the primary key), so a filter on a rare key, queue
	// or workflow costs a bounded read per page instead of a table scan.
	ScanLimit int
}

// Page is one page of ListPage.
type Page struct {
	// Rows are the matching instances, in the result order.
	Rows []Instance
	// Next is the AfterID of the next page, "" when this page reached the
	// end of the instances. It is the last row's id when the page holds
	// Limit rows (the next page may be empty), and the id of the last
	// instance examined, matching or not, when the page stopped at
	// ScanLimit (see ScanStopped).
	Next string
	// ScanStopped is true when the page stopped because it had examined
	// ScanLimit instances before finding Limit matches: more may match
	// past Next.
	ScanStopped bool
}

// Store is the storage contract. Every method is safe for concurrent use by
// many engines. Methods taking a time use it as "now"; a zero time means the
// store's own clock.
type Store interface {
	// SyncLimits stores the named key limits every claim uses from now on and
	// reports how they differ from the ones stored before. A lowered limit or
	// a new shard count binds the next claim: rows already executing keep
	// running and count against the new limit, so no new row of the key is
	// admitted until the key is under it, with or without a Reconcile between.
	// As those rows finish, the key's counters return to the new limit's
	// shape (a shard the limit no longer has is dropped once empty), so
	// that Reconcile finds nothing to repair on this path: drift is only
	// ever the mark of a crash path.
	// It is SyncKeyLimits for DefaultNamespace with that namespace's stored
	// rate limits left as they are.
	SyncLimits(ctx context.Context, limits []gate.Limit) (LimitsResult, error)
	// Limits returns the stored limits of every namespace, sorted by name.
	Limits(ctx context.Context) ([]gate.Limit, error)
	// SyncKeyLimits makes the concurrency and rate limits namespace owns
	// equal to want (a nil slice of want leaves that kind alone),
	// atomically, and reports how the stored limits changed.
	// Limits the namespace owns and want omits are deleted (unless
	// KeepOmitted). A name whose limit of that kind another namespace owns
	// is ErrNamespaceConflict. Limits apply to keys by name in every queue,
	// whoever owns them; every claim reads them, so every engine enforces
	// the same numbers. A per-key limit (named by a full key) may be owned
	// by another namespace than its name's; a sync that would store one
	// without its name's limit is refused with gate.ErrPerKeyWithoutGate
	// and stores nothing. A change of a key's limit reshapes its counters
	// as SyncLimits says before the call returns, each key's at once (a
	// backend may do it after the limits are stored, key by key), and a
	// key left with free slots has that many of its blocked rows promoted
	// at once.
	SyncKeyLimits(ctx context.Context, namespace string, want KeyLimits, opts SyncOptions) (LimitsResult, error)
	// RateLimits returns the stored rate limits of every namespace, sorted by name.
	RateLimits(ctx context.Context) ([]gate.RateLimit, error)
	// SyncConcurrencyPolicies makes the queue policies namespace owns equal
	// to defs, atomically, and returns the namespace's stored policies
	// sorted by queue. Policies the namespace owns and defs omits are
	// deleted (unless KeepOmitted). A queue another namespace owns is
	// ErrNamespaceConflict. A change applies from the next claim on.
	SyncConcurrencyPolicies(ctx context.Context, namespace string, defs []ConcurrencyPolicy, opts SyncOptions) ([]ConcurrencyPolicy, error)
	// ListConcurrencyPolicies returns every stored policy, sorted by queue.
	ListConcurrencyPolicies(ctx context.Context) ([]ConcurrencyPolicy, error)

	// SyncSchedules makes the schedule definitions namespace owns equal to
	// want, atomically, and returns the namespace's stored schedules sorted
	// by name. Schedules the namespace owns and want omits are deleted
	// (unless KeepOmitted); a name another namespace owns is
	// ErrNamespaceConflict. A sync keeps what the store owns of a schedule
	// it updates (Paused, LastTick, LastInstance, Anchor) and moves its
	// Epoch only when its definition changed; a new schedule is anchored at
	// now (its first tick is the first after the sync).
	SyncSchedules(ctx context.Context, namespace string, want []Schedule, opts SyncOptions) ([]Schedule, error)
	// ListSchedules returns every stored schedule, of every namespace, sorted by name.
	ListSchedules(ctx context.Context) ([]Schedule, error)
	// PauseSchedule pauses (paused true) or resumes a schedule and returns
	// it; a missing name is ErrScheduleNotFound. Resuming a paused schedule
	// anchors it at now, so the ticks of the pause are not missed ticks:
	// the next tick after now fires. Either moves its Epoch when it
	// changes Paused, and no sync changes Paused.
	PauseSchedule(ctx context.Context, name string, paused bool, now time.Time) (Schedule, error)
	// FireSchedule records req.Tick as the schedule's last tick, and
	// inserts req.Instance with it, atomically, only if the schedule's
	// Epoch is still req.Epoch, it is not paused and the tick is after its
	// LastTick (otherwise Stale, nothing done). With SkipIfRunning and a
	// LastInstance that is not terminal, the tick is recorded and nothing
	// inserted. A missing name is ErrScheduleNotFound.
	FireSchedule(ctx context.Context, req FireRequest) (FireResult, error)

	// Insert inserts instances atomically: all or none (duplicates by unique
	// key are reported, not errors; a duplicate caller-chosen id is
	// ErrDuplicate). Each instance is checked and completed by
	// NormalizeNewInstance (ErrInvalid), and the batch by
	// CheckBatchConflicts. A unique key's holder is canceled or has its
	// state replaced as the instance's OnConflict or Debounce says, in the
	// same atomic step; a holder OnConflict cannot act on fails the batch
	// with a *ConflictError.
	Insert(ctx context.Context, instances []NewInstance) ([]InsertResult, error)

	// Claim admits and claims up to req.Limit rows (see Admission), after
	// making the queue's due delayed rows and timed-out awaits ready. An
	// empty Queue is DefaultQueue, a zero Lease DefaultLease (see
	// NormalizeClaim).
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)
	// Complete commits a batch of outcomes of worker's claims. Each outcome
	// commits only if its claim is current; every committed outcome credits
	// the row's slot, and a terminal child updates its parent's join.
	Complete(ctx context.Context, worker string, outcomes []Outcome, now time.Time) ([]OutcomeResult, error)
	// Heartbeat extends the leases of worker's claims to now + lease and
	// reports the claims it no longer holds and the held claims whose
	// instance was canceled.
	Heartbeat(ctx context.Context, worker string, claims []ClaimRef, lease time.Duration, now time.Time) (HeartbeatResult, error)
	// Release returns claims that never ran to ready (attempt unchanged),
	// crediting their slots. Used at graceful shutdown for buffered claims.
	Release(ctx context.Context, worker string, claims []ClaimRef, now time.Time) error

	// Signal stores a signal and wakes the instance if it awaits that name.
	// A signal to a terminal instance is ErrTerminal, to a missing one ErrNotFound.
	Signal(ctx context.Context, req SignalRequest) (SignalResult, error)
	// Cancel makes a non-terminal instance canceled. An executing row is
	// only marked cancel-requested and keeps its slot until its claim ends
	// (see Cancel in the package doc); its worker is notified. Canceling a
	// row whose cancel is already requested does nothing.
	Cancel(ctx context.Context, id string, now time.Time) error
	// Retry makes a failed or canceled instance ready again at its current
	// step, attempt 0; any other status is ErrNotRetryable.
	Retry(ctx context.Context, id string, now time.Time) error

	// Get returns one instance.
	Get(ctx context.Context, id string) (Instance, error)
	// List returns instances matching f, ordered by id (or newest first,
	// see ListFilter.Newest).
	List(ctx context.Context, f ListFilter) ([]Instance, error)
	// ListPage is List that also tells where the listing stopped, so that
	// a caller can continue a scan bounded by f.ScanLimit even after a
	// page with few matches or none (see Page). Its Rows are what List
	// returns for f. Pages chained through Page.Next neither skip nor
	// repeat an instance, and each page with ScanStopped advances by
	// ScanLimit instances.
	ListPage(ctx context.Context, f ListFilter) (Page, error)
	// Inbox returns the signals sent to an instance and not yet consumed by
	// a committed step, oldest first, at most limit of them (0: no limit).
	// A missing instance has an empty inbox.
	Inbox(ctx context.Context, id string, limit int) ([]Signal, error)
	// Children returns the children of a parent, ordered by creation.
	Children(ctx context.Context, parentID string) ([]Instance, error)
	// History returns the recorded step runs of an instance, oldest first.
	History(ctx context.Context, id string) ([]HistoryEntry, error)
	// KeyInfo explains a key: holders, waiters, slots.
	KeyInfo(ctx context.Context, key string) (KeyInfo, error)
	// Health reports queue and gate pressure at now (zero: the store's
	// clock), at a cost bounded as Health documents.
	Health(ctx context.Context, now time.Time) (Health, error)

	// FireTimers makes awaiting rows whose timeout has passed ready (their
	// next claim has TimedOut set) and returns how many.
	FireTimers(ctx context.Context, now time.Time) (int, error)
	// Reap takes back claims whose lease expired: the row becomes ready with
	// attempt + 1 and its K = 1 key is free at once. Gate slots are not
	// credited (the reconciler repairs them). Returns how many.
	Reap(ctx context.Context, now time.Time) (int, error)
	// ReclaimWorker takes back every claim held by worker (a dead
	// predecessor with the same worker id), like Reap.
	ReclaimWorker(ctx context.Context, worker string, now time.Time) (int, error)
	// AcquireLease takes or renews the lease called name for holder until
	// now + ttl, and reports whether holder has it: it does when nobody
	// holds it, when holder already does, or when the last holder's lease
	// expired. Engines use it so that fleet-wide sweeps run on one engine
	// at a time (see MaintenanceLease).
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration, now time.Time) (bool, error)
	// MarkQueuesWorked records that an engine claims from queues at now:
	// each queue's last-worked time becomes the later of the stored one
	// and now (see NormalizeQueueMarks for the names). Engines call it
	// every few seconds per queue at most, never per claim, so it costs
	// the claim path nothing.
	MarkQueuesWorked(ctx context.Context, queues []string, now time.Time) error
	// WorkedQueues returns every queue ever marked by MarkQueuesWorked,
	// with its last-worked time and how long before now that was, sorted
	// by queue: one row per queue, so its cost does not grow with the
	// instances. UnworkedQueues reads it against Health's queues.
	WorkedQueues(ctx context.Context, now time.Time) ([]WorkedQueue, error)
	// PauseQueue pauses (paused true) or resumes a queue, fleet-wide and
	// stored, so that a restart keeps it: from the commit on, no claim
	// takes a row of a paused queue and no outcome hands a slot to one or
	// reserves one (a reserved successor already running is told to yield:
	// OutcomeResult.Yield), while everything else goes on: steps running
	// finish and commit, timers, signals and children make rows ready, and
	// freed slots promote blocked rows, which all wait for the resume. It
	// reports whether it changed anything: pausing a paused queue keeps its
	// PausedAt. Any name may be paused, one no row uses yet too; an empty
	// name is DefaultQueue, a NUL byte ErrInvalid (NormalizeQueueName).
	PauseQueue(ctx context.Context, queue string, paused bool, now time.Time) (changed bool, err error)
	// PausedQueues returns the paused queues, sorted by queue.
	PausedQueues(ctx context.Context) ([]QueuePause, error)
	// Reconcile repairs gate counters from the executing rows, promotes
	// blocked rows whose key has room, deletes idle counters, deletes rate
	// buckets that are full at now (a missing bucket starts full, so no
	// unearned burst is granted) or whose name lost its rate limit, and
	// deletes terminal rows older than retention (0: keep forever). A step
	// that fails does not stop the others: the error joins the failed
	// steps' errors, and the report counts what the others did.
	Reconcile(ctx context.Context, retention time.Duration, now time.Time) (ReconcileReport, error)
	// DeleteTerminal deletes up to limit terminal instances of workflow
	// last changed before before and not before from (zero: no bound),
	// oldest first, and returns how many it deleted and the last one's
	// UpdatedAt (from when it deleted none): a workflow's own retention,
	// swept a bounded chunk per call (see durable.WorkflowOptions.Retention),
	// each call from where the last ended, so that a chunk need not pass
	// over the rows the sweep's earlier chunks deleted.
	DeleteTerminal(ctx context.Context, workflow string, from, before time.Time, limit int) (deleted int, last time.Time, err error)

	// Close releases the store's resources.
	Close() error
}

// TxInserter is implemented by stores that can insert instances inside a
// transaction the caller opened, so that the instances commit or roll back
// with the caller's own writes (store/postgres implements it). Engines reach
// it through durable.Engine.InsertTx, which validates the rows first: a row
// inserted directly must name a workflow version some engine has registered,
// or no worker will ever run it.
type TxInserter interface {
	// InsertTx inserts instances in tx, atomically with the rest of tx, with
	// the results of Insert. Nothing is visible to other sessions, or runs,
	// before tx commits. Unlike Insert, it inserts every due row ready, even
	// one of a busy K = 1 key (see Admission): a row inserted blocked needs a
	// step after the commit that closes its race with the end of the key's
	// holder, and the store does not see the caller's commit.
	InsertTx(ctx context.Context, tx pgx.Tx, instances []NewInstance) ([]InsertResult, error)
}

// HandOffer is implemented by stores that can hand the slots a batch of
// outcomes frees straight to the next waiting rows of their keys, in the
// transaction that commits the outcomes (see Free in internal/admission for
// the exact rule). Such a row goes from blocked to executing for the
// completing worker with a new fence, taking the freed slot as it is: the
// key's counter does not change, and the row never passes through ready.
// This saves a freed slot the second transaction (a claim) it would
// otherwise need before its next step starts, which is what bounds a busy
// key's throughput.
//
// A slot is handed off only when every limit the claim would check admits
// the row without more reads: the worker has Room in the row's queue and
// runs its workflow, the queue has no concurrency policy, the key has no
// rate limit, and no ready row of the same queue that the worker's claim
// would take first (a better priority, or an earlier round, of a workflow
// of HandOff.Workflows) waits: priority and turns hold. Every other freed slot is
// credited and promotes its key's next blocked row, as with Complete. Only
// the slots of outcomes marked Contended are considered (the worker kept
// the executors that ran them for the rows handed back; the store reads
// what their hand-off needs in the round trip that applies the outcomes).
type HandOffer interface {
	// CompleteHandOff is Complete, handing freed slots off as h allows; it
	// returns the rows handed to worker, claimed under h.Lease, in the
	// order their slots were freed (outcomes' successors first, with only
	// their ID, Fence, Queue and Status: the worker has the rest from the
	// reservation), then the reservations made (h.Reserve). With no room
	// and no successors it is Complete.
	CompleteHandOff(ctx context.Context, worker string, outcomes []Outcome, now time.Time, h HandOff) ([]OutcomeResult, []Claimed, error)
}

// HandOff is what a completing worker can take (see HandOffer).
type HandOff struct {
	// Room is how many rows the worker can start now, per queue.
	Room map[string]int
	// Workflows, when non-empty, are the workflow versions the worker runs.
	Workflows []WorkflowVersion
	// Lease is the lease of the rows handed off (zero: DefaultLease).
	Lease time.Duration
	// Reserve asks for a successor for each row the call makes executing
	// (a hand-off, or an outcome's Successor) whose key has more rows
	// waiting: the key's next waiting row, reserved for the worker as
	// Claimed.After describes, under the same rule as a hand-off except
	// for room (it runs in its predecessor's executor, so it must be of
	// the same queue). A worker that asks must run or release every
	// reservation it is given. A store may ignore it.
	Reserve bool
	// Claiming tells the store that the worker claims again after this
	// call whatever the call returns, so that OutcomeResult.Unwaited, which
	// only spares a worker a claim, is of no use to it: the store may leave
	// it false rather than find out whether rows wait for the slots the
	// outcomes free. With no room, no successors and no Reserve, the call
	// is Complete but for that.
	Claiming bool
}

// Notifier is implemented by stores that can wake idle engines when work may
// have become ready (an insert, a signal, a freed slot), and tell them when
// an instance one of them runs was canceled, in this process or in another.
// Engines poll and heartbeat as a fallback, so a notification may be lost
// without losing work or a cancel.
type Notifier interface {
	// Listen calls fn for every notification until ctx is done. fn must not
	// block. It calls fn with the zero Notification each time it starts
	// listening (again, after a lost connection): notifications sent before
	// that may not have reached fn.
	Listen(ctx context.Context, fn func(Notification)) error
}

// ClaimChecker is implemented by stores that can tell a worker which of
// its claims it still holds, and which of those were canceled, without
// renewing their leases: when its Notifier first listens, an engine checks
// its claims so for the cancels it may not have heard, rather than by a
// Heartbeat, which locks every row it renews beside the flushes that lock
// the same rows. (When the Notifier listens again after a lost connection,
// the engine sends a Heartbeat: its claims may have gone unrenewed.)
type ClaimChecker interface {
	// CheckClaims reports, as Heartbeat does, the claims worker no longer
	// holds and the held ones whose instance was canceled. It changes
	// nothing and waits for no row lock.
	CheckClaims(ctx context.Context, worker string, claims []ClaimRef) (HeartbeatResult, error)
}

// NameLimitsReader is implemented by stores that can read the limits of
// key names apart from the per-key limits, which a fleet may store for each
// of many thousand tenants: an engine's key checks (gate.Limits.Check) look
// names up only, and read them again every few seconds.
type NameLimitsReader interface {
	// NameLimits returns the stored limits of key names, no per-key limit,
	// sorted by name: Limits without the entries named by a full key.
	NameLimits(ctx context.Context) ([]gate.Limit, error)
}

// Notification is one message of a Notifier: at most one field is set
// (none: the Notifier is listening now; see Listen).
type Notification struct {
	// Queue: work may be ready in this queue.
	Queue string
	// Canceled: the instance with this id was canceled while a claim of it
	// executes; the worker holding the claim should stop its step.
	Canceled string
}
