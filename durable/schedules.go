package durable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/periodic"
	"github.com/godurable/godurable/store"
)

// Overlap and catch-up policies of a Schedule (see package periodic).
const (
	OverlapAllow = periodic.OverlapAllow
	OverlapSkip  = periodic.OverlapSkip
	OverlapQueue = periodic.OverlapQueue
	CatchUpSkip  = periodic.CatchUpSkip
	CatchUpOnce  = periodic.CatchUpOnce
)

// ScheduleKeyName is the name of the concurrency key a Schedule with
// OverlapQueue and no Key of its own runs under: gate.Identity(ScheduleKeyName, name).
const ScheduleKeyName = "schedule"

// Schedule starts an instance of a workflow at every tick of a cron
// expression, once per tick however many engines run it: the tick's time is
// part of the instance's unique key, and the store records each tick with a
// compare-and-set, so a second engine firing the same tick inserts nothing.
// Missed ticks (every engine down, a long deploy) never cause a burst: see
// package periodic for the catch-up rules.
//
// Schedules are the namespace's desired state in the store, synced at Start
// like Config.Limits; pause and resume them with Engine.PauseSchedule or
// `durable schedules pause|resume NAME` (the pause is stored and survives
// re-syncs).
type Schedule struct {
	// Name identifies the schedule across the fleet (required).
	Name string
	// Workflow is the registered workflow each tick starts (required).
	Workflow string
	// Cron is a five-field expression ("0 9 * * MON-FRI") or a descriptor
	// ("@hourly", "@daily", "@every 5m"), read in TimeZone (an IANA name,
	// default UTC): "0 9 * * *" in America/New_York is 09:00 there every
	// day, across daylight-saving changes.
	Cron     string
	TimeZone string
	// State is the state of every tick's instance; StateAt, when set,
	// gives it from the tick's time instead. An error from StateAt leaves
	// the tick unrecorded: it is tried again (and may become missed).
	State   any
	StateAt func(tick time.Time) (any, error)
	// Key (or Keys, for an instance of several keys: see
	// InsertOptions.Keys), Queue and Priority are the insert options of
	// every tick's instance (Queue default: the workflow's).
	Key      gate.ConcurrencyKey
	Keys     []gate.ConcurrencyKey
	Queue    string
	Priority int
	// UniqueStatuses is the scope of the tick's unique key (default: every
	// status, so a finished tick's instance still holds it).
	UniqueStatuses []store.Status
	// Overlap is what a tick does while the previous tick's instance is
	// still running: OverlapAllow (default) starts it anyway, OverlapSkip
	// records the tick without starting it, OverlapQueue starts it under
	// the schedule's concurrency key (Key, default
	// gate.Identity(ScheduleKeyName, Name) when neither Key nor Keys is
	// set), so it runs once the previous one lets go of the key. A key is let go while its instance awaits or
	// sleeps, so OverlapQueue serializes the steps, not the whole runs, of
	// a workflow that parks; use OverlapSkip to keep whole runs apart.
	Overlap periodic.Overlap
	// CatchUp is what missed ticks do: CatchUpSkip (default) waits for the
	// next tick, CatchUpOnce starts one instance for the whole missed window.
	CatchUp periodic.CatchUp
	// Grace is how late a tick may start and still be on time (default:
	// half the time to the next tick, at most a minute).
	Grace time.Duration
}

// allStatuses is the default scope of a tick's unique key.
var allStatuses = []store.Status{store.StatusReady, store.StatusBlocked, store.StatusExecuting, store.StatusAwaiting,
	store.StatusChildren, store.StatusDone, store.StatusFailed, store.StatusCanceled}

// stored is the schedule's definition as the store keeps it; its keys are
// valid (see validateSchedules).
func (s Schedule) stored() store.Schedule {
	keys, _ := insertKeys(s.Key, s.Keys)
	if len(keys) == 0 && s.Overlap == periodic.OverlapQueue {
		keys = []gate.ConcurrencyKey{gate.Identity(ScheduleKeyName, s.Name)}
	}
	key, intent, also, _ := storeKeys(keys)
	return store.Schedule{Name: s.Name, Workflow: s.Workflow, Cron: s.Cron, TimeZone: s.TimeZone, Queue: s.Queue,
		Priority: s.Priority, Key: key, KeyIntent: intent, Also: also, UniqueStatuses: s.UniqueStatuses,
		Overlap: s.Overlap, CatchUp: s.CatchUp, Grace: s.Grace}
}

// validateSchedules checks Config.Schedules at New.
func validateSchedules(namespace string, scs []Schedule) (map[string]Schedule, error) {
	out := map[string]Schedule{}
	defs := make([]store.Schedule, 0, len(scs))
	for _, s := range scs {
		if err := checkName("schedule name", s.Name); err != nil {
			return nil, fmt.Errorf("durable: schedule: %w", err)
		}
		if _, err := insertKeys(s.Key, s.Keys); err != nil {
			return nil, fmt.Errorf("durable: schedule %q: %w", s.Name, err)
		}
		if s.StateAt != nil && s.State != nil {
			return nil, fmt.Errorf("durable: schedule %q: set State or StateAt, not both", s.Name)
		}
		defs = append(defs, s.stored())
		out[s.Name] = s
	}
	if _, err := store.ValidateSchedules(namespace, defs); err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	return out, nil
}

// SyncSchedules stores Config.Schedules as the namespace's schedules
// (Start does it; call it yourself to sync without starting, as
// durabletest does). Schedules the namespace owned and the configuration
// omits are removed; pause state and last ticks are kept. A nil
// Config.Schedules syncs nothing: an engine that does not mention
// schedules leaves the stored ones alone (it returns nil). A schedule of a
// workflow that is not registered is an error wrapping ErrUnknownWorkflow.
func (e *Engine) SyncSchedules(ctx context.Context) ([]StoredSchedule, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	if e.cfg.Schedules == nil {
		return nil, nil
	}
	defs := make([]store.Schedule, 0, len(e.cfg.Schedules))
	for _, s := range e.cfg.Schedules {
		e.mu.RLock()
		def := e.latest[s.Workflow]
		e.mu.RUnlock()
		if def == nil {
			return nil, fmt.Errorf("durable: schedule %q: %w %q (register it before Start)", s.Name, ErrUnknownWorkflow, s.Workflow)
		}
		defs = append(defs, s.stored())
	}
	out, err := e.st.SyncSchedules(ctx, e.cfg.Namespace, defs, store.SyncOptions{})
	if err != nil {
		return nil, fmt.Errorf("durable: sync schedules of namespace %q: %w", e.cfg.Namespace, err)
	}
	return storedSchedules(out), nil
}

// PauseSchedule pauses (paused true) or resumes a stored schedule, of any
// namespace, fleet-wide and at once: no tick fires while it is paused, and
// a resumed schedule fires from the next tick after now (the ticks of the
// pause are not missed ticks). A missing name is store.ErrScheduleNotFound.
func (e *Engine) PauseSchedule(ctx context.Context, name string, paused bool) (StoredSchedule, error) {
	if err := e.checkOpen(); err != nil {
		return StoredSchedule{}, err
	}
	sc, err := e.st.PauseSchedule(ctx, name, paused, e.storeNow())
	if err != nil {
		return StoredSchedule{}, fmt.Errorf("durable: %w", err)
	}
	return storedSchedule(sc), nil
}

// ListSchedules returns every stored schedule, of every namespace, sorted by name.
func (e *Engine) ListSchedules(ctx context.Context) ([]StoredSchedule, error) {
	out, err := e.st.ListSchedules(ctx)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	return storedSchedules(out), nil
}

// StoredSchedule is a schedule as the store keeps it for every engine: its
// definition as last synced (see Schedule) and the state the fleet shares
// (pause, last tick). The compare-and-set token engines fire ticks with
// (store.Schedule.Epoch) is the store's and is not shown.
type StoredSchedule struct {
	// Name identifies the schedule; Namespace is the namespace that owns it.
	Name      string
	Namespace string
	// Workflow, Cron, TimeZone ("" is UTC), Queue ("" is the workflow's),
	// Priority, Key and KeyIntent, Also (the other keys of a schedule of
	// several, in the store's order), UniqueStatuses, Overlap, CatchUp and
	// Grace are the definition as synced (see Schedule).
	Workflow       string
	Cron           string
	TimeZone       string
	Queue          string
	Priority       int
	Key            string
	KeyIntent      gate.Intent
	Also           []store.KeyRef
	UniqueStatuses []store.Status
	Overlap        periodic.Overlap
	CatchUp        periodic.CatchUp
	Grace          time.Duration
	// Paused schedules fire nothing; a sync never changes it.
	Paused bool
	// Anchor is when ticks start counting when LastTick is older: when the
	// schedule was first stored, or last resumed.
	Anchor time.Time
	// LastTick is the last tick recorded, fired or skipped (zero: none).
	LastTick time.Time
	// LastInstance is the instance of the last fired tick ("" : none) and
	// LastFiredAt when it was recorded (zero: never).
	LastInstance string
	LastFiredAt  time.Time
}

func storedSchedule(sc store.Schedule) StoredSchedule {
	return StoredSchedule{Name: sc.Name, Namespace: sc.Namespace, Workflow: sc.Workflow, Cron: sc.Cron, TimeZone: sc.TimeZone,
		Queue: sc.Queue, Priority: sc.Priority, Key: sc.Key, KeyIntent: sc.KeyIntent, Also: sc.Also, UniqueStatuses: sc.UniqueStatuses,
		Overlap: sc.Overlap, CatchUp: sc.CatchUp, Grace: sc.Grace, Paused: sc.Paused, Anchor: sc.Anchor,
		LastTick: sc.LastTick, LastInstance: sc.LastInstance, LastFiredAt: sc.LastFiredAt}
}

func storedSchedules(scs []store.Schedule) []StoredSchedule {
	if scs == nil {
		return nil
	}
	out := make([]StoredSchedule, len(scs))
	for i, sc := range scs {
		out[i] = storedSchedule(sc)
	}
	return out
}

// scheduleRound is what one fireSchedules did.
type scheduleRound struct {
	// started counts the instances started.
	started int
	// next is when a schedule is next due (zero: none).
	next time.Time
	// storeErr is the first store call that failed (the loop retries with
	// the engine's outage handling); errs are the schedules that could not
	// fire for another reason (their state, an unknown workflow).
	storeErr error
	errs     error
}

// fireSchedules fires the due ticks of this engine's schedules: for each
// stored schedule of its namespace that its Config names and that is not
// paused, it plans from the stored last tick (periodic.Spec.PlanAt) and
// records the plan with store.FireSchedule.
func (e *Engine) fireSchedules(ctx context.Context) scheduleRound {
	var r scheduleRound
	if len(e.schedules) == 0 {
		return r
	}
	stored, err := e.st.ListSchedules(ctx)
	if err != nil {
		r.storeErr = fmt.Errorf("schedules: %w", err)
		return r
	}
	now := e.cfg.Clock.Now()
	var errs []error
	for _, sc := range stored {
		local, ok := e.schedules[sc.Name]
		if !ok || sc.Namespace != e.cfg.Namespace || sc.Paused {
			continue
		}
		spec, err := sc.Spec()
		if err != nil {
			errs = append(errs, fmt.Errorf("schedule %q: %w", sc.Name, err))
			continue
		}
		plan := spec.PlanAt(sc.LastTick, sc.Anchor, now, sc.CatchUp, sc.Grace)
		due := plan.Next
		if !plan.Tick.IsZero() {
			out := e.fireTick(ctx, sc, local, plan)
			if out.started {
				r.started++
			}
			if out.storeErr != nil && r.storeErr == nil {
				r.storeErr = out.storeErr
			}
			if out.err != nil {
				errs = append(errs, out.err)
			}
			switch {
			case out.storeErr != nil:
				due = now.Add(e.cfg.PollInterval)
			case out.err != nil: // a bug to fix, not a blip: retried, and logged, less often
				due = now.Add(10 * e.cfg.PollInterval)
			case out.stale:
				// Another engine recorded the tick, or the schedule changed
				// under this plan: read it again at once rather than at the
				// next tick, so that a change never costs a tick.
				due = now
			}
		}
		if !due.IsZero() && (r.next.IsZero() || due.Before(r.next)) {
			r.next = due
		}
	}
	r.errs = errors.Join(errs...)
	return r
}

// tickOutcome is what fireTick did.
type tickOutcome struct {
	// started is true when the tick's instance was inserted.
	started bool
	// stale is true when the store refused the plan (see store.FireResult).
	stale bool
	// storeErr is a failed store call; err another reason the tick could
	// not fire.
	storeErr, err error
}

// fireTick records one planned tick.
func (e *Engine) fireTick(ctx context.Context, sc store.Schedule, local Schedule, plan periodic.Plan) tickOutcome {
	// The instance runs at its tick by the store's clock (RunAt): an engine
	// whose clock runs ahead of the database's never starts one early.
	req := store.FireRequest{Name: sc.Name, Epoch: sc.Epoch, Tick: plan.Tick, Now: e.storeNow(),
		SkipIfRunning: sc.Overlap == periodic.OverlapSkip}
	var rows []store.NewInstance
	if plan.Fire {
		state := local.State
		if local.StateAt != nil {
			s, err := local.StateAt(plan.Tick)
			if err != nil {
				return tickOutcome{err: fmt.Errorf("schedule %q: state of tick %s: %w", sc.Name, plan.Tick.Format(time.RFC3339), err)}
			}
			state = s
		}
		keys, err := rowKeys(store.Instance{Key: sc.Key, KeyIntent: sc.KeyIntent, Also: sc.Also})
		if err != nil {
			return tickOutcome{err: fmt.Errorf("schedule %q: %w", sc.Name, err)}
		}
		scope := sc.UniqueStatuses
		if len(scope) == 0 {
			scope = allStatuses
		}
		rows, err = e.prepareInserts([]InsertRequest{{Workflow: sc.Workflow, State: state, Options: InsertOptions{
			Keys: keys, Queue: sc.Queue, Priority: sc.Priority, RunAt: plan.Tick,
			UniqueKey: periodic.TickKey(sc.Name, plan.Tick), UniqueStatuses: scope}}}, "")
		if err != nil {
			return tickOutcome{err: fmt.Errorf("schedule %q: %w", sc.Name, err)}
		}
		req.Instance = &rows[0]
	}
	res, err := e.st.FireSchedule(ctx, req)
	if errors.Is(err, store.ErrInvalid) {
		return tickOutcome{err: fmt.Errorf("schedule %q: %w", sc.Name, err)}
	}
	if err != nil {
		return tickOutcome{storeErr: fmt.Errorf("schedule %q: %w", sc.Name, err)}
	}
	if res.Stale {
		return tickOutcome{stale: true} // another engine recorded it, or the schedule changed
	}
	tick := plan.Tick.Format(time.RFC3339)
	late := e.cfg.Clock.Now().Sub(plan.Tick)
	switch {
	case plan.Missed && !plan.Fire:
		e.log.Warn("schedule missed ticks; skipped to the next tick", "schedule", sc.Name, "last_missed", tick, "next", plan.Next)
	case plan.Missed:
		e.log.Warn("schedule missed ticks; running once for the missed window", "schedule", sc.Name, "tick", tick)
	}
	switch {
	case res.SkippedRunning:
		e.tel.scheduleTick(ctx, sc.Name, sc.Workflow, ScheduleSkipRunning, late)
		e.log.Info("schedule tick skipped: the previous run is still going", "schedule", sc.Name, "tick", tick, "running", res.Schedule.LastInstance)
		return tickOutcome{}
	case !plan.Fire:
		e.tel.scheduleTick(ctx, sc.Name, sc.Workflow, ScheduleSkipMissed, late)
		return tickOutcome{}
	case res.Inserted == "" || res.Duplicate:
		e.tel.scheduleTick(ctx, sc.Name, sc.Workflow, ScheduleSkipDuplicate, late)
		return tickOutcome{}
	}
	e.tel.scheduleTick(ctx, sc.Name, sc.Workflow, "", late)
	e.log.Debug("schedule fired", "schedule", sc.Name, "tick", tick, "instance", res.Inserted)
	e.wakeQueues(rows)
	return tickOutcome{started: true}
}
