package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
)

// slowHandOffs is the PostgreSQL store with every hand-off flush delayed:
// a step that waits for its predecessor's flush starts that much later.
type slowHandOffs struct {
	*postgres.Store
	delay time.Duration
}

func (s slowHandOffs) CompleteHandOff(ctx context.Context, worker string, outs []store.Outcome, now time.Time,
	h store.HandOff) ([]store.OutcomeResult, []store.Claimed, error) {
	time.Sleep(s.delay)
	return s.Store.CompleteHandOff(ctx, worker, outs, now, h)
}

// stepLog records, outside the runtime, when each step ran.
type stepLog struct {
	testHost
	step time.Duration
	mu   sync.Mutex
	runs [][2]time.Time
	done chan struct{}
	want int
}

func (h *stepLog) Execute(ctx context.Context, c store.Claimed) store.Outcome {
	began := time.Now()
	time.Sleep(h.step)
	h.mu.Lock()
	h.runs = append(h.runs, [2]time.Time{began, time.Now()})
	if len(h.runs) == h.want {
		close(h.done)
	}
	h.mu.Unlock()
	return h.testHost.Execute(ctx, c)
}

// runAll runs a live scheduler of worker "test" (queue q, 10 executors)
// on st until h has seen every step it waits for, then stops it.
func runAll(t *testing.T, st store.Store, h *stepLog) {
	t.Helper()
	c := metricnoop.Int64Counter{}
	rt := New(Config{Store: st, Logger: slog.New(slog.DiscardHandler),
		Clock: wallClock{}, WorkerID: "test", Queues: map[string]int{"q": 10}, Lease: time.Minute,
		HeartbeatInterval: time.Second, PollInterval: 50 * time.Millisecond, MaxFlushBatch: 100,
		ReaperInterval: time.Hour, ReconcileInterval: time.Hour, MaxErrorLength: 1 << 10,
		StaleCounter: c, ReapedCounter: c}, h)
	s := rt.NewScheduler()
	s.Start()
	select {
	case <-h.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the steps did not all run")
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Stop(stopCtx))
}

// TestClaimReservationsSkipTheFirstFlush: the live scheduler asks its
// claims for successors, so the second step of a full key starts as soon
// as the first ends, in its slot, rather than after the first outcome's
// flush hands the slot on; the key's limit holds throughout.
func TestClaimReservationsSkipTheFirstFlush(t *testing.T) {
	ctx := context.Background()
	pg := newPGStore(t)
	_, err := pg.SyncLimits(ctx, []gate.Limit{{Name: "hot", Limit: 1, Shards: 1}})
	require.NoError(t, err)
	const n, flushDelay = 3, 300 * time.Millisecond
	var rows []store.NewInstance
	for range n {
		rows = append(rows, store.NewInstance{ID: store.NewInstanceID(), Workflow: "w", Version: 1, Queue: "q", Step: "s",
			State: json.RawMessage(`{}`), Key: "hot:1"})
	}
	_, err = pg.Insert(ctx, rows)
	require.NoError(t, err)

	h := &stepLog{step: 20 * time.Millisecond, done: make(chan struct{}), want: n}
	runAll(t, slowHandOffs{Store: pg, delay: flushDelay}, h)

	h.mu.Lock()
	runs := h.runs
	h.mu.Unlock()
	require.Len(t, runs, n)
	for i := 1; i < n; i++ {
		require.False(t, runs[i][0].Before(runs[i-1][1]), "step %d began before step %d ended: the gate of 1 was exceeded", i, i-1)
	}
	require.Less(t, runs[1][0].Sub(runs[0][1]), flushDelay/2,
		"the second step ran on the claim's reservation, without waiting for the first flush")
	for _, r := range rows {
		in, err := pg.Get(ctx, r.ID)
		require.NoError(t, err)
		require.Equal(t, store.StatusDone, in.Status)
	}
}

// TestChainEnd follows a slot's chain through reservations queued (succ)
// and reservations that took the slot over (moved), counts the queued
// ones, and stops at a claim seen twice, however long the chain.
func TestChainEnd(t *testing.T) {
	ref := func(i int) store.ClaimRef { return store.ClaimRef{ID: fmt.Sprintf("r%d", i), Fence: int64(i)} }
	claimed := func(r store.ClaimRef) store.Claimed {
		return store.Claimed{Instance: store.Instance{ID: r.ID, Fence: r.Fence}}
	}
	t.Run("queued and moved", func(t *testing.T) {
		s := &Scheduler{claims: newClaims()}
		// r0 moved to r1 (r1 took r0's slot); r1 has r2 then r3 queued.
		s.moved[ref(0)] = ref(1)
		s.succ[ref(1)] = claimed(ref(2))
		s.succ[ref(2)] = claimed(ref(3))
		end, n := s.chainEnd(ref(0))
		require.Equal(t, ref(3), end)
		require.Equal(t, 2, n)
		end, n = s.chainEnd(ref(3))
		require.Equal(t, ref(3), end)
		require.Zero(t, n)
	})
	for _, length := range []int{3, 40} { // within the stack array, and beyond it
		t.Run(fmt.Sprintf("a cycle of %d", length), func(t *testing.T) {
			s := &Scheduler{claims: newClaims()}
			for i := range length {
				s.succ[ref(i)] = claimed(ref((i + 1) % length))
			}
			end, n := s.chainEnd(ref(0))
			require.Equal(t, ref(0), end, "it stops at the first claim seen twice")
			require.Equal(t, length, n)
		})
	}
}

// reservedLog is the PostgreSQL store recording the rows each hand-off
// reserved.
type reservedLog struct {
	*postgres.Store
	mu       sync.Mutex
	reserved []string
}

func (s *reservedLog) CompleteHandOff(ctx context.Context, worker string, outs []store.Outcome, now time.Time,
	h store.HandOff) ([]store.OutcomeResult, []store.Claimed, error) {
	res, got, err := s.Store.CompleteHandOff(ctx, worker, outs, now, h)
	s.mu.Lock()
	for _, c := range got {
		if c.After != "" {
			s.reserved = append(s.reserved, c.ID)
		}
	}
	s.mu.Unlock()
	return res, got, err
}

// TestSeveralKeysChainAlongTheirKeys: rows of the same several keys (an
// account and a gate of one slot) run one at a time, passed from step to
// step by reservations as rows of one key are (the outcomes ask for
// successors, and the store reserves rows of the same keys after them).
func TestSeveralKeysChainAlongTheirKeys(t *testing.T) {
	ctx := context.Background()
	pg := newPGStore(t)
	_, err := pg.SyncLimits(ctx, []gate.Limit{{Name: "hot", Limit: 1, Shards: 1}})
	require.NoError(t, err)
	var rows []store.NewInstance
	for range 12 {
		rows = append(rows, store.NewInstance{ID: store.NewInstanceID(), Workflow: "w", Version: 1, Queue: "q", Step: "s",
			State: json.RawMessage(`{}`), Key: "acct:1", KeyIntent: gate.IdentityIntent,
			Also: []store.KeyRef{{Key: "hot:1", Intent: gate.GateIntent}}})
	}
	_, err = pg.Insert(ctx, rows)
	require.NoError(t, err)

	h := &stepLog{step: 10 * time.Millisecond, done: make(chan struct{}), want: len(rows)}
	log := &reservedLog{Store: pg}
	runAll(t, log, h)

	h.mu.Lock()
	runs := slices.Clone(h.runs)
	h.mu.Unlock()
	slices.SortFunc(runs, func(a, b [2]time.Time) int { return a[0].Compare(b[0]) })
	for i := 1; i < len(runs); i++ {
		require.False(t, runs[i][0].Before(runs[i-1][1]), "step %d began before step %d ended: both keys allow one at a time", i, i-1)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	require.NotEmpty(t, log.reserved, "rows of the same several keys are reserved as successors")
}
