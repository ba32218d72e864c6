// Package durable is the public face of godurable: workflow definitions, the
// Engine that runs them, and the calls that start, signal, cancel and inspect
// instances.
//
// An Engine claims steps from a store.Store (PostgreSQL in production, an
// in-memory store for tests and demos), runs them on a pool of executors per
// queue, and commits each step's transition with its new state before the
// instance proceeds. Concurrency keys, gates and every other admission rule
// are enforced by the store inside the claim, so any number of engines may
// share one database.
package durable

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/runtime"
	"github.com/godurable/godurable/store"
)

// DefaultQueue is the queue used when neither the workflow nor Insert names one.
const DefaultQueue = "default"

// Errors callers branch on. Store errors (store.ErrNotFound,
// store.ErrTerminal, store.ErrDuplicate) pass through wrapped.
var (
	// ErrUnknownWorkflow: no registered workflow by that name.
	ErrUnknownWorkflow = errors.New("unknown workflow")
	// ErrStopped: the engine was stopped.
	ErrStopped = errors.New("engine stopped")
	// ErrEncode: a state, result or payload could not be JSON-encoded.
	ErrEncode = errors.New("encode")
	// ErrPayloadTooLarge: an encoded state, result or payload exceeds Config.MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("payload too large")
)

// Clock tells the engine the time. Tests use a fake (see durabletest).
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Config configures an Engine. Zero fields take the documented defaults.
type Config struct {
	// Store holds all durable state. It is required: store/postgres in
	// production, or memory.New (store/memory) for tests and demos, where
	// nothing survives the process.
	Store store.Store
	// Queues maps each queue this engine works to its number of executors
	// (steps running at once in this process). Default {"default": 10}.
	Queues map[string]int
	// Namespace owns the Limits and RateLimits this engine syncs, and the
	// policies Engine.SyncConcurrencyPolicies stores (default
	// store.DefaultNamespace). Every engine of one service should use the
	// same namespace; another namespace cannot take over what this one owns.
	Namespace string
	// Limits are the named key limits (gates). A key whose name has no limit
	// runs at K = 1. A limit named by a full key ("stripe:acct_big") is a
	// per-key limit: that key's K over its name's, which needs a limit for
	// its name too (see gate.Limits.For). They are the namespace's desired state, stored with
	// SyncKeyLimits at Start (limits the namespace owned and the
	// configuration no longer names are removed), so every engine sharing
	// the store enforces the last synced numbers. Syncing is deliberate: nil
	// (the zero Config) leaves the stored limits alone, so an inserter or an
	// admin tool never wipes the fleet's gates; an empty, non-nil slice
	// removes the namespace's limits. Checks that depend on a key's K
	// (Strict, warnings) read the fleet's stored limits (with these over
	// them), so an engine without this field judges keys as the fleet runs them.
	Limits []gate.Limit
	// RateLimits are token buckets by key name (a flow cap: how many steps
	// of such keys start per period, fleet-wide, per name or per key). A
	// step is admitted only when its key passes its gate and its rate limit,
	// and neither is debited when the other refuses. Synced at Start like
	// Limits, and like them left alone when nil.
	RateLimits []gate.RateLimit
	// Schedules are the namespace's periodic workflows (see Schedule). Like
	// Limits they are desired state, synced to the store at Start: the
	// schedules the namespace owned and this list omits are removed. A nil
	// Schedules leaves the stored schedules alone (an inserter or an admin
	// tool never wipes them); an empty, non-nil one removes the namespace's
	// own. Every engine whose Schedules names a schedule fires it, and each
	// tick starts one instance fleet-wide however many engines do. A bad
	// expression is an error at New, a schedule of an unregistered workflow
	// one at Start.
	Schedules []Schedule
	// Strict turns prefix-capture warnings into errors: at Insert (an
	// identity key captured by a limit, a gate key without a limit) and at
	// Start (a limit change that alters live keys).
	Strict bool
	// WorkerID names this engine in claims. Set it to a name that is stable
	// across restarts (a pod name) to get startup reclaim of a dead
	// predecessor's claims; it must be unique among live engines. Default: a
	// random id with the host name, under which Start reclaims nothing (no
	// previous run can have held it).
	WorkerID string
	// Lease is how long a claim holds without a heartbeat (default 30s).
	Lease time.Duration
	// HeartbeatInterval is how often leases are extended (default Lease/3;
	// at most Lease/2). A claim whose lease this engine has not renewed
	// for about a lease (the store is unreachable) is given up: its step's
	// context is cancelled shortly before the lease ends, by this engine's
	// clock, so that the step has stopped before another engine may run it.
	HeartbeatInterval time.Duration
	// PollInterval bounds how long an idle queue waits before claiming again
	// when no notification arrives (default 1s; notifications usually wake it
	// within milliseconds).
	PollInterval time.Duration
	// MaxFlushBatch caps the outcomes committed in one transaction (default 256).
	// Outcomes are group-committed: those that arrive while a flush is in
	// flight go together in the next one.
	MaxFlushBatch int
	// ReaperInterval is how often expired leases and due timers are swept (default 5s).
	ReaperInterval time.Duration
	// ReconcileInterval is how often gate counters are repaired and old rows
	// collected (default 30s), by one engine of the fleet at a time: the
	// holder of the store's maintenance lease (store.MaintenanceLease),
	// which it renews at each sweep; another engine takes over within
	// three intervals of its holder's death.
	ReconcileInterval time.Duration
	// Retention is how long terminal instances are kept (default 7 days;
	// negative keeps them forever).
	Retention time.Duration
	// MaxPayloadBytes caps an encoded state, result or signal payload
	// (default 1 MiB).
	MaxPayloadBytes int
	// Logger receives structured logs (default slog.Default()). Key values
	// are logged at debug level only.
	Logger *slog.Logger
	// Clock is the time source (default the wall clock).
	Clock Clock
	// Jitter returns a uniform number in [0, 1) for the jitter of retry
	// delays (steps.RetryPolicy.RandomizationFactor). Default: math/rand's
	// global source. A seeded source makes retry times reproducible
	// (durabletest sets one); the engine serializes its calls, so a
	// *rand.Rand's Float64 may be used as it is.
	Jitter func() float64
	// TracerProvider receives a span per step (default: no tracing).
	TracerProvider trace.TracerProvider
	// MeterProvider receives the engine's metrics (default: none).
	MeterProvider metric.MeterProvider
	// HealthInterval is the longest the gauges (queue depth, gate limit,
	// active and blocked) reuse one Health snapshot: collections more
	// frequent than this cost no store query (default 10s). A negative
	// value registers no gauges: the numbers are fleet-wide, so one engine
	// of a fleet reporting them is enough.
	HealthInterval time.Duration
}

func (c *Config) setDefaults() error {
	if c.Namespace == "" {
		c.Namespace = store.DefaultNamespace
	}
	if c.Store == nil {
		return errors.New("durable: Config.Store is nil: pass postgres.New(...) (store/postgres), or memory.New(memory.Options{}) (store/memory) for tests and demos, where nothing survives the process")
	}
	if len(c.Queues) == 0 {
		c.Queues = map[string]int{DefaultQueue: 10}
	}
	for q, n := range c.Queues {
		if q == "" || n < 1 {
			return fmt.Errorf("durable: queue %q: need a name and at least 1 executor, got %d", q, n)
		}
		if err := checkName("queue name", q); err != nil {
			return fmt.Errorf("durable: %w", err)
		}
	}
	if c.WorkerID == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.WorkerID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if err := checkName("worker id", c.WorkerID); err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	if c.Lease <= 0 {
		c.Lease = 30 * time.Second
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = c.Lease / 3
	}
	if c.HeartbeatInterval > c.Lease/2 {
		return fmt.Errorf("durable: heartbeat interval %v must be at most half the lease %v: a claim not renewed in time is given up", c.HeartbeatInterval, c.Lease)
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.MaxFlushBatch <= 0 {
		c.MaxFlushBatch = 256
	}
	if c.ReaperInterval <= 0 {
		c.ReaperInterval = 5 * time.Second
	}
	if c.ReconcileInterval <= 0 {
		c.ReconcileInterval = 30 * time.Second
	}
	if c.Retention == 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.MaxPayloadBytes <= 0 {
		c.MaxPayloadBytes = 1 << 20
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	return nil
}

// Engine runs registered workflows against a store. Create it with New,
// Register definitions, then Start; Insert, Signal, Cancel and Get work
// whether or not the engine is started (until Stop).
type Engine struct {
	cfg      Config
	st       store.Store
	log      *slog.Logger
	limits   gate.Limits
	rates    gate.RateLimits
	fakeTime bool
	jitter   func() float64
	// schedules are Config.Schedules by name.
	schedules map[string]Schedule

	mu      sync.RWMutex
	defs    map[string]map[int]*definition // name → version → definition
	latest  map[string]*definition
	state   lifecycle
	warned  map[string]gate.Warning // kind/name -> the warning, as first seen
	sched   *runtime.Scheduler
	rt      *runtime.Runtime
	flushed chan struct{} // closed and replaced after every committed flush
	tel     *telemetry
	// generatedID is set when New generated cfg.WorkerID (see prepareStart).
	generatedID bool

	stored      storedLimits
	reconciled  reconcileState
	skew        skewState
	healthCache healthCache
	queues      queueWatch
	// stopDone is closed when the first Stop has finished.
	stopDone chan struct{}
}

// New validates cfg and returns an engine that is not yet started.
func New(cfg Config) (*Engine, error) {
	// A generated worker id is new: no claim of a previous run holds it,
	// so Start has nothing to reclaim under it.
	generatedID := cfg.WorkerID == ""
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	limits, err := gate.NewLimits(cfg.Limits)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	rates, err := gate.NewRateLimits(cfg.RateLimits)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	schedules, err := validateSchedules(cfg.Namespace, cfg.Schedules)
	if err != nil {
		return nil, err
	}
	_, fake := cfg.Clock.(realClock)
	tel, err := newTelemetry(cfg.TracerProvider, cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("durable: telemetry: %w", err)
	}
	log := cfg.Logger.With("worker", cfg.WorkerID)
	e := &Engine{tel: tel,
		cfg: cfg, st: cfg.Store, log: log, limits: limits, rates: rates, fakeTime: !fake, schedules: schedules,
		defs: map[string]map[int]*definition{}, latest: map[string]*definition{},
		warned: map[string]gate.Warning{}, flushed: make(chan struct{}), generatedID: generatedID,
	}
	if cfg.Jitter != nil {
		var mu sync.Mutex
		e.jitter = func() float64 {
			mu.Lock()
			defer mu.Unlock()
			return cfg.Jitter()
		}
	}
	e.rt = runtime.New(runtime.Config{Store: cfg.Store, Logger: log, Clock: cfg.Clock,
		WorkerID: cfg.WorkerID, Queues: cfg.Queues, Lease: cfg.Lease, HeartbeatInterval: cfg.HeartbeatInterval,
		PollInterval: cfg.PollInterval, MaxFlushBatch: cfg.MaxFlushBatch, ReaperInterval: cfg.ReaperInterval,
		ReconcileInterval: cfg.ReconcileInterval, Schedules: len(schedules) > 0, MaxErrorLength: MaxErrorLength,
		StaleCounter: tel.stale, ReapedCounter: tel.reaped}, host{e})
	if cfg.HealthInterval > 0 {
		if err := tel.observeHealth(e.gaugeHealth); err != nil {
			return nil, fmt.Errorf("durable: telemetry: %w", err)
		}
	}
	return e, nil
}

// gaugeHealth is the snapshot the gauges observe (see healthCache).
func (e *Engine) gaugeHealth(ctx context.Context) (Health, bool) {
	return e.healthCache.get(ctx, e.cfg.HealthInterval, e.Health)
}

// Store returns the engine's store: the operator's view, for tools such as
// cmd/durable and package ui that read rows with their claims (worker,
// fence, lease, key shard), keys' holders and step histories. A program
// that starts, signals and waits for instances does not need it.
func (e *Engine) Store() store.Store { return e.st }

// WorkerID returns the id this engine claims under.
func (e *Engine) WorkerID() string { return e.cfg.WorkerID }

// ErrStarted is returned by Register on an engine that was started: its
// workers claim only the workflows registered before Start.
var ErrStarted = errors.New("engine already started")

// Register adds workflow definitions. Several versions of one name may be
// registered; new instances start on the highest. Register every
// definition before Start: afterwards it is ErrStarted.
func (e *Engine) Register(defs ...Definition) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state != stateNew {
		return fmt.Errorf("durable: register: %w (register every workflow before Start)", ErrStarted)
	}
	for _, d := range defs {
		def := d.definition()
		if err := def.validate(); err != nil {
			return fmt.Errorf("durable: register: %w", err)
		}
		if def.retention > 0 && e.cfg.Retention > 0 && def.retention > e.cfg.Retention {
			return fmt.Errorf("durable: register: workflow %q: retention %v is longer than Config.Retention %v, which bounds every row",
				def.name, def.retention, e.cfg.Retention)
		}
		if e.defs[def.name] == nil {
			e.defs[def.name] = map[int]*definition{}
		}
		e.defs[def.name][def.version] = def
		e.warnForeignQueue(def)
		if l := e.latest[def.name]; l == nil || def.version > l.version {
			e.latest[def.name] = def
		}
	}
	return nil
}

func (e *Engine) lookup(name string, version int) *definition {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.defs[name][version]
}

// retentions returns the registered workflows that have a retention of
// their own (WorkflowOptions.Retention), their latest version's.
func (e *Engine) retentions() map[string]time.Duration {
	e.mu.RLock()
	defer e.mu.RUnlock()
	out := map[string]time.Duration{}
	for name, d := range e.latest {
		if d.retention > 0 {
			out[name] = d.retention
		}
	}
	return out
}

// workflowVersions returns every registered version of every workflow,
// sorted: what this engine's claims and hand-offs may take.
func (e *Engine) workflowVersions() []store.WorkflowVersion {
	e.mu.RLock()
	defer e.mu.RUnlock()
	var out []store.WorkflowVersion
	for n, vs := range e.defs {
		for v := range vs {
			out = append(out, store.WorkflowVersion{Workflow: n, Version: v})
		}
	}
	slices.SortFunc(out, func(a, b store.WorkflowVersion) int {
		return cmp.Or(strings.Compare(a.Workflow, b.Workflow), cmp.Compare(a.Version, b.Version))
	})
	return out
}

// storeNow is the "now" passed to the store: zero (the store's own clock,
// PostgreSQL's now() for example) unless a fake clock is configured.
func (e *Engine) storeNow() time.Time {
	if e.fakeTime {
		return e.cfg.Clock.Now()
	}
	return time.Time{}
}

func (e *Engine) checkOpen() error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.state == stateStopped {
		return ErrStopped
	}
	return nil
}

// InsertOptions are the options of one insert.
type InsertOptions struct {
	// Key is the concurrency key (zero: none): the one-key shorthand of
	// Keys.
	Key gate.ConcurrencyKey
	// Keys are the instance's concurrency keys when it has several: at
	// most MaxKeys, no key twice (the same name:id, whatever the intents),
	// none zero, any mix of identities and gates. Each step runs only when
	// every one of its keys has room, and holds them all while it runs;
	// transitions keep them (see transitions.AddKey, DropKey, ReplaceKey,
	// SetKeys). Setting both Key and Keys is ErrInvalidInput. A store that
	// does not hold several keys per instance refuses them (an error
	// wrapping store.ErrSeveralKeys).
	Keys []gate.ConcurrencyKey
	// Queue overrides the workflow's queue.
	Queue string
	// Priority orders admission: lower runs first (default 0).
	Priority int
	// RunAt delays the first step until a time; Delay until now + Delay.
	RunAt time.Time
	Delay time.Duration
	// UniqueKey makes the insert a no-op (returning the existing id) while
	// another instance with the same UniqueKey is in one of UniqueStatuses
	// (default: any non-terminal status).
	UniqueKey      string
	UniqueStatuses []store.Status
	// OnConflict is what the insert does when another instance holds
	// UniqueKey (it needs one):
	//   - ConflictSkip (the default): nothing; the holder's id is returned.
	//   - ConflictCancelOlder: the holder is canceled by Cancel's rules
	//     (a running step keeps its key's slot until it returns, and no
	//     longer holds the unique key), then the instance is inserted and
	//     its id returned. A terminal holder (UniqueStatuses with terminal
	//     statuses) fails the insert with a *store.ConflictError wrapping
	//     store.ErrTerminal.
	//   - ConflictReplace: a holder that has not started (ready, scheduled
	//     or blocked, never claimed) gets the new state and its id is
	//     returned; nothing is inserted. A holder that has started
	//     (executing, awaiting, awaiting its children, ready again after a
	//     step) or ended fails the insert with a *store.ConflictError
	//     wrapping store.ErrStarted: its state is its steps'.
	// A unique key that a request cancels or replaces may appear in no
	// other request of the same InsertMany (ErrInvalidInput). A refused
	// insert inserts nothing of its batch.
	OnConflict store.Conflict
	// Debounce, with a Key, runs the workflow once after a burst of
	// inserts with that key: while an instance of the key is pending (not
	// started), an insert replaces its state and pushes its start to now +
	// Period, but never past its first insert + MaxWait, and returns its
	// id; once it has started, the next insert starts a new pending one,
	// Period (or MaxWait, if shorter) from now. It is atomic and
	// fleet-wide: concurrent inserts from many engines leave one pending
	// instance per key. A debounced insert takes no UniqueKey, OnConflict,
	// RunAt or Delay of its own, and a key appears once per InsertMany.
	Debounce Debounce
	// ID is a caller-chosen instance id (a UUID); default a new one.
	ID string
}

// Debounce is InsertOptions.Debounce (see store.Debounce): Key names the
// burst, Period is the quiet time before the instance starts, MaxWait
// (0: none) bounds how long after its first insert it may be pushed back.
type Debounce = store.Debounce

// The modes of InsertOptions.OnConflict.
const (
	ConflictSkip        = store.ConflictSkip
	ConflictCancelOlder = store.ConflictCancelOlder
	ConflictReplace     = store.ConflictReplace
)

// InsertRequest is one instance of an InsertMany.
type InsertRequest struct {
	Workflow string
	State    any
	Options  InsertOptions
}

// Insert starts an instance of workflow with state and returns its id. With
// a UniqueKey that is taken, it returns the existing instance's id.
func (e *Engine) Insert(ctx context.Context, workflow string, state any, opts InsertOptions) (string, error) {
	ids, err := e.InsertMany(ctx, []InsertRequest{{Workflow: workflow, State: state, Options: opts}})
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// InsertMany starts many instances atomically (all or none), in any number.
func (e *Engine) InsertMany(ctx context.Context, reqs []InsertRequest) ([]string, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	rows, err := e.prepareInserts(reqs, "")
	if err != nil {
		return nil, err
	}
	res, err := e.st.Insert(ctx, rows)
	if err != nil {
		return nil, fmt.Errorf("durable: insert: %w", err)
	}
	e.wakeQueues(rows)
	if err := e.canceledOlder(ctx, res); err != nil {
		return insertIDs(res), err
	}
	return insertIDs(res), nil
}

// canceledOlder applies Cancel's wall-clock rule to the holders an insert
// canceled (ConflictCancelOlder): a running one is told at once, and a
// reserved one has been given back or started when it returns.
func (e *Engine) canceledOlder(ctx context.Context, res []store.InsertResult) error {
	var ids []string
	for _, r := range res {
		if r.Canceled != "" {
			ids = append(ids, r.Canceled)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	if err := e.canceled(ctx, ids); err != nil {
		return err
	}
	for _, id := range ids {
		if err := e.awaitUnreserved(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// ErrNoTxInsert is returned by InsertTx and InsertManyTx when the engine's
// store cannot insert in a caller's transaction (it does not implement
// store.TxInserter): configure store/postgres as Config.Store.
var ErrNoTxInsert = errors.New("store cannot insert in a caller's transaction")

// InsertTx starts an instance of workflow with state inside the caller's
// PostgreSQL transaction tx, so that it commits or rolls back with the
// caller's own writes: nothing runs unless tx commits, and then workers are
// notified. It validates like Insert (registered workflow, latest version,
// state encoding, Strict key checks) and returns the instance id, or the
// existing instance's id for a UniqueKey that is taken. The engine's store
// must be store/postgres (see ErrNoTxInsert), on the database tx belongs to.
//
// Insert puts an instance whose concurrency key (without a limit) is taken
// straight into the key's line (blocked), healing the key once its insert
// has committed; InsertTx cannot act after the caller's commit, so such an
// instance goes in ready and waits in line from the first claim that finds
// its key taken (see store.TxInserter).
func (e *Engine) InsertTx(ctx context.Context, tx pgx.Tx, workflow string, state any, opts InsertOptions) (string, error) {
	ids, err := e.InsertManyTx(ctx, tx, []InsertRequest{{Workflow: workflow, State: state, Options: opts}})
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// InsertManyTx is InsertMany inside the caller's transaction tx (see
// InsertTx): the instances commit or roll back with tx.
func (e *Engine) InsertManyTx(ctx context.Context, tx pgx.Tx, reqs []InsertRequest) ([]string, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	ti, ok := e.st.(store.TxInserter)
	if !ok {
		return nil, fmt.Errorf("durable: insert in a transaction: %w: the engine's store is %T; use store/postgres", ErrNoTxInsert, e.st)
	}
	if tx == nil {
		return nil, fmt.Errorf("durable: insert in a transaction: %w: nil transaction", ErrInvalidInput)
	}
	rows, err := e.prepareInserts(reqs, "")
	if err != nil {
		return nil, err
	}
	res, err := ti.InsertTx(ctx, tx, rows)
	if err != nil {
		return nil, fmt.Errorf("durable: insert in a transaction: %w", err)
	}
	// The holders a ConflictCancelOlder canceled are canceled when tx
	// commits: their workers see it at their next heartbeat.
	return insertIDs(res), nil
}

func insertIDs(res []store.InsertResult) []string {
	ids := make([]string, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}
	return ids
}

// prepareInserts validates and encodes insert requests into store rows.
// Errors name the request by its index only when there are several.
func (e *Engine) prepareInserts(reqs []InsertRequest, parentID string) ([]store.NewInstance, error) {
	rows := make([]store.NewInstance, 0, len(reqs))
	for i, r := range reqs {
		what := "insert"
		if len(reqs) > 1 {
			what = fmt.Sprintf("insert #%d", i)
		}
		e.mu.RLock()
		def := e.latest[r.Workflow]
		e.mu.RUnlock()
		if def == nil {
			return nil, fmt.Errorf("durable: %s: %w %q: no workflow of that name is registered on this engine; call Register with its definition before inserting",
				what, ErrUnknownWorkflow, r.Workflow)
		}
		state, err := e.encode("state", r.State)
		if err != nil {
			return nil, fmt.Errorf("durable: %s (%s): %w", what, r.Workflow, err)
		}
		keys, err := insertKeys(r.Options.Key, r.Options.Keys)
		if err != nil {
			return nil, fmt.Errorf("durable: %s (%s): %w", what, r.Workflow, err)
		}
		for _, k := range keys {
			if err := e.checkKey(k); err != nil {
				return nil, fmt.Errorf("durable: %s (%s): %w", what, r.Workflow, err)
			}
		}
		key, keyIntent, also, err := storeKeys(keys)
		if err != nil {
			return nil, fmt.Errorf("durable: %s (%s): %w: %w", what, r.Workflow, ErrInvalidInput, err)
		}
		o := r.Options
		id := o.ID
		if id == "" {
			id = store.NewInstanceID()
		} else if _, err := uuid.Parse(id); err != nil {
			return nil, fmt.Errorf("durable: %s: %w: id %q is not a UUID", what, ErrInvalidInput, truncateForError(id))
		}
		queue := o.Queue
		if queue == "" {
			queue = def.queue
		}
		if err := checkName("queue name", queue); err != nil {
			return nil, fmt.Errorf("durable: %s (%s): %w", what, r.Workflow, err)
		}
		e.checkQueueWorked(queue, def.name)
		if err := checkText("unique key", o.UniqueKey, MaxUniqueKeyLength); err != nil {
			return nil, fmt.Errorf("durable: %s (%s): %w", what, r.Workflow, err)
		}
		switch {
		case o.OnConflict != ConflictSkip && o.OnConflict != ConflictCancelOlder && o.OnConflict != ConflictReplace:
			return nil, fmt.Errorf("durable: %s (%s): %w: unknown OnConflict %q", what, r.Workflow, ErrInvalidInput, truncateForError(string(o.OnConflict)))
		case o.OnConflict != ConflictSkip && o.UniqueKey == "":
			return nil, fmt.Errorf("durable: %s (%s): %w: OnConflict %s needs a UniqueKey", what, r.Workflow, ErrInvalidInput, o.OnConflict)
		}
		if d := o.Debounce; d.Key != "" || d.Period != 0 || d.MaxWait != 0 {
			switch {
			case d.Key == "" || d.Period <= 0 || d.MaxWait < 0:
				return nil, fmt.Errorf("durable: %s (%s): %w: a debounce needs a key, a positive period and a max wait not negative", what, r.Workflow, ErrInvalidInput)
			case o.UniqueKey != "" || o.OnConflict != ConflictSkip || !o.RunAt.IsZero() || o.Delay != 0:
				return nil, fmt.Errorf("durable: %s (%s): %w: a debounced insert takes no UniqueKey, OnConflict, RunAt or Delay", what, r.Workflow, ErrInvalidInput)
			}
			if err := checkText("debounce key", d.Key, MaxUniqueKeyLength-len(store.DebounceUniqueKey(""))); err != nil {
				return nil, fmt.Errorf("durable: %s (%s): %w", what, r.Workflow, err)
			}
			o.Delay = d.FirstDelay()
		}
		runAt, delay := o.RunAt, time.Duration(0)
		if runAt.IsZero() {
			runAt, delay = e.after(max(o.Delay, 0))
		}
		rows = append(rows, store.NewInstance{
			ID: id, Workflow: def.name, Version: def.version, Queue: queue, Priority: o.Priority,
			Step: def.initial, State: state, Key: key, KeyIntent: keyIntent, Also: also, RunAt: runAt, Delay: delay,
			UniqueKey: o.UniqueKey, UniqueStatuses: o.UniqueStatuses, OnConflict: o.OnConflict, Debounce: o.Debounce, ParentID: parentID,
		})
	}
	if err := store.CheckBatchConflicts(rows); err != nil {
		return nil, fmt.Errorf("durable: insert: %w: %w", ErrInvalidInput, err)
	}
	return rows, nil
}

// encode JSON-encodes v, enforcing MaxPayloadBytes and refusing JSON that a
// store could not keep (see checkStorableJSON): such a value is an error for
// the caller, never a batch the store rejects.
func (e *Engine) encode(what string, v any) (json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrEncode, what, err)
	}
	if len(b) > e.cfg.MaxPayloadBytes {
		return nil, fmt.Errorf("%w: %s is %d bytes, limit %d", ErrPayloadTooLarge, what, len(b), e.cfg.MaxPayloadBytes)
	}
	if err := checkStorableJSON(b); err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrEncode, what, err)
	}
	return b, nil
}

// truncateForError shortens caller input quoted in an error message.
func truncateForError(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// checkKey applies the prefix-capture analysis to a key about to be used,
// against the limits stored for the whole fleet (they decide the key's K,
// whatever this engine's configuration says): a warning is logged once per
// key name, or returned as an error in Strict mode.
func (e *Engine) checkKey(k gate.ConcurrencyKey) error {
	if err := k.Err(); err != nil {
		return err
	}
	if k.IsZero() {
		return nil
	}
	w, found := e.keyLimits().Check(k)
	if !found {
		return nil
	}
	if e.cfg.Strict {
		return w.Error()
	}
	if e.recordWarning(w) {
		e.log.Warn("concurrency key prefix capture", "kind", w.Kind, "name", w.Name, "detail", w.Message)
	}
	return nil
}

// storedLimits caches the limits stored for the fleet that the key checks
// read (see readKeyLimits).
type storedLimits struct {
	mu     sync.Mutex
	limits gate.Limits
	ok     bool      // limits were read at least once
	at     time.Time // when they were last read (or tried)
}

// storedLimitsTTL is how long the engine's checks reuse the stored limits
// before reading them again: a limit synced by another process reaches
// Strict checks and warnings within it.
const storedLimitsTTL = 5 * time.Second

// keyLimits returns the fleet's stored limits (at most storedLimitsTTL
// old) with this engine's own configured limits over them; until the store
// has answered once, the engine's own configuration.
func (e *Engine) keyLimits() gate.Limits {
	c := &e.stored
	c.mu.Lock()
	if !c.at.IsZero() && time.Since(c.at) < storedLimitsTTL {
		defer c.mu.Unlock()
		if c.ok {
			return c.limits
		}
		return e.limits
	}
	c.at = time.Now()
	if c.ok {
		// A refresh: one caller reads the store while the others go on
		// with the limits read before, instead of queueing behind it.
		cached := c.limits
		c.mu.Unlock()
		if gl, ok := e.readKeyLimits(); ok {
			c.mu.Lock()
			c.limits = gl
			c.mu.Unlock()
			return gl
		}
		return cached
	}
	// The first read: every check waits for it.
	defer c.mu.Unlock()
	if gl, ok := e.readKeyLimits(); ok {
		c.limits, c.ok = gl, true
		return gl
	}
	return e.limits
}

// readKeyLimits reads the stored limits with this engine's own over them:
// the names' limits only when the store can read them apart, since the
// checks look names up (gate.Limits.Check) and the store may hold a
// per-key limit for each of many thousand tenants.
func (e *Engine) readKeyLimits() (gate.Limits, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	read := e.st.Limits
	if n, ok := e.st.(store.NameLimitsReader); ok {
		read = n.NameLimits
	}
	ls, err := read(ctx)
	if err == nil {
		var gl gate.Limits
		if gl, err = gate.NewLimits(e.withOwnLimits(ls)); err == nil {
			return gl, true
		}
	}
	e.log.Debug("read stored limits for key checks", "err", err)
	return gate.Limits{}, false
}

// withOwnLimits overlays this engine's configured limits, which it stores
// at Start (or has stored), on the stored ones.
func (e *Engine) withOwnLimits(stored []gate.Limit) []gate.Limit {
	if e.cfg.Limits == nil {
		return stored
	}
	own := e.limits.All()
	out := append([]gate.Limit{}, own...)
	for _, l := range stored {
		if _, mine := e.limits.Lookup(l.Name); !mine {
			out = append(out, l)
		}
	}
	return out
}

// forgetStoredLimits makes the next check read the stored limits again.
func (e *Engine) forgetStoredLimits() {
	e.stored.mu.Lock()
	e.stored.at = time.Time{}
	e.stored.mu.Unlock()
}

// recordWarning remembers w for Warnings and reports whether it is new.
func (e *Engine) recordWarning(w gate.Warning) bool {
	id := string(w.Kind) + "/" + w.Name
	e.mu.Lock()
	defer e.mu.Unlock()
	old, seen := e.warned[id]
	if !seen || w.Live > old.Live {
		e.warned[id] = w
	}
	return !seen
}

// Warnings returns the prefix-capture warnings this engine has seen (key
// names only, with the live instances a limit change affected), sorted by
// kind then name. Health adds those the store finds among live rows, for
// every engine sharing the store.
func (e *Engine) Warnings() []gate.Warning {
	e.mu.RLock()
	out := make([]gate.Warning, 0, len(e.warned))
	for _, w := range e.warned {
		out = append(out, w)
	}
	e.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// SignalOptions are the options of Signal.
type SignalOptions struct {
	// DedupKey makes a repeated signal with the same key a no-op.
	DedupKey string
}

// Signal sends a durable signal named name, with a JSON-encoded payload, to
// an instance. It is delivered (at least once) to the instance's first Await
// of that name, whether the instance awaits already or later. A duplicate
// dedup key is not an error. A missing instance is store.ErrNotFound, a
// terminal one store.ErrTerminal.
func (e *Engine) Signal(ctx context.Context, id, name string, payload any, opts SignalOptions) error {
	if err := e.checkOpen(); err != nil {
		return err
	}
	if err := checkName("signal name", name); err != nil {
		return fmt.Errorf("durable: signal: %w", err)
	}
	if err := checkText("signal dedup key", opts.DedupKey, MaxUniqueKeyLength); err != nil {
		return fmt.Errorf("durable: signal %s: %w", name, err)
	}
	var raw json.RawMessage
	if payload != nil {
		b, err := e.encode("signal payload", payload)
		if err != nil {
			return fmt.Errorf("durable: signal %s: %w", name, err)
		}
		raw = b
	}
	res, err := e.st.Signal(ctx, store.SignalRequest{InstanceID: id, Name: name, Payload: raw, DedupKey: opts.DedupKey, Now: e.storeNow()})
	if err != nil {
		return instanceErr("signal "+name+" to", "signal", id, err)
	}
	if res.Woke {
		e.wakeAll()
	}
	return nil
}

// Cancel makes a non-terminal instance canceled. A step of it that is
// running keeps its key's slot until it returns (or its lease expires): its
// context is cancelled at once (by a notification when another engine runs
// it, at that engine's next heartbeat at the latest), and its outcome, unless
// it finished the instance, makes the instance canceled. Until then Get
// shows it executing with CancelRequested set.
//
// An instance that has not started never starts once Cancel returns nil,
// even one reserved to run next in a busy key's slot (an engine may start
// such a row the moment the step before it ends, without asking the store):
// Cancel then waits until the engine that holds the reservation has given
// it back (the instance is canceled) or started it (it is running, and
// canceled as above), which takes a notification's round trip, a
// heartbeat at most, or the reservation's lease when that engine is gone.
// If ctx ends first, the cancel stays requested and Cancel returns an
// error that wraps ctx's.
//
// With CancelOptions.Children, Cancel cancels the instance and every one of
// its descendants (the children it spawned, theirs, and so on), each by
// the rules above, parents before children (store.CancelTree): a canceled
// parent spawns no more children, and it stays canceled as its children
// are. The instance being terminal already is then no error: its live
// descendants are canceled all the same.
func (e *Engine) Cancel(ctx context.Context, id string, opts CancelOptions) error {
	if err := e.checkOpen(); err != nil {
		return err
	}
	ids := []string{id}
	if opts.Children {
		var err error
		ids, err = store.CancelTree(ctx, e.st, id, e.storeNow())
		if err != nil {
			_ = e.canceled(ctx, ids) // those it did cancel; the error says what failed
			return instanceErr("cancel the tree of", "cancel", id, err)
		}
	} else if err := e.st.Cancel(ctx, id, e.storeNow()); err != nil {
		return instanceErr("cancel", "cancel", id, err)
	}
	if err := e.canceled(ctx, ids); err != nil {
		return err
	}
	for _, c := range ids {
		if err := e.awaitUnreserved(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// CancelOptions are the options of Engine.Cancel; the zero CancelOptions
// cancels the one instance.
type CancelOptions struct {
	// Children cancels the instance's descendants too, each by Cancel's
	// rules (see Engine.Cancel).
	Children bool
}

// canceled tells this engine's scheduler that the instances ids were
// canceled (a running step of theirs is stopped at once), or, while Tick
// drives the engine, gives back those a Tick holds and has not run, and
// wakes the engine's claims.
func (e *Engine) canceled(ctx context.Context, ids []string) error {
	e.mu.RLock()
	s, state := e.sched, e.state
	e.mu.RUnlock()
	if s != nil {
		for _, id := range ids {
			s.Canceled(id)
		}
	}
	var errs []error
	if state == stateNew {
		for _, id := range ids {
			if err := e.rt.TickCanceled(ctx, id); err != nil {
				errs = append(errs, instanceErr("cancel", "cancel", id, err))
			}
		}
	}
	e.wakeAll()
	return errors.Join(errs...)
}

// awaitUnreserved waits, after a Cancel, until instance id is no longer a
// reservation (store.Claimed.After: blocked, with a worker), for at most
// the lease: its worker gives it back (canceled) or starts it. See Cancel.
func (e *Engine) awaitUnreserved(ctx context.Context, id string) error {
	deadline := time.Now().Add(e.cfg.Lease)
	wait := time.Millisecond
	for {
		in, err := e.st.Get(ctx, id)
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("durable: cancel %s: requested, but whether the engine that reserved it to run next gave it back is unknown: %w", id, ctx.Err())
		}
		if err != nil || in.Status != store.StatusBlocked || in.Worker == "" || time.Now().After(deadline) {
			return nil // gone, given back or started; or its worker is gone and cannot start it
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("durable: cancel %s: requested, but the engine that reserved it to run next has not given it back yet: %w", id, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// Retry makes a failed or canceled instance ready again at the step it
// ended on, attempt 0.
func (e *Engine) Retry(ctx context.Context, id string) error {
	if err := e.checkOpen(); err != nil {
		return err
	}
	if err := e.st.Retry(ctx, id, e.storeNow()); err != nil {
		return instanceErr("retry", "retry", id, err)
	}
	e.wakeAll()
	return nil
}

// instanceError is an error of an operation on one instance: a message
// with one prefix that names the operation and the id, wrapping the
// store's error (so errors.Is finds its sentinel).
type instanceError struct {
	msg string
	err error
}

func (e *instanceError) Error() string { return e.msg }
func (e *instanceError) Unwrap() error { return e.err }

// instanceErr wraps the store's error err of operation op (as the engine
// says it) on instance id. A store names the operation and the id too
// (storeOp, as in "get <id>: instance not found"); that prefix is dropped
// so that the message says each once. An id that is not a UUID is said to
// be one, rather than reported as a missing instance.
func instanceErr(op, storeOp, id string, err error) error {
	if _, perr := uuid.Parse(id); perr != nil {
		return &instanceError{msg: fmt.Sprintf("durable: %s: %q is not an instance id (a UUID)", op, id), err: err}
	}
	text := strings.TrimPrefix(err.Error(), storeOp+" "+id+": ")
	return &instanceError{msg: fmt.Sprintf("durable: %s %s: %s", op, id, text), err: err}
}

// Get returns an instance: status, step, state, attempt, last error, key.
func (e *Engine) Get(ctx context.Context, id string) (Instance, error) {
	inst, err := e.st.Get(ctx, id)
	if err != nil {
		return Instance{}, instanceErr("get", "get", id, err)
	}
	return viewOf(inst), nil
}

// Wait blocks until the instance is terminal (or ctx is done) and returns it.
// A store that is unreachable for a while does not end the wait: Wait keeps
// polling with backoff, and if ctx ends first its error names the last store
// error. A missing instance (store.ErrNotFound), a refused id
// (store.ErrInvalid) or a closed store (store.ErrClosed) returns at once.
func (e *Engine) Wait(ctx context.Context, id string) (Instance, error) {
	delay := 5 * time.Millisecond
	var last Instance
	var storeErr error
	for {
		e.mu.RLock()
		flushed := e.flushed
		e.mu.RUnlock()
		inst, err := e.Get(ctx, id)
		switch {
		case err == nil:
			if inst.Status.Terminal() {
				return inst, nil
			}
			last, storeErr = inst, nil
		case ctx.Err() != nil:
			if storeErr == nil {
				storeErr = err
			}
		case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrInvalid), errors.Is(err, store.ErrClosed):
			return inst, err
		default:
			storeErr = err
			delay = max(delay, 100*time.Millisecond)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			if storeErr != nil {
				return last, fmt.Errorf("durable: wait %s: %w (last store error: %v)", id, ctx.Err(), storeErr)
			}
			return last, ctx.Err()
		case <-flushed:
		case <-t.C:
		}
		t.Stop()
		delay = min(delay*2, time.Second)
		if storeErr == nil {
			delay = min(delay, 250*time.Millisecond)
		}
	}
}

// ErrFailed is wrapped by Result when the instance failed or was canceled.
var ErrFailed = errors.New("instance did not succeed")

// Result waits for the instance and decodes its Done result into T. A failed
// or canceled instance returns an error wrapping ErrFailed with its last error.
func Result[T any](ctx context.Context, e *Engine, id string) (T, error) {
	var out T
	inst, err := e.Wait(ctx, id)
	if err != nil {
		return out, err
	}
	if inst.Status != store.StatusDone {
		return out, fmt.Errorf("durable: %s is %s: %w: %s", id, inst.Status, ErrFailed, inst.LastError)
	}
	if len(inst.Result) > 0 {
		if err := json.Unmarshal(inst.Result, &out); err != nil {
			return out, fmt.Errorf("durable: decode result of %s: %w", id, err)
		}
	}
	return out, nil
}

func (e *Engine) notifyFlushed() {
	e.mu.Lock()
	close(e.flushed)
	e.flushed = make(chan struct{})
	e.mu.Unlock()
}

func (e *Engine) wakeQueues(rows []store.NewInstance) {
	e.mu.RLock()
	s := e.sched
	e.mu.RUnlock()
	if s == nil {
		return
	}
	for _, r := range rows {
		s.Wake(r.Queue)
	}
}

func (e *Engine) wakeAll() {
	e.mu.RLock()
	s := e.sched
	e.mu.RUnlock()
	if s != nil {
		s.WakeAll()
	}
}
