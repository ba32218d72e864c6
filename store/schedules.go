package store

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/periodic"
)

// ErrScheduleNotFound: no stored schedule by that name.
var ErrScheduleNotFound = errors.New("schedule not found")

// Schedule is a periodic workflow as stored: the definition a namespace
// syncs (its desired state) and the run-time state the store keeps across
// syncs (pause, last tick). See package periodic for what a tick is and
// how missed ticks are handled.
type Schedule struct {
	// Name identifies the schedule in the store; one namespace owns it.
	Name string `json:"name"`
	// Namespace is the owner (set by the store on the rows it returns).
	Namespace string `json:"namespace"`
	// Workflow is the workflow each tick starts.
	Workflow string `json:"workflow"`
	// Cron is the expression and TimeZone the IANA zone it is read in
	// ("" is UTC); see periodic.Parse.
	Cron     string `json:"cron"`
	TimeZone string `json:"time_zone,omitempty"`
	// Queue ("" is the workflow's), Priority, Key and KeyIntent, and Also
	// (the other keys of a tick's instance that holds several, in
	// NormalizeKeys' order) are the insert options of every tick's
	// instance.
	Queue     string      `json:"queue,omitempty"`
	Priority  int         `json:"priority,omitempty"`
	Key       string      `json:"key,omitempty"`
	KeyIntent gate.Intent `json:"key_intent,omitempty"`
	Also      []KeyRef    `json:"also,omitempty"`
	// UniqueStatuses is the scope of the tick's unique key (default: every
	// status, terminal ones included).
	UniqueStatuses []Status `json:"unique_statuses,omitempty"`
	// Overlap and CatchUp are the schedule's policies ("" is the default:
	// periodic.OverlapAllow, periodic.CatchUpSkip).
	Overlap periodic.Overlap `json:"overlap,omitempty"`
	CatchUp periodic.CatchUp `json:"catch_up,omitempty"`
	// Grace is how late a tick may fire and still be on time (zero: see
	// periodic.Spec.Grace).
	Grace time.Duration `json:"grace,omitempty"`

	// The fields below are the store's; a sync ignores them.

	// Paused schedules fire nothing. A sync never changes it.
	Paused bool `json:"paused"`
	// Anchor is when ticks start counting when LastTick is older: the time
	// the schedule was first stored, or last resumed.
	Anchor time.Time `json:"anchor"`
	// LastTick is the last tick recorded (fired or skipped); zero: none.
	LastTick time.Time `json:"last_tick,omitzero"`
	// LastInstance is the id of the instance of the last fired tick ("": none).
	LastInstance string `json:"last_instance,omitempty"`
	// LastFiredAt is when the store recorded LastInstance (zero: never).
	LastFiredAt time.Time `json:"last_fired_at,omitzero"`
	// Epoch changes on every fire, pause, resume and definition change:
	// FireSchedule compares it, so that of two engines planning the same
	// tick one records it.
	Epoch int64 `json:"epoch"`
}

// Spec parses the schedule's expression in its time zone.
func (s Schedule) Spec() (periodic.Spec, error) { return periodic.Parse(s.Cron, s.TimeZone) }

// SameDefinition reports whether two schedules have the same definition
// (the fields a sync sets).
func (s Schedule) SameDefinition(o Schedule) bool {
	if len(s.UniqueStatuses) != len(o.UniqueStatuses) {
		return false
	}
	for i := range s.UniqueStatuses {
		if s.UniqueStatuses[i] != o.UniqueStatuses[i] {
			return false
		}
	}
	return s.Name == o.Name && s.Workflow == o.Workflow && s.Cron == o.Cron && s.TimeZone == o.TimeZone &&
		s.Queue == o.Queue && s.Priority == o.Priority && s.Key == o.Key && s.KeyIntent == o.KeyIntent &&
		slices.Equal(s.Also, o.Also) && s.Overlap == o.Overlap && s.CatchUp == o.CatchUp && s.Grace == o.Grace
}

// Definition returns the fields of s a sync sets, the defaults filled in.
func (s Schedule) Definition() Schedule {
	d := Schedule{Name: s.Name, Workflow: s.Workflow, Cron: s.Cron, TimeZone: s.TimeZone, Queue: s.Queue,
		Priority: s.Priority, Key: s.Key, KeyIntent: s.KeyIntent, Also: slices.Clone(s.Also), Overlap: s.Overlap, CatchUp: s.CatchUp,
		Grace: s.Grace.Truncate(time.Microsecond)} // what PostgreSQL keeps
	if len(s.UniqueStatuses) > 0 {
		d.UniqueStatuses = append([]Status(nil), s.UniqueStatuses...)
	}
	if d.Overlap == "" {
		d.Overlap = periodic.OverlapAllow
	}
	if d.CatchUp == "" {
		d.CatchUp = periodic.CatchUpSkip
	}
	return d
}

// ValidateSchedules checks a namespace and its schedule definitions (no
// name twice, an expression that parses, known policies) and returns them
// with their defaults filled in.
func ValidateSchedules(namespace string, defs []Schedule) ([]Schedule, error) {
	if namespace == "" {
		return nil, errors.New("sync schedules: empty namespace")
	}
	seen := map[string]bool{}
	out := make([]Schedule, 0, len(defs))
	for _, d := range defs {
		switch {
		case d.Name == "":
			return nil, errors.New("schedule: empty name")
		case seen[d.Name]:
			return nil, fmt.Errorf("schedule %q defined twice", d.Name)
		case d.Workflow == "":
			return nil, fmt.Errorf("schedule %q: empty workflow", d.Name)
		case d.Grace < 0:
			return nil, fmt.Errorf("schedule %q: negative grace %s", d.Name, d.Grace)
		}
		seen[d.Name] = true
		if _, err := d.Spec(); err != nil {
			return nil, fmt.Errorf("schedule %q: %w", d.Name, err)
		}
		if err := periodic.ValidOverlap(d.Overlap); err != nil {
			return nil, fmt.Errorf("schedule %q: %w", d.Name, err)
		}
		if err := periodic.ValidCatchUp(d.CatchUp); err != nil {
			return nil, fmt.Errorf("schedule %q: %w", d.Name, err)
		}
		d.Also = slices.Clone(d.Also)
		if err := NormalizeKeys(&d.Key, &d.KeyIntent, &d.Also); err != nil {
			return nil, fmt.Errorf("schedule %q: %w", d.Name, err)
		}
		out = append(out, d.Definition())
	}
	return out, nil
}

// FireRequest records one tick of a schedule (see Store.FireSchedule).
type FireRequest struct {
	// Name is the schedule.
	Name string
	// Epoch is the schedule's Epoch the plan was made from.
	Epoch int64
	// Tick is the tick to record; it must be after the stored LastTick.
	Tick time.Time
	// Instance is the tick's instance (nil: record the tick as skipped).
	Instance *NewInstance
	// SkipIfRunning records the tick without inserting Instance while the
	// schedule's LastInstance is not terminal (periodic.OverlapSkip).
	SkipIfRunning bool
	// Now is the time of the record (zero: the store's clock).
	Now time.Time
}

// Accepts reports whether a fire request may record its tick on s: s is
// still at the request's Epoch, not paused, and the tick is after its last.
// Both stores decide with it, under the schedule's lock.
func (s Schedule) Accepts(req FireRequest) bool {
	return s.Epoch == req.Epoch && !s.Paused && req.Tick.After(s.LastTick)
}

// FireResult is what FireSchedule did.
type FireResult struct {
	// Stale is true when nothing was recorded: the schedule's Epoch was no
	// longer req.Epoch (another engine recorded the tick, or the schedule
	// was paused, resumed or changed), it is paused, or the tick is not
	// after its last.
	Stale bool
	// Inserted is the tick's instance id when one was inserted or was
	// already there (Duplicate: its unique key was taken).
	Inserted  string
	Duplicate bool
	// SkippedRunning is true when the tick was recorded without an instance
	// because the previous one was still running.
	SkippedRunning bool
	// Schedule is the stored schedule after the call.
	Schedule Schedule
}

// ScheduleHealth is what an operator sees of one stored schedule.
type ScheduleHealth struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Workflow  string `json:"workflow"`
	Cron      string `json:"cron"`
	TimeZone  string `json:"time_zone"`
	Paused    bool   `json:"paused"`
	// LastTick is the last tick recorded, fired or skipped (null: none).
	LastTick *time.Time `json:"last_tick"`
	// LastFiredAt is when the last tick's instance was started (null: never).
	LastFiredAt *time.Time `json:"last_fired_at"`
	// NextFire is the next tick to fire: the first due one when overdue
	// (null: paused, the expression no longer parses, or it never fires
	// again). A resumed schedule fires from the first tick after its resume.
	NextFire *time.Time `json:"next_fire"`
	// Late is true when a tick is due for longer than its grace and no
	// engine recorded it: no engine that runs the schedule is up, or they
	// cannot reach the store. A paused schedule is never late.
	Late bool `json:"late"`
	// Error is why NextFire is unknown ("" when known).
	Error string `json:"error,omitempty"`
}

// SchedulesHealth reports every schedule of scs at now, in their order.
func SchedulesHealth(scs []Schedule, now time.Time) []ScheduleHealth {
	out := make([]ScheduleHealth, 0, len(scs))
	opt := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		t = t.UTC()
		return &t
	}
	for _, sc := range scs {
		h := ScheduleHealth{Name: sc.Name, Namespace: sc.Namespace, Workflow: sc.Workflow, Cron: sc.Cron,
			TimeZone: sc.TimeZone, Paused: sc.Paused, LastTick: opt(sc.LastTick), LastFiredAt: opt(sc.LastFiredAt)}
		spec, err := sc.Spec()
		switch {
		case err != nil:
			h.Error = err.Error()
		case !sc.Paused:
			next, late := spec.Status(sc.LastTick, sc.Anchor, now, sc.Grace)
			h.NextFire, h.Late = opt(next), late
		}
		out = append(out, h)
	}
	return out
}
