// Package storetest is the conformance suite of the store contract: every
// rule of store.Store stated as a test. A backend is correct when Run passes
// against it, unchanged:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store {
//			s := open(t) // a fresh, empty store
//			t.Cleanup(func() { s.Close() })
//			return s
//		})
//	}
//
// Each subtest is named after the rule it checks ("keys/a saturated key does
// not block other keys") and gets its own store, so a failure names the rule
// broken. The suite never relies on the wall clock except where it tests
// that a zero time means the store's clock: it passes explicit times (a fixed
// base in 2030 plus offsets, truncated to the microsecond) and compares JSON
// semantically, so a backend that stores microseconds and reorders object
// keys passes. Subtests run one after another; the ones named races/ and
// random/ drive the store from several goroutines.
package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

// Run runs every conformance test against stores made by newStore, which
// must return a fresh, empty store and arrange its cleanup with t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	groups := [][]test{insertTests, normalizeTests, claimTests, keyTests, perKeyTests, insertBlockedTests, handOffTests, signalTests, scheduleTests,
		spawnTests, claimLifeTests, reserveTests, maintenanceTests, queryTests, healthTests, queueTests, pauseTests, cancelTreeTests, conflictTests, debounceTests, policyTests, scheduleDefTests, severalKeysTests, raceTests, randomTests}
	for _, g := range groups {
		for _, tc := range g {
			t.Run(tc.name, func(t *testing.T) {
				tc.fn(&harness{t: t, s: newStore(t), ctx: t.Context()})
			})
		}
	}
}

// test is one rule of the contract.
type test struct {
	name string
	fn   func(h *harness)
}

// base is the suite's "now": far from the wall clock, so a backend that
// silently uses its own clock instead of the given time fails.
var base = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// at is base plus d, truncated to the microsecond (PostgreSQL's precision).
func at(d time.Duration) time.Time { return base.Add(d).Truncate(time.Microsecond) }

const (
	queue = "q"
	lease = time.Minute
)

// harness wraps a store with helpers that fail the test on unexpected errors.
type harness struct {
	t   *testing.T
	s   store.Store
	ctx context.Context
}

// inst is a new instance of workflow "wf" on queue q with key k, eligible at base.
func inst(k string) store.NewInstance {
	return store.NewInstance{
		ID: store.NewInstanceID(), Workflow: "wf", Version: 1, Queue: queue,
		Step: "start", State: json.RawMessage(`{"n":0}`), Key: k, RunAt: base,
	}
}

// versionOne is version 1 (inst's) of each workflow: what a worker that
// registers those workflows runs.
func versionOne(workflows ...string) []store.WorkflowVersion {
	out := make([]store.WorkflowVersion, len(workflows))
	for i, w := range workflows {
		out[i] = store.WorkflowVersion{Workflow: w, Version: 1}
	}
	return out
}

// insert inserts instances, requires that none is a duplicate, and returns their ids.
func (h *harness) insert(nis ...store.NewInstance) []string {
	h.t.Helper()
	res, err := h.s.Insert(h.ctx, nis)
	require.NoError(h.t, err)
	require.Len(h.t, res, len(nis))
	ids := make([]string, len(res))
	for i, r := range res {
		require.False(h.t, r.Duplicate, "instance %d reported duplicate", i)
		require.Equal(h.t, nis[i].ID, r.ID)
		ids[i] = r.ID
	}
	return ids
}

// insertKeyed inserts n instances of key k, one per call so their order is
// the insertion order, each due a microsecond after the previous one and
// all an hour before base.
func (h *harness) insertKeyed(k string, n int) []string {
	h.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ni := inst(k)
		ni.RunAt = at(-time.Hour + time.Duration(i)*time.Microsecond)
		ids[i] = h.insert(ni)[0]
	}
	return ids
}

func (h *harness) claimReq(req store.ClaimRequest) store.ClaimResult {
	h.t.Helper()
	if req.Queue == "" {
		req.Queue = queue
	}
	if req.Lease == 0 {
		req.Lease = lease
	}
	res, err := h.s.Claim(h.ctx, req)
	require.NoError(h.t, err)
	require.LessOrEqual(h.t, len(res.Claimed), req.Limit, "claim returned more than Limit rows")
	for _, c := range res.Claimed {
		require.Equal(h.t, store.StatusExecuting, c.Status)
		require.Equal(h.t, req.Worker, c.Worker)
		require.Equal(h.t, req.Queue, c.Queue)
	}
	return res
}

// claim claims up to limit rows of queue q for worker at now.
func (h *harness) claim(worker string, limit int, now time.Time) []store.Claimed {
	h.t.Helper()
	return h.claimReq(store.ClaimRequest{Worker: worker, Limit: limit, Now: now}).Claimed
}

// claimOne claims exactly one row.
func (h *harness) claimOne(worker string, now time.Time) store.Claimed {
	h.t.Helper()
	cs := h.claim(worker, 1, now)
	require.Len(h.t, cs, 1, "expected one claimable row")
	return cs[0]
}

// complete commits outcomes for worker at now.
func (h *harness) complete(worker string, now time.Time, outs ...store.Outcome) []store.OutcomeResult {
	h.t.Helper()
	res, err := h.s.Complete(h.ctx, worker, outs, now)
	require.NoError(h.t, err)
	require.Len(h.t, res, len(outs))
	for i, r := range res {
		require.Equal(h.t, outs[i].ID, r.ID)
	}
	return res
}

// commit completes outcomes and requires that none was stale.
func (h *harness) commit(worker string, now time.Time, outs ...store.Outcome) {
	h.t.Helper()
	for _, r := range h.complete(worker, now, outs...) {
		require.False(h.t, r.Stale, "outcome for %s unexpectedly stale", r.ID)
	}
}

// stale completes one outcome and requires that it was stale.
func (h *harness) stale(worker string, now time.Time, o store.Outcome) {
	h.t.Helper()
	res := h.complete(worker, now, o)
	require.True(h.t, res[0].Stale, "outcome for %s should be stale", o.ID)
}

// next is the outcome "continue at step, now, same key".
func next(c store.Claimed, step string) store.Outcome {
	return store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeReady, Step: step,
		State: json.RawMessage(fmt.Sprintf(`{"step":%q}`, step))}
}

// done is the outcome "terminal success".
func done(c store.Claimed) store.Outcome {
	return store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone, Result: json.RawMessage(`{"ok":true}`)}
}

// await is the outcome "park until signal name, then run step".
func await(c store.Claimed, name, step string) store.Outcome {
	return store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeAwait, AwaitSignal: name, Step: step,
		State: json.RawMessage(`{"awaiting":true}`)}
}

func (h *harness) get(id string) store.Instance {
	h.t.Helper()
	in, err := h.s.Get(h.ctx, id)
	require.NoError(h.t, err)
	return in
}

func (h *harness) status(id string) store.Status {
	h.t.Helper()
	return h.get(id).Status
}

func (h *harness) requireStatus(want store.Status, ids ...string) {
	h.t.Helper()
	for _, id := range ids {
		require.Equal(h.t, want, h.status(id), "status of %s", id)
	}
}

func (h *harness) syncLimits(ls ...gate.Limit) store.LimitsResult {
	h.t.Helper()
	res, err := h.s.SyncLimits(h.ctx, ls)
	require.NoError(h.t, err)
	return res
}

func (h *harness) keyInfo(k string) store.KeyInfo {
	h.t.Helper()
	info, err := h.s.KeyInfo(h.ctx, k)
	require.NoError(h.t, err)
	require.Equal(h.t, k, info.Key)
	return info
}

func (h *harness) available(k string) int {
	h.t.Helper()
	return h.keyInfo(k).Available
}

func (h *harness) list(f store.ListFilter) []store.Instance {
	h.t.Helper()
	out, err := h.s.List(h.ctx, f)
	require.NoError(h.t, err)
	return out
}

// executing returns the executing rows of key k.
func (h *harness) executing(k string) []store.Instance {
	h.t.Helper()
	return h.list(store.ListFilter{Key: k, Status: store.StatusExecuting})
}

func (h *harness) reap(now time.Time) int {
	h.t.Helper()
	n, err := h.s.Reap(h.ctx, now)
	require.NoError(h.t, err)
	return n
}

func (h *harness) reconcile(retention time.Duration, now time.Time) store.ReconcileReport {
	h.t.Helper()
	rep, err := h.s.Reconcile(h.ctx, retention, now)
	require.NoError(h.t, err)
	return rep
}

func (h *harness) signal(id, name, payload string, now time.Time) store.SignalResult {
	h.t.Helper()
	res, err := h.s.Signal(h.ctx, store.SignalRequest{InstanceID: id, Name: name, Payload: json.RawMessage(payload), Now: now})
	require.NoError(h.t, err)
	return res
}

func claimedIDs(cs []store.Claimed) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

func ref(c store.Claimed) store.ClaimRef { return store.ClaimRef{ID: c.ID, Fence: c.Fence} }

// near requires two times to be within a millisecond.
func near(t *testing.T, want, got time.Time, msg string) {
	t.Helper()
	require.WithinDuration(t, want, got, time.Millisecond, msg)
}
