package runtime

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestQueueFree pins how many rows a claim may take (queueRunner.free): one
// per executor, and rows ahead by the steps' and claims' measured times,
// less the rows outcomes hold while they wait for the flusher beyond n.
func TestQueueFree(t *testing.T) {
	q := func(step, claim time.Duration, busy, unflushed int64) *queueRunner {
		r := newQueueRunner("q", 10)
		r.stepNanos.Store(int64(step))
		r.claimNanos.Store(int64(claim))
		r.busy.Store(busy)
		r.unflushed.Store(unflushed)
		return r
	}
	grown := func(r *queueRunner, aheadCap int64) *queueRunner {
		r.aheadCap = aheadCap
		return r
	}
	for _, tc := range []struct {
		name string
		q    *queueRunner
		want int
	}{
		{"no step measured yet: one per executor", q(0, 0, 0, 0), 10},
		{"busy rows count", q(0, 0, 4, 0), 6},
		{"short steps: as many again", q(100*time.Microsecond, 3*time.Millisecond, 0, 0), 20},
		{"short steps: unflushed outcomes do not count", q(100*time.Microsecond, 3*time.Millisecond, 5, 500), 15},
		{"1 ms steps, 3 ms claims: n ahead (the cap at first)", q(time.Millisecond, 3*time.Millisecond, 0, 0), 20},
		{"1 ms steps, 3 ms claims, the cap grown to 2n: 2n ahead", grown(q(time.Millisecond, 3*time.Millisecond, 0, 0), 20), 30},
		{"1 ms steps, 8 ms claims, the cap grown to its most", grown(q(time.Millisecond, 8*time.Millisecond, 0, 0), 30), 40},
		{"10 ms steps, 3 ms claims: n × 3/10 ahead, the cap grown or not", grown(q(10*time.Millisecond, 3*time.Millisecond, 0, 0), 30), 13},
		{"10 ms steps, 3 ms claims: n × 3/10 ahead", q(10*time.Millisecond, 3*time.Millisecond, 0, 0), 13},
		{"steps much longer than a claim: nothing ahead", q(time.Second, 3*time.Millisecond, 0, 0), 10},
		{"unflushed up to n do not count", q(time.Millisecond, 3*time.Millisecond, 0, 10), 20},
		{"unflushed beyond n take rows ahead", q(time.Millisecond, 3*time.Millisecond, 0, 16), 14},
		{"far behind: no rows ahead, executors still fed", q(time.Millisecond, 3*time.Millisecond, 2, 100), 8},
		{"more busy than the limit: nothing", q(time.Second, 3*time.Millisecond, 12, 0), -2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.q.free())
		})
	}
}

// TestAdaptAhead pins how a queue's cap on rows ahead follows its claims
// (queueRunner.adaptAhead): from n, up by n/4 per clean claim (full, no row
// passed over) from the second in a row on, to aheadMax × n at most; held
// by a claim that passed an eighth of what it got over or less; back to n
// after any other.
func TestAdaptAhead(t *testing.T) {
	r := newQueueRunner("q", 8)
	type claim struct{ asked, got, passed int }
	clean := claim{10, 10, 0}
	for _, step := range []struct {
		name string
		c    claim
		want int64
	}{
		{"a first clean claim: the cap is n", clean, 8},
		{"a second: it grows by n/4", clean, 10},
		{"and on", clean, 12},
		{"a claim that passed a few rows over holds it", claim{20, 19, 2}, 12},
		{"so does a short claim passing nothing over (the queue ran dry)", claim{20, 5, 0}, 12},
		{"a clean claim after it: the first of a new run", clean, 12},
		{"the second", clean, 14},
		{"up to 3n", clean, 16},
		{"", clean, 18},
		{"", clean, 20},
		{"", clean, 22},
		{"", clean, 24},
		{"at most", clean, 24},
		{"a claim that passed many rows over: back to n", claim{20, 10, 5}, 8},
		{"clean again, the first", clean, 8},
		{"", clean, 10},
		{"a claim that found nothing: back to n", claim{20, 0, 0}, 8},
	} {
		r.adaptAhead(step.c.asked, step.c.got, step.c.passed)
		require.Equal(t, step.want, r.aheadCap, step.name)
	}
	require.Equal(t, (1+aheadMax)*8, cap(r.work), "the buffer holds all a claim may take")
}
