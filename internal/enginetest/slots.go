package enginetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
)

// startLog records, outside the SDK, the key and wall-clock time of every
// step that starts.
type startLog struct {
	mu     sync.Mutex
	keys   []string
	at     []time.Time
	hook   func(ctx steps.Context) // called at the start of each step (nil: none)
	hookMu sync.Mutex
}

func (l *startLog) add(ctx steps.Context) {
	l.mu.Lock()
	l.keys = append(l.keys, ctx.Key())
	l.at = append(l.at, time.Now())
	l.mu.Unlock()
	l.hookMu.Lock()
	hook := l.hook
	l.hookMu.Unlock()
	if hook != nil {
		hook(ctx)
	}
}

// between counts the steps of key that started in (from, to).
func (l *startLog) between(key string, from, to time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for i, k := range l.keys {
		if k == key && l.at[i].After(from) && l.at[i].Before(to) {
			n++
		}
	}
	return n
}

// slotEngines starts n engines with the library's defaults but for the
// executors and the limits (see fleet), whose step records its start.
func slotEngines(t *testing.T, newStore func() store.Store, n, executors int, limits []gate.Limit, g *Gauge, log *startLog, step time.Duration) []*durable.Engine {
	t.Helper()
	return fleet(t, newStore, n, executors, durable.Config{Limits: limits}, g, step, log.add)
}

// GateSpreadsOverTheFleet runs one gate key of limit 10 on two engines of
// 5 executors each: the fleet must reach the limit (and never pass it).
// A hand-off gives a freed slot to the engine that freed it, and an engine
// whose executors all run the gate's chains must not claim its slots ahead
// into a buffer no executor will reach: otherwise one engine holds the
// slots and the gate runs at that engine's 5.
func GateSpreadsOverTheFleet(t *testing.T, newStore func() store.Store) {
	g := NewGauge()
	log := &startLog{}
	engines := slotEngines(t, newStore, 2, 5, []gate.Limit{{Name: "api", Limit: 10}}, g, log, 20*time.Millisecond)
	ids := insertWork(t, engines[0], []gate.ConcurrencyKey{gate.Gate("api", "x")}, 400)
	for _, e := range engines {
		require.NoError(t, e.Start(context.Background()))
	}
	waitDone(t, engines[0], ids, 60*time.Second)
	all, perKey := g.Peak()
	require.LessOrEqual(t, perKey, 10, "the gate held")
	require.Equal(t, 10, all, "the fleet reached the gate's limit: its slots spread over both engines")
}

// ClaimedRowsDoNotWaitBehindChains runs one engine of 2 executors on
// gate keys of limit 2: while key a's backlog passes its slots from step
// to step (hand-offs, successors), a row of key b is inserted. Once
// claimed, holding a slot of b, it must not wait in the engine while a's
// chains keep both executors: the first executor whose step ends takes it. When b is claimed is the store's business (its turn among a's
// rows: see store/storetest's handoff/ and reserve/ rules).
func ClaimedRowsDoNotWaitBehindChains(t *testing.T, newStore func() store.Store) {
	g := NewGauge()
	log := &startLog{}
	engines := slotEngines(t, newStore, 1, 2, []gate.Limit{{Name: "api", Limit: 2}}, g, log, 10*time.Millisecond)
	e := engines[0]
	var mu sync.Mutex
	var claimed, started time.Time
	log.hook = func(ctx steps.Context) {
		if ctx.Key() != "api:b" {
			return
		}
		now := time.Now()
		in, err := e.Get(context.Background(), ctx.InstanceID())
		mu.Lock()
		defer mu.Unlock()
		started = now
		if err == nil {
			claimed = in.StartedAt // when its claim began
		}
	}
	a := insertWork(t, e, []gate.ConcurrencyKey{gate.Gate("api", "a")}, 120)
	require.NoError(t, e.Start(context.Background()))
	deadline := time.Now().Add(30 * time.Second)
	for log.between("api:a", time.Time{}, time.Now()) < 20 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	b := insertWork(t, e, []gate.ConcurrencyKey{gate.Gate("api", "b")}, 1)
	waitDone(t, e, b, 30*time.Second)
	mu.Lock()
	defer mu.Unlock()
	require.False(t, claimed.IsZero(), "b's claim time was read")
	// Two executors: one step each while b waits for the first to end, and
	// the steps that start while b's claim runs (its time is when the
	// claim's transaction began), a few more on a loaded machine. Without
	// the rule, b waits for most of a's backlog.
	require.LessOrEqual(t, log.between("api:a", claimed, started), 6,
		"steps of key a that started while b, claimed, waited (b waited %v)", started.Sub(claimed))
	waitDone(t, e, a, 60*time.Second)
	_, perKey := g.Peak()
	require.LessOrEqual(t, perKey, 2, "the gate held")
}

// CancelOfAReservationMeansItNeverStarts cancels, from another engine
// (one that only inserts and cancels, as a web process would), the rows
// reserved to run next in the slot of a gate of one key that a working
// engine runs: a worker may start such a row the moment the step before it
// ends, without asking the store, so a cancel it has not heard of yet
// could come too late. Cancel never fails, and no canceled row starts
// after its Cancel returned: Cancel waits until the reservation is given
// back or has started.
func CancelOfAReservationMeansItNeverStarts(t *testing.T, newStore func() store.Store) {
	g := NewGauge()
	log := &startLog{}
	var mu sync.Mutex
	startedAt := map[string]time.Time{}
	log.hook = func(ctx steps.Context) {
		mu.Lock()
		startedAt[ctx.InstanceID()] = time.Now()
		mu.Unlock()
	}
	engines := slotEngines(t, newStore, 2, 1, []gate.Limit{{Name: "api", Limit: 1}}, g, log, 3*time.Millisecond)
	worker, canceler := engines[0], engines[1] // the canceler is never started
	ids := insertWork(t, worker, []gate.ConcurrencyKey{gate.Gate("api", "a")}, 1000)
	require.NoError(t, worker.Start(context.Background()))
	ctx := context.Background()
	canceledAt := map[string]time.Time{}
	cancel := func(id string) {
		err := canceler.Cancel(ctx, id, durable.CancelOptions{})
		if errors.Is(err, store.ErrTerminal) {
			return // it ran to its end since the list was read
		}
		require.NoError(t, err, "a cancel never fails for a constraint")
		canceledAt[id] = time.Now()
	}
	// Reserved rows are caught while the step before them runs; on a
	// loaded machine the backlog may drain before many are, so the loop
	// also ends when no row of the key waits any more.
	deadline := time.Now().Add(30 * time.Second)
	for len(canceledAt) < 20 && time.Now().Before(deadline) {
		rows, err := canceler.Store().List(ctx, store.ListFilter{Key: "api:a", Status: store.StatusBlocked})
		require.NoError(t, err)
		if len(rows) == 0 {
			break
		}
		for _, in := range rows {
			if in.Worker == "" || !canceledAt[in.ID].IsZero() {
				continue // not reserved, or done with
			}
			cancel(in.ID)
			break // the list is stale by now
		}
	}
	require.GreaterOrEqual(t, len(canceledAt), 5, "reserved rows were canceled")
	reserved := len(canceledAt)
	// The rest of the backlog is canceled too, whatever state each row
	// is in when its Cancel comes; the same rule holds for each.
	for _, id := range ids {
		if canceledAt[id].IsZero() {
			cancel(id)
		}
	}
	t.Logf("%d reserved rows canceled, %d in all", reserved, len(canceledAt))
	for _, id := range ids {
		_, err := worker.Wait(ctx, id)
		require.NoError(t, err)
	}
	mu.Lock()
	defer mu.Unlock()
	// The runtime starts a step, and tells the store it did, just before
	// it calls the step's function; the recorder runs in that function, a
	// moment later when the goroutine scheduler or the race detector is
	// slow, as on a machine running the whole suite.
	const entry = 10 * time.Millisecond
	late := 0
	for id, at := range canceledAt {
		if s, ok := startedAt[id]; ok && s.After(at.Add(entry)) {
			late++
			t.Errorf("instance %s started %v after its Cancel returned", id, s.Sub(at))
		}
		in, err := worker.Get(ctx, id)
		require.NoError(t, err)
		if _, ok := startedAt[id]; !ok {
			require.Equal(t, store.StatusCanceled, in.Status, "a row that never started ends canceled")
		}
	}
	require.Zero(t, late, "of %d canceled rows", len(canceledAt))
}
