// Package periodic is the pure logic of periodic workflows: a cron
// expression in a time zone (parsed by github.com/robfig/cron/v3), and the
// plan that says, from a schedule's last fired tick and the time now, which
// tick (if any) fires now. Engines, the in-memory and PostgreSQL stores and
// the CLI all decide with the functions of this package, so a rule about
// ticks is written once.
//
// # Ticks
//
// A schedule's ticks are the times its cron expression names, in its time
// zone. The ticks that are due at now are those after the schedule's last
// recorded tick (or after its anchor, when it never fired: the time it was
// first stored or last resumed) and at or before now. At most one of them
// fires: the latest. The earlier ones were missed (every engine was down,
// or a deploy took longer than a tick); firing each of them would be a
// burst. The latest due tick is on time when now is at most Grace after it;
// when it is later, it was missed too, and the catch-up policy decides:
// CatchUpSkip records it without firing (the next instance runs at the next
// tick), CatchUpOnce fires it, once, for the whole missed window.
package periodic

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Overlap says what a tick does while the previous instance of the same
// schedule is still running (not terminal).
type Overlap string

// Overlap policies.
const (
	// OverlapAllow starts the tick's instance anyway (the default).
	OverlapAllow Overlap = "allow"
	// OverlapSkip records the tick without starting an instance.
	OverlapSkip Overlap = "skip"
	// OverlapQueue starts the instance under the schedule's concurrency key
	// (K = 1 unless its name has a limit), so it runs only after the
	// previous one has let go of the key.
	OverlapQueue Overlap = "queue"
)

// CatchUp says what happens to ticks that were missed (no engine fired
// them within Grace of their time).
type CatchUp string

// Catch-up policies.
const (
	// CatchUpSkip drops missed ticks: the next instance starts at the next
	// tick (the default).
	CatchUpSkip CatchUp = "skip"
	// CatchUpOnce starts one instance, at once, for the whole missed
	// window, whatever the number of ticks missed.
	CatchUpOnce CatchUp = "once"
)

// MaxGrace caps the default grace of a tick.
const MaxGrace = time.Minute

// ErrInvalid is wrapped by every error about a bad expression, time zone or policy.
var ErrInvalid = errors.New("invalid schedule")

// Spec is a parsed cron expression in a time zone. The zero Spec is not usable.
type Spec struct {
	expr  string
	zone  string
	sched cron.Schedule
}

var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Parse parses a standard five-field cron expression ("*/5 * * * *",
// "0 9 * * MON-FRI") or a descriptor ("@hourly", "@daily", "@weekly",
// "@monthly", "@yearly", "@every 5m") in the IANA time zone zone (empty:
// UTC). The expression's fields are read in that zone, so "0 9 * * *" is
// 09:00 local time on every day, across daylight-saving changes. A time
// zone prefix inside the expression (CRON_TZ=) is refused: name it in zone.
func Parse(expr, zone string) (Spec, error) {
	expr = strings.TrimSpace(expr)
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return Spec{}, fmt.Errorf("%w: cron %q: give the time zone separately, not inside the expression", ErrInvalid, expr)
	}
	loc := time.UTC
	if zone != "" {
		l, err := time.LoadLocation(zone)
		if err != nil {
			return Spec{}, fmt.Errorf("%w: time zone %q: %v", ErrInvalid, zone, err)
		}
		loc = l
	}
	s, err := parser.Parse(expr)
	if err != nil {
		return Spec{}, fmt.Errorf("%w: cron %q: %v (want five fields, minute hour day-of-month month day-of-week, or a descriptor such as @daily or @every 5m)", ErrInvalid, expr, err)
	}
	if ss, ok := s.(*cron.SpecSchedule); ok {
		ss.Location = loc
	}
	spec := Spec{expr: expr, zone: zone, sched: s}
	if spec.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
		return Spec{}, fmt.Errorf("%w: cron %q never fires", ErrInvalid, expr)
	}
	return spec, nil
}

// String returns the expression as given.
func (s Spec) String() string { return s.expr }

// Zone returns the time zone as given ("" for UTC).
func (s Spec) Zone() string { return s.zone }

// Next returns the first tick strictly after t, in UTC (zero: none within
// five years).
//
// Daylight-saving changes follow the classic cron rule for expressions
// with a fixed hour (any hour field but "*", and @daily, @weekly, ...): a
// time that falls in the hour skipped when clocks go forward fires once,
// at the first instant after the jump (02:30 on a spring-forward night is
// 03:00 new time), and a time in the hour repeated when clocks go back
// fires once, the first time. An expression with every hour ("30 * * * *",
// @hourly) follows elapsed time: it fires at each wall-clock match that
// exists, so once an hour either way.
func (s Spec) Next(t time.Time) time.Time {
	ss, ok := s.sched.(*cron.SpecSchedule)
	if !ok || ss.Hour&anyHour != 0 {
		return utc(s.sched.Next(t))
	}
	for {
		n := ss.Next(t)
		if n.IsZero() {
			return n
		}
		if g := skippedTick(ss, t, n); !g.IsZero() {
			return g.UTC()
		}
		if !repeated(ss.Location, n) {
			return n.UTC()
		}
		t = n
	}
}

// anyHour is the bit robfig/cron sets in a field parsed from "*" (or "?").
const anyHour = 1 << 63

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

// skippedTick returns the first instant after a forward jump of the clocks
// between t and n (exclusive of t, up to n) whose skipped wall-clock times
// include one the expression names (zero: none).
func skippedTick(ss *cron.SpecSchedule, t, n time.Time) time.Time {
	for cur := t; ; {
		_, end := cur.In(ss.Location).ZoneBounds()
		if end.IsZero() || end.After(n) {
			return time.Time{}
		}
		_, before := end.Add(-time.Second).In(ss.Location).Zone()
		_, after := end.In(ss.Location).Zone()
		if after > before {
			// The wall clock jumps from end (read at the old offset) by
			// after − before; the expression's fields are read in a zone
			// frozen at the old offset to see whether it names one of them.
			frozen := *ss
			frozen.Location = time.FixedZone("", before)
			first := end.In(frozen.Location)
			for w := first; w.Before(first.Add(time.Duration(after-before) * time.Second)); w = w.Add(time.Minute) {
				if frozen.Next(w.Add(-time.Second)).Equal(w) {
					return end
				}
			}
		}
		cur = end
	}
}

// repeated reports whether the wall-clock time of n in loc already
// happened once, earlier, before the clocks went back.
func repeated(loc *time.Location, n time.Time) bool {
	_, now := n.In(loc).Zone()
	_, earlier := n.Add(-6 * time.Hour).In(loc).Zone()
	if earlier <= now {
		return false
	}
	first := n.Add(-time.Duration(earlier-now) * time.Second)
	a, b := first.In(loc), n.In(loc)
	return a.Year() == b.Year() && a.YearDay() == b.YearDay() && a.Hour() == b.Hour() && a.Minute() == b.Minute() && a.Second() == b.Second()
}

// Grace is how late a tick may fire and still be on time: grace when
// positive, else half the interval from tick to the next tick, at most
// MaxGrace.
func (s Spec) Grace(tick time.Time, grace time.Duration) time.Duration {
	if grace > 0 {
		return grace
	}
	n := s.Next(tick)
	if n.IsZero() {
		return MaxGrace
	}
	return min(n.Sub(tick)/2, MaxGrace)
}

// ValidOverlap checks an overlap policy ("" is the default, OverlapAllow).
func ValidOverlap(o Overlap) error {
	switch o {
	case "", OverlapAllow, OverlapSkip, OverlapQueue:
		return nil
	}
	return fmt.Errorf("%w: overlap policy %q (want allow, skip or queue)", ErrInvalid, o)
}

// ValidCatchUp checks a catch-up policy ("" is the default, CatchUpSkip).
func ValidCatchUp(c CatchUp) error {
	switch c {
	case "", CatchUpSkip, CatchUpOnce:
		return nil
	}
	return fmt.Errorf("%w: catch-up policy %q (want skip or once)", ErrInvalid, c)
}

// Plan is what one schedule does at one time.
type Plan struct {
	// Tick is the tick to record as the schedule's last (zero: nothing is
	// due yet).
	Tick time.Time
	// Fire is true when an instance starts for Tick; false with a non-zero
	// Tick means the tick is recorded as skipped (missed, CatchUpSkip).
	Fire bool
	// Missed is true when at least one due tick is not run: Tick's
	// predecessors since the last fired tick, or Tick itself when it is late.
	Missed bool
	// Next is the first tick after Tick (after the base when nothing is
	// due): when to look again.
	Next time.Time
}

// walkLimit bounds the ticks Latest steps through one by one before it
// searches back from now instead (a long outage of a frequent schedule).
const walkLimit = 1024

// Latest returns the latest tick after base and at or before now (zero:
// none), and whether any tick after base comes before it.
func (s Spec) Latest(base, now time.Time) (tick time.Time, earlier bool) {
	t := s.Next(base)
	if t.IsZero() || t.After(now) {
		return time.Time{}, false
	}
	for steps := 0; ; steps++ {
		n := s.Next(t)
		if n.IsZero() || n.After(now) {
			return t, earlier
		}
		earlier, t = true, n
		if steps == walkLimit {
			// Jump close to now: the first tick after now − span, for the
			// smallest doubling span that has one at or before now.
			for span := time.Second; span < 20*365*24*time.Hour; span *= 2 {
				if c := s.Next(now.Add(-span)); !c.IsZero() && !c.After(now) && c.After(t) {
					t = c
					break
				}
			}
		}
	}
}

// PlanAt decides what a schedule does at now. last is the last recorded
// tick (zero: never), anchor the time the schedule's ticks count from when
// it has none (or when it was resumed after last), grace as for Spec.Grace.
func (s Spec) PlanAt(last, anchor, now time.Time, catchUp CatchUp, grace time.Duration) Plan {
	base := last
	if anchor.After(base) {
		base = anchor
	}
	tick, earlier := s.Latest(base, now)
	if tick.IsZero() {
		return Plan{Next: s.Next(base)}
	}
	late := now.Sub(tick) > s.Grace(tick, grace)
	p := Plan{Tick: tick, Fire: true, Missed: earlier || late, Next: s.Next(tick)}
	if late && catchUp != CatchUpOnce {
		p.Fire = false
	}
	return p
}

// Status is what an operator sees of a schedule at now: the next tick to
// fire (the first due one when it is overdue), and whether it is late (due
// for longer than its grace and not fired yet).
func (s Spec) Status(last, anchor, now time.Time, grace time.Duration) (next time.Time, late bool) {
	base := last
	if anchor.After(base) {
		base = anchor
	}
	next = s.Next(base)
	if next.IsZero() || next.After(now) {
		return next, false
	}
	return next, now.Sub(next) > s.Grace(next, grace)
}

// TickKey is the unique key of a tick's instance: the schedule's name and
// the tick in RFC 3339 (UTC), so that however many engines fire one tick,
// one instance starts.
func TickKey(name string, tick time.Time) string {
	return "schedule:" + name + ":" + tick.UTC().Format(time.RFC3339)
}
