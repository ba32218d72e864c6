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
		r := &queueRunner{n: 10}
		r.stepNanos.Store(int64(step))
		r.claimNanos.Store(int64(claim))
		r.busy.Store(busy)
		r.unflushed.Store(unflushed)
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
		{"1 ms steps, 3 ms claims: n ahead (the cap)", q(time.Millisecond, 3*time.Millisecond, 0, 0), 20},
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
