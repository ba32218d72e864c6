package periodic_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/periodic"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func TestParseRefusesBadInput(t *testing.T) {
	for _, c := range []struct{ expr, zone string }{
		{"", ""},
		{"* * *", ""},
		{"61 * * * *", ""},
		{"@every", ""},
		{"@fortnightly", ""},
		{"0 9 * * *", "Mars/Olympus"},
		{"CRON_TZ=UTC 0 9 * * *", ""},
		{"0 0 30 2 *", ""},
	} {
		_, err := periodic.Parse(c.expr, c.zone)
		require.Error(t, err, "%q in %q", c.expr, c.zone)
		require.True(t, errors.Is(err, periodic.ErrInvalid), "%v", err)
	}
}

func TestNextReadsFieldsInTheZone(t *testing.T) {
	s, err := periodic.Parse("0 9 * * *", "America/New_York")
	require.NoError(t, err)
	// 2026-03-08 is the spring-forward day in New York: 09:00 EST is 14:00
	// UTC the day before, 09:00 EDT is 13:00 UTC on the day.
	before := time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC)
	require.Equal(t, time.Date(2026, 3, 7, 14, 0, 0, 0, time.UTC), s.Next(before))
	require.Equal(t, time.Date(2026, 3, 8, 13, 0, 0, 0, time.UTC), s.Next(s.Next(before)))
}

func TestPlanAt(t *testing.T) {
	every5, err := periodic.Parse("@every 5m", "")
	require.NoError(t, err)
	m := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Minute) }
	for _, c := range []struct {
		name       string
		last, now  time.Time
		catchUp    periodic.CatchUp
		grace      time.Duration
		want       periodic.Plan
		wantTickAt time.Time
	}{
		{name: "nothing due before the first tick", now: m(4),
			want: periodic.Plan{Next: m(5)}},
		{name: "the first tick fires on time", now: m(5),
			want: periodic.Plan{Tick: m(5), Fire: true, Next: m(10)}},
		{name: "a tick fires a little late", last: m(5), now: m(10).Add(10 * time.Second),
			want: periodic.Plan{Tick: m(10), Fire: true, Next: m(15)}},
		{name: "missed ticks before the latest are dropped, the latest fires", last: m(5), now: m(30).Add(time.Second),
			want: periodic.Plan{Tick: m(30), Fire: true, Missed: true, Next: m(35)}},
		{name: "a late latest tick is skipped by default", last: m(5), now: m(33),
			want: periodic.Plan{Tick: m(30), Missed: true, Next: m(35)}},
		{name: "a late latest tick fires once with CatchUpOnce", last: m(5), now: m(33), catchUp: periodic.CatchUpOnce,
			want: periodic.Plan{Tick: m(30), Fire: true, Missed: true, Next: m(35)}},
		{name: "an explicit grace makes a late tick on time", last: m(25), now: m(33), grace: 4 * time.Minute,
			want: periodic.Plan{Tick: m(30), Fire: true, Next: m(35)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, every5.PlanAt(c.last, t0, c.now, c.catchUp, c.grace))
		})
	}
}

func TestLatestAfterALongOutageIsNotABurst(t *testing.T) {
	s, err := periodic.Parse("@every 1s", "")
	require.NoError(t, err)
	now := t0.Add(72 * time.Hour).Add(300 * time.Millisecond)
	p := s.PlanAt(t0, t0, now, periodic.CatchUpOnce, 0)
	require.True(t, p.Fire)
	require.True(t, p.Missed)
	require.Equal(t, t0.Add(72*time.Hour), p.Tick, "the latest tick, not the first missed")
	// The next plan from there has nothing due until the next tick.
	require.True(t, s.PlanAt(p.Tick, t0, now, periodic.CatchUpOnce, 0).Tick.IsZero())
}

func TestStatus(t *testing.T) {
	s, err := periodic.Parse("@hourly", "")
	require.NoError(t, err)
	next, late := s.Status(time.Time{}, t0, t0.Add(30*time.Minute), 0)
	require.Equal(t, t0.Add(time.Hour), next)
	require.False(t, late)
	next, late = s.Status(time.Time{}, t0, t0.Add(time.Hour+2*time.Minute), 0)
	require.Equal(t, t0.Add(time.Hour), next)
	require.True(t, late, "due for longer than a minute")
}

func TestTickKey(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	require.Equal(t, "schedule:report:2030-01-01T05:00:00Z", periodic.TickKey("report", time.Date(2030, 1, 1, 0, 0, 0, 0, ny)))
}

// Fixed-hour expressions fire once on both daylight-saving nights; an
// every-hour one follows elapsed time.
func TestNextAcrossDaylightSavingChanges(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	walk := func(expr string, from time.Time, n int) []string {
		s, err := periodic.Parse(expr, "America/New_York")
		require.NoError(t, err)
		var out []string
		for tk := from; len(out) < n; {
			tk = s.Next(tk)
			out = append(out, tk.In(ny).Format("01-02 15:04 MST"))
		}
		return out
	}
	spring, fall := time.Date(2026, 3, 6, 12, 0, 0, 0, ny), time.Date(2026, 10, 30, 12, 0, 0, 0, ny)

	require.Equal(t, []string{"03-07 02:30 EST", "03-08 03:00 EDT", "03-09 02:30 EDT"}, walk("30 2 * * *", spring, 3),
		"02:30 does not exist on 03-08: it fires once, when the clocks jump")
	require.Equal(t, []string{"10-31 02:30 EDT", "11-01 02:30 EST", "11-02 02:30 EST"}, walk("30 2 * * *", fall, 3))
	require.Equal(t, []string{"10-31 01:30 EDT", "11-01 01:30 EDT", "11-02 01:30 EST"}, walk("30 1 * * *", fall, 3),
		"01:30 happens twice on 11-01: it fires the first time only")
	require.Equal(t, []string{"03-07 01:30 EST", "03-08 01:30 EST", "03-09 01:30 EDT"}, walk("30 1 * * *", spring, 3))
	require.Equal(t, []string{"03-07 00:00 EST", "03-08 00:00 EST", "03-09 00:00 EDT"}, walk("@daily", spring, 3))
	require.Equal(t, []string{"03-08 03:00 EDT", "03-08 03:30 EDT"}, walk("*/30 2,3 * * *", time.Date(2026, 3, 8, 1, 0, 0, 0, ny), 2),
		"a jump over several named times fires once")

	require.Equal(t, []string{"03-08 01:30 EST", "03-08 03:30 EDT", "03-08 04:30 EDT"}, walk("30 * * * *", time.Date(2026, 3, 8, 1, 0, 0, 0, ny), 3),
		"every hour follows elapsed time")
	require.Equal(t, []string{"11-01 01:30 EDT", "11-01 01:30 EST", "11-01 02:30 EST"}, walk("30 * * * *", time.Date(2026, 11, 1, 1, 0, 0, 0, ny), 3))
}
