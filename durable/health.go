package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// Health is what an operator needs to see at a glance: the store's queue and
// gate pressure, every prefix-capture warning, what the last reconciler
// sweep repaired and how many outcomes came back stale. Its JSON form is
// stable: every field is always present (lists as [], LastReconcile as
// null before the first sweep), durations are integer nanoseconds, and no
// field carries a key's id or an instance id.
type Health struct {
	// At is when the snapshot was taken (the engine's clock).
	At time.Time `json:"at"`
	// Queues and Gates are the store's (see store.Health): per queue its
	// ready, scheduled, blocked, executing, awaiting and failed rows, the
	// age of its oldest ready row and its fleet policy's pressure (limit,
	// active rows, blocked ready rows, saturated keys); per configured limit
	// its K, shards, active rows, blocked rows, saturated keys and the most
	// active rows on one key.
	Queues []store.QueueHealth `json:"queues"`
	Gates  []store.GateHealth  `json:"gates"`
	// RateLimits are the store's rate limits with their buckets, empty ones
	// (throttled keys) counted (see store.RateHealth).
	RateLimits []store.RateHealth `json:"rate_limits"`
	// Warnings are the prefix-capture warnings the store finds among live
	// rows merged with those this engine has seen (Engine.Warnings), one per
	// kind and key name, sorted by kind then name.
	Warnings []gate.Warning `json:"warnings"`
	// LastReconcile is what the most recent reconciler sweep of this engine
	// did (nil until one ran); ReconcileTotals adds up every sweep since the
	// engine was created. Only the engine holding the maintenance lease
	// sweeps (see Config.ReconcileInterval): the others report none.
	LastReconcile   *ReconcileHealth `json:"last_reconcile"`
	ReconcileTotals ReconcileHealth  `json:"reconcile_totals"`
	// StaleOutcomes counts this engine's outcomes that committed nothing
	// because their claim had been reaped or cancelled.
	StaleOutcomes int64 `json:"stale_outcomes"`
	// Skipped is the deployment skew this engine met: instances it claimed
	// and handed back, unchanged, because it does not know their workflow
	// version or step (a newer worker inserted them), per workflow, version
	// and step, sorted. Instances of a workflow it does not know at all are
	// never claimed by it; they show as ready rows (and the age of the
	// oldest) in Queues until a worker that knows them takes them.
	Skipped []SkewHealth `json:"skipped"`
	// HandedBack are the store's counts of the rows waiting after a
	// hand-back by any engine, per workflow version (see
	// store.Health.HandedBack): work no worker of the fleet has run yet
	// because the workers that claimed it do not know its version or step.
	HandedBack       []store.HandBackHealth `json:"handed_back"`
	HandedBackCapped bool                   `json:"handed_back_capped"`
	// Schedules are the stored schedules of every namespace, sorted by
	// name: the next fire time, and whether each is paused or late (a tick
	// due for longer than its grace that no engine recorded).
	Schedules []store.ScheduleHealth `json:"schedules"`
	// UnworkedQueues are the queues nobody works: queues with rows waiting
	// for a worker (ready, scheduled or blocked) that no running engine
	// has recorded claiming from within store.QueueWorkedWithin (see
	// store.UnworkedQueues), each with its waiting rows and the age of its
	// oldest ready row. Their rows wait until an engine whose
	// Config.Queues has the queue runs.
	UnworkedQueues []store.UnworkedQueue `json:"unworked_queues"`
	// PausedQueues are the paused queues (Engine.PauseQueue), sorted by
	// name, each with the rows waiting for its resume and the steps still
	// running from before the pause (see store.PausedQueues).
	PausedQueues []store.PausedQueue `json:"paused_queues"`
	// OldestSnapshot is the store's (see store.Health): the oldest
	// snapshot an open transaction or a replication slot keeps alive in
	// the database, which slows every claim while it is kept.
	OldestSnapshot store.SnapshotHealth `json:"oldest_snapshot"`
}

// SkewHealth counts the hand-backs of one unknown workflow version or step.
type SkewHealth struct {
	Workflow string `json:"workflow"`
	Version  int    `json:"version"`
	// Step is the unknown step ("" when the whole version is unknown).
	Step  string    `json:"step"`
	Count int64     `json:"count"`
	Last  time.Time `json:"last"`
}

// skewState records the hand-backs of this engine.
type skewState struct {
	mu   sync.Mutex
	seen map[SkewHealth]*SkewHealth // keyed by workflow, version, step
	// versions are the workflow versions (Step "") met so far.
	versions map[SkewHealth]bool
}

// record counts one hand-back and reports whether it is the first of its
// workflow version (any step), which is worth a log line.
func (s *skewState) record(workflow string, version int, step string, at time.Time) (first bool) {
	k := SkewHealth{Workflow: workflow, Version: version, Step: step}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[SkewHealth]*SkewHealth{}
		s.versions = map[SkewHealth]bool{}
	}
	v := SkewHealth{Workflow: workflow, Version: version}
	first = !s.versions[v]
	s.versions[v] = true
	h := s.seen[k]
	if h == nil {
		h = &SkewHealth{Workflow: workflow, Version: version, Step: step}
		s.seen[k] = h
	}
	h.Count++
	h.Last = at
	return first
}

func (s *skewState) snapshot() []SkewHealth {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SkewHealth, 0, len(s.seen))
	for _, h := range s.seen {
		out = append(out, *h)
	}
	slices.SortFunc(out, func(a, b SkewHealth) int {
		return cmp.Or(cmp.Compare(a.Workflow, b.Workflow), cmp.Compare(a.Version, b.Version), cmp.Compare(a.Step, b.Step))
	})
	return out
}

// ReconcileHealth is what reconciler sweeps did (see store.ReconcileReport).
type ReconcileHealth struct {
	// At is when the sweep ran (zero in totals).
	At time.Time `json:"at"`
	// CountersRepaired counts gate counter rows whose free slots did not
	// match their capacity minus their executing rows; Drift is the total
	// correction, in slots. Non-zero drift means a crash path (a reaped
	// lease, a lost outcome) under-credited a gate, which ran stricter than
	// its limit until the sweep.
	CountersRepaired int `json:"counters_repaired"`
	Drift            int `json:"drift"`
	// Promoted counts blocked rows made ready because their key had room.
	Promoted int `json:"promoted"`
	// CountersDeleted and InstancesDeleted are idle counters and expired
	// terminal rows removed.
	CountersDeleted  int `json:"counters_deleted"`
	InstancesDeleted int `json:"instances_deleted"`
	// BucketsDeleted counts idle rate buckets removed (full, so nothing
	// unearned is granted when they are created again).
	BucketsDeleted int `json:"buckets_deleted"`
}

func (r *ReconcileHealth) add(o ReconcileHealth) {
	r.CountersRepaired += o.CountersRepaired
	r.Drift += o.Drift
	r.Promoted += o.Promoted
	r.CountersDeleted += o.CountersDeleted
	r.InstancesDeleted += o.InstancesDeleted
	r.BucketsDeleted += o.BucketsDeleted
}

// reconcileState is the record of this engine's sweeps.
type reconcileState struct {
	mu     sync.Mutex
	last   *ReconcileHealth
	totals ReconcileHealth
}

func (s *reconcileState) record(at time.Time, rep store.ReconcileReport) {
	r := ReconcileHealth{At: at, CountersRepaired: rep.CountersRepaired, Drift: rep.Drift, Promoted: rep.Promoted,
		CountersDeleted: rep.CountersDeleted, InstancesDeleted: rep.InstancesDeleted, BucketsDeleted: rep.BucketsDeleted}
	s.mu.Lock()
	s.last = &r
	s.totals.add(r)
	s.mu.Unlock()
}

func (s *reconcileState) snapshot() (*ReconcileHealth, ReconcileHealth) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		return nil, s.totals
	}
	last := *s.last
	return &last, s.totals
}

// Health takes a snapshot of the store's pressure (one store.Health call,
// bounded in cost as the store documents, one read of the stored schedules
// and one of the worked queues, a row per queue) and adds what this engine
// knows:
// its warnings, its last reconciler sweep and its stale outcomes. It works
// whether or not the engine is started.
func (e *Engine) Health(ctx context.Context) (Health, error) {
	at := e.cfg.Clock.Now()
	sh, err := e.st.Health(ctx, e.storeNow())
	if err != nil {
		return Health{}, fmt.Errorf("durable: health: %w", err)
	}
	h := Health{At: at, Queues: sh.Queues, Gates: sh.Gates, StaleOutcomes: e.rt.StaleOutcomes(), OldestSnapshot: sh.OldestSnapshot}
	if h.Queues == nil {
		h.Queues = []store.QueueHealth{}
	}
	if h.Gates == nil {
		h.Gates = []store.GateHealth{}
	}
	h.RateLimits = sh.RateLimits
	if h.RateLimits == nil {
		h.RateLimits = []store.RateHealth{}
	}
	h.HandedBack, h.HandedBackCapped = sh.HandedBack, sh.HandedBackCapped
	if h.HandedBack == nil {
		h.HandedBack = []store.HandBackHealth{}
	}
	h.Warnings = mergeWarnings(sh.Warnings, e.Warnings())
	h.LastReconcile, h.ReconcileTotals = e.reconciled.snapshot()
	h.Skipped = e.skew.snapshot()
	scs, err := e.st.ListSchedules(ctx)
	if err != nil {
		return Health{}, fmt.Errorf("durable: health: %w", err)
	}
	h.Schedules = store.SchedulesHealth(scs, at)
	worked, err := e.st.WorkedQueues(ctx, e.storeNow())
	if err != nil {
		return Health{}, fmt.Errorf("durable: health: %w", err)
	}
	h.UnworkedQueues = store.UnworkedQueues(sh.Queues, worked)
	paused, err := e.st.PausedQueues(ctx)
	if err != nil {
		return Health{}, fmt.Errorf("durable: health: %w", err)
	}
	h.PausedQueues = store.PausedQueues(sh.Queues, paused)
	return h, nil
}

// mergeWarnings keeps one warning per kind and name (the first seen),
// sorted by kind then name.
func mergeWarnings(lists ...[]gate.Warning) []gate.Warning {
	out := []gate.Warning{}
	seen := map[string]bool{}
	for _, l := range lists {
		for _, w := range l {
			k := string(w.Kind) + "/" + w.Name
			if !seen[k] {
				seen[k] = true
				out = append(out, w)
			}
		}
	}
	slices.SortFunc(out, func(a, b gate.Warning) int {
		return cmp.Or(strings.Compare(string(a.Kind), string(b.Kind)), strings.Compare(a.Name, b.Name))
	})
	return out
}

// Reconcile runs one reconciler sweep now, as the background loop of a
// started engine does every ReconcileInterval: gate counters are repaired
// from the executing rows, blocked rows whose key has room are promoted,
// idle counters and terminal rows older than Retention are deleted. The
// sweep is recorded in Health.
func (e *Engine) Reconcile(ctx context.Context) (store.ReconcileReport, error) {
	if err := e.checkOpen(); err != nil {
		return store.ReconcileReport{}, err
	}
	return e.reconcile(ctx)
}

// reconcile runs and records one sweep (the maintenance loop's entry).
func (e *Engine) reconcile(ctx context.Context) (store.ReconcileReport, error) {
	retention := max(e.cfg.Retention, 0)
	now := e.storeNow()
	rep, err := e.st.Reconcile(ctx, retention, now)
	if n, werr := e.deleteByWorkflow(ctx, now); n > 0 || werr != nil {
		rep.InstancesDeleted += n
		err = errors.Join(err, werr)
	}
	if err != nil {
		return rep, fmt.Errorf("durable: reconcile: %w", err)
	}
	e.reconciled.record(e.cfg.Clock.Now(), rep)
	if rep.CountersRepaired > 0 || rep.Promoted > 0 {
		e.log.Info("reconciled", "counters_repaired", rep.CountersRepaired, "drift", rep.Drift, "promoted", rep.Promoted)
		e.wakeAll()
	}
	return rep, nil
}

// retentionChunk is how many terminal rows one statement of a workflow's
// own retention deletes.
const retentionChunk = 1000

// deleteByWorkflow applies the workflows' own retentions
// (WorkflowOptions.Retention), retentionChunk rows per store call, in
// workflow order; a workflow whose deletion fails does not stop the
// others.
func (e *Engine) deleteByWorkflow(ctx context.Context, now time.Time) (int, error) {
	rs := e.retentions()
	names := make([]string, 0, len(rs))
	for name := range rs {
		names = append(names, name)
	}
	slices.Sort(names)
	total := 0
	var errs []error
	for _, name := range names {
		before := cmp.Or(now, time.Now()).Add(-rs[name])
		var from time.Time // each chunk from where the last ended
		for {
			n, last, err := e.st.DeleteTerminal(ctx, name, from, before, retentionChunk)
			total += n
			if err != nil {
				errs = append(errs, fmt.Errorf("retention of %s: %w", name, err))
				break
			}
			if n < retentionChunk {
				break
			}
			from = last
		}
	}
	return total, errors.Join(errs...)
}

// healthCache serves the gauges: a Health snapshot reused for up to
// Config.HealthInterval, so that frequent metric collections cost one
// store Health call per interval, not one each.
type healthCache struct {
	mu    sync.Mutex
	taken time.Time // wall clock, not the engine's (a fake clock may stand still)
	h     Health
	ok    bool
}

// get returns a snapshot no older than ttl, taking a new one when needed.
// Concurrent callers wait for the one refresh in flight. A failed refresh
// returns false (and is retried at the next collection).
func (c *healthCache) get(ctx context.Context, ttl time.Duration, take func(context.Context) (Health, error)) (Health, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ok && time.Since(c.taken) < ttl {
		return c.h, true
	}
	h, err := take(ctx)
	if err != nil {
		return Health{}, false
	}
	c.h, c.taken, c.ok = h, time.Now(), true
	return h, true
}
