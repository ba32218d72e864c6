package enginetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
)

// PauseAcrossEngines runs three engines on queue
// "mail", polling every 200 ms, through a backlog of steps of six busy
// K = 1 keys (whose slots go from step to step by hand-offs and reserved
// successors, with no claim between), and pauses the queue with
// pause(true) while they run: no step starts later than the pause's return
// (its commit) plus one poll interval, the backlog waits, and after
// pause(false) it drains. Each step's start time is recorded in its body.
// It runs twice: with 3,000 steps of 2 ms, and with 60 steps of 300 ms on
// engines of 2 executors, which, all busy, cannot claim (a successor
// reserved before the pause would start after a poll interval, when the
// step ahead of it ends, if they did not look at the pause). pause may
// call the engine, the store or the CLI.
func PauseAcrossEngines(t *testing.T, newStore func() store.Store, pause func(t *testing.T, paused bool)) {
	t.Run("short steps", func(t *testing.T) { pauseAcrossEngines(t, newStore, pause, 4, 3000, 2*time.Millisecond, 200) })
	t.Run("long steps", func(t *testing.T) { pauseAcrossEngines(t, newStore, pause, 2, 60, 300*time.Millisecond, 12) })
}

// pauseAcrossEngines is PauseAcrossEngines with executors per engine and n
// steps of step each, paused once before of them have started.
func pauseAcrossEngines(t *testing.T, newStore func() store.Store, pause func(t *testing.T, paused bool), executors, n int, step time.Duration, before int) {
	const poll = 200 * time.Millisecond
	var (
		mu     sync.Mutex
		starts []time.Time
	)
	record := func(steps.Context) {
		at := time.Now()
		mu.Lock()
		starts = append(starts, at)
		mu.Unlock()
	}
	started := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(starts)
	}
	g := NewGauge()
	engines := fleet(t, newStore, 3, executors, durable.Config{PollInterval: poll, ReconcileInterval: time.Hour}, g, step, record)
	var keys []gate.ConcurrencyKey
	for i := range 6 {
		keys = append(keys, gate.Identity("acct", fmt.Sprint(i)))
	}
	ids := insertWork(t, engines[0], keys, n)
	ctx := context.Background()
	for _, e := range engines {
		require.NoError(t, e.Start(ctx))
	}
	deadline := time.Now().Add(30 * time.Second)
	for started() < before {
		require.True(t, time.Now().Before(deadline), "the fleet started %d steps in 30 s", started())
		time.Sleep(5 * time.Millisecond)
	}

	pause(t, true)
	paused := time.Now() // the pause has committed
	time.Sleep(5*poll + step)
	mu.Lock()
	var lastStart time.Duration
	for _, at := range starts {
		lastStart = max(lastStart, at.Sub(paused))
	}
	t.Logf("the last step started %s after the pause committed (poll interval %s)", lastStart, poll)
	late := slices.IndexFunc(starts, func(at time.Time) bool { return at.After(paused.Add(poll)) })
	ran := len(starts)
	var lateBy time.Duration
	if late >= 0 {
		lateBy = starts[late].Sub(paused)
	}
	mu.Unlock()
	require.Equal(t, -1, late, "a step started %s after the pause committed (poll interval %s)", lateBy, poll)
	require.Less(t, ran, n, "the backlog was not drained before the pause: the test proves nothing")
	// The steps running at the pause finish; their outcomes commit in the
	// flushers' next batches, which a loaded machine can delay past the
	// wait above, so the executing count is polled.
	var h durable.Health
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		h, err = engines[1].Health(ctx)
		require.NoError(t, err)
		require.Len(t, h.PausedQueues, 1)
		if h.PausedQueues[0].Executing == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, "mail", h.PausedQueues[0].Queue)
	require.Positive(t, h.PausedQueues[0].Ready+h.PausedQueues[0].Blocked, "its backlog waits: %+v", h.PausedQueues[0])
	require.Zero(t, h.PausedQueues[0].Executing, "the steps running at the pause have finished")
	mu.Lock()
	require.Equal(t, ran, len(starts), "a step started while the queue was paused")
	mu.Unlock()

	pause(t, false)
	waitDone(t, engines[2], ids, 60*time.Second)
	require.Equal(t, n, started(), "after the resume the backlog drained, each row once")
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, peak := range g.peakKy {
		require.Equal(t, 1, peak, "K = 1 held for %s", k)
	}
}
