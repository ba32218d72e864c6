package enginetest

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

type debounceEvent struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

// DebounceAcrossEngines runs three engines; 8 goroutines per engine insert
// 1,000 events over 50 debounce keys (Period 1 s, MaxWait 2.5 s) at a
// steady pace within 2 s. Half the keys have their events in the first
// 0.6 s (a short burst: each runs after its quiet period), the other half
// over the whole 2 s, an event every 50 ms (each runs at MaxWait after its
// first event, before its quiet period). Exactly one instance per key
// runs, after the key's last event, with one of its events' states; none
// starts before its time (a short burst's last event plus Period, a long
// one's first plus MaxWait), nor later than that, nor later than MaxWait
// after its first event, plus the time a claim takes to see a row fall due
// (one poll interval, and slack for a loaded machine).
func DebounceAcrossEngines(t *testing.T, newStore func() store.Store) {
	const (
		events   = 1000
		keys     = 50
		per      = 8
		engines  = 3
		burst    = 2 * time.Second
		period   = time.Second
		maxWait  = 2500 * time.Millisecond
		poll     = 100 * time.Millisecond
		claimLag = poll + 400*time.Millisecond
	)
	var (
		mu         sync.Mutex
		starts     = map[string][]time.Time{}  // key -> when its instances started
		states     = map[string][]int{}        // key -> the event each run saw
		first      = map[string]time.Time{}    // key -> before its first insert
		last       = map[string]time.Time{}    // key -> after its last insert
		lastBefore = map[string]time.Time{}    // key -> before its last insert
		sent       = map[string]map[int]bool{} // key -> its events
		slowest    time.Duration               // the longest insert call
	)
	const short = 600 * time.Millisecond // the span of the short bursts
	wf := durable.NewWorkflow[debounceEvent]("debounced", "run", durable.WorkflowOptions{})
	wf.Step("run", func(ctx steps.Context, ev debounceEvent) (transitions.Transition, error) {
		at := time.Now()
		mu.Lock()
		starts[ev.Key] = append(starts[ev.Key], at)
		states[ev.Key] = append(states[ev.Key], ev.N)
		mu.Unlock()
		return transitions.Done(ev.N), nil
	})
	// Warm-up rows open each engine's connections before the clock starts:
	// a first insert that waits for a connection would push a goroutine's
	// later events, and with them the long bursts' first events, past
	// their schedule, and MaxWait would then have nothing to cut.
	warm := durable.NewWorkflow[int]("warm-up", "run", durable.WorkflowOptions{})
	warm.Step("run", func(ctx steps.Context, n int) (transitions.Transition, error) {
		return transitions.Done(n), nil
	})
	var es []*durable.Engine
	for i := range engines {
		e, err := durable.New(durable.Config{Store: newStore(), WorkerID: fmt.Sprintf("engine-%d", i), PollInterval: poll,
			ReconcileInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		require.NoError(t, e.Register(wf))
		require.NoError(t, e.Register(warm))
		es = append(es, e)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, e := range es {
			_ = e.Stop(ctx)
		}
	})
	ctx := context.Background()
	for _, e := range es {
		require.NoError(t, e.Start(ctx))
	}

	var warming sync.WaitGroup
	warmErrs := make(chan error, engines*per)
	for _, e := range es {
		for n := range per {
			warming.Go(func() {
				if _, err := warm.Insert(ctx, e, n, durable.InsertOptions{}); err != nil {
					warmErrs <- err
				}
			})
		}
	}
	warming.Wait()
	close(warmErrs)
	for err := range warmErrs {
		require.NoError(t, err)
	}

	var next atomic.Int64
	start := time.Now()
	gap := burst / time.Duration(events) // the pace of the whole fleet
	var wg sync.WaitGroup
	errs := make(chan error, engines*per)
	for _, e := range es {
		for range per {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					n := int(next.Add(1)) - 1
					if n >= events {
						return
					}
					at := time.Duration(n) * gap
					time.Sleep(time.Until(start.Add(at)))
					k := fmt.Sprintf("doc:%d", n%keys) // every key, in the short bursts' span
					if at >= short {
						k = fmt.Sprintf("doc:%d", keys/2+n%(keys/2)) // then the long bursts' keys only
					}
					before := time.Now()
					mu.Lock()
					if _, ok := first[k]; !ok {
						first[k] = before
					}
					if before.After(lastBefore[k]) {
						lastBefore[k] = before
					}
					if sent[k] == nil {
						sent[k] = map[int]bool{}
					}
					sent[k][n] = true
					mu.Unlock()
					_, err := wf.Insert(ctx, e, debounceEvent{Key: k, N: n},
						durable.InsertOptions{Debounce: durable.Debounce{Key: k, Period: period, MaxWait: maxWait}})
					if err != nil {
						errs <- err
						return
					}
					after := time.Now()
					mu.Lock()
					if after.After(last[k]) {
						last[k] = after
					}
					slowest = max(slowest, after.Sub(before))
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Less(t, time.Since(start), burst+time.Second, "the events took too long to insert: the machine is too slow for this test")

	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		ran := len(starts)
		mu.Unlock()
		if ran == keys {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d of %d keys ran", ran, keys)
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(period + 2*poll) // a second instance of a key would have started by now

	all, err := es[0].Store().List(ctx, store.ListFilter{Workflow: "debounced"})
	require.NoError(t, err)
	require.Len(t, all, keys, "one instance per debounce key")
	mu.Lock()
	defer mu.Unlock()
	var worst time.Duration
	for k, at := range starts {
		worst = max(worst, at[0].Sub(first[k])-maxWait)
	}
	t.Logf("the latest start came %s after its key's first event plus MaxWait", worst)
	longs := 0
	for k, at := range starts {
		require.Len(t, at, 1, "key %s ran %d times", k, len(at))
		began := at[0]
		require.True(t, sent[k][states[k][0]], "key %s ran with event %d, not one of its own", k, states[k][0])
		require.True(t, began.After(last[k]), "key %s started %s before its last event was inserted", k, last[k].Sub(began))
		require.LessOrEqual(t, began.Sub(first[k])-maxWait, claimLag, "key %s started %s after its first event (MaxWait %s)", k, began.Sub(first[k]), maxWait)
		due := lastBefore[k].Add(period) // its quiet period's end, at the earliest
		if capped := first[k].Add(maxWait); capped.Before(due) {
			due = capped
			longs++
			// MaxWait shows binding when the key started before its last
			// event's quiet period ended; a start late by the claim lag
			// (allowed above) may pass that end when the last event came
			// within the lag of the cap, so only a key whose quiet period
			// ends beyond it can tell.
			if quiet := last[k].Add(period); quiet.After(capped.Add(claimLag)) {
				require.True(t, began.Before(quiet), "key %s: MaxWait did not bind", k)
			}
		}
		// The store starts the quiet period at the event it applies last,
		// which may be one whose insert began up to an insert call's length
		// before lastBefore (a key's inserts run concurrently).
		require.False(t, began.Before(due.Add(-slowest)), "key %s started %s before its time", k, due.Sub(began))
		require.LessOrEqual(t, began.Sub(due), claimLag+(last[k].Sub(lastBefore[k])), "key %s started %s after its time", k, began.Sub(due))
	}
	require.Equal(t, keys/2, longs, "half the keys are long bursts that MaxWait cuts")
}
