package storetest

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// health takes a Health snapshot at now.
func (h *harness) health(now time.Time) store.Health {
	h.t.Helper()
	hl, err := h.s.Health(h.ctx, now)
	require.NoError(h.t, err)
	require.NotNil(h.t, hl.Queues, "queues is [] when empty, never null")
	require.NotNil(h.t, hl.Gates, "gates is [] when empty, never null")
	require.NotNil(h.t, hl.Warnings, "warnings is [] when empty, never null")
	require.NotNil(h.t, hl.RateLimits, "rate_limits is [] when empty, never null")
	require.NotNil(h.t, hl.HandedBack, "handed_back is [] when empty, never null")
	require.NotNil(h.t, hl.BlockedBy, "blocked_by is [] when empty, never null")
	return hl
}

// queueHealth returns the entry of queue name, failing when there is none.
func (h *harness) queueHealth(hl store.Health, name string) store.QueueHealth {
	h.t.Helper()
	for _, q := range hl.Queues {
		if q.Queue == name {
			return q
		}
	}
	h.t.Fatalf("no health entry for queue %q in %+v", name, hl.Queues)
	return store.QueueHealth{}
}

// gateHealth returns the entry of gate name, failing when there is none.
func (h *harness) gateHealth(hl store.Health, name string) store.GateHealth {
	h.t.Helper()
	for _, g := range hl.Gates {
		if g.Name == name {
			return g
		}
	}
	h.t.Fatalf("no health entry for gate %q in %+v", name, hl.Gates)
	return store.GateHealth{}
}

// onQueue is inst(k) on queue q.
func onQueue(q, k string) store.NewInstance {
	ni := inst(k)
	ni.Queue = q
	return ni
}

// handBack is the outcome of a worker that cannot run c (it does not know
// its workflow version or step): offered again unchanged at runAt.
func handBack(c store.Claimed, runAt time.Time) store.Outcome {
	return store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeReady, Step: c.Step, State: c.State,
		Attempt: c.Attempt, RunAt: runAt, Error: "version not registered on this worker", HandBack: true}
}

var healthTests = []test{
	{"health/a handed-back row ages from when it first became ready, not from its last hand-back", func(h *harness) {
		id := h.insert(inst(""))[0] // ready at base
		c := h.claimOne("w", at(time.Second))
		h.commit("w", at(time.Second), handBack(c, at(31*time.Second)))
		require.WithinDuration(h.t, at(0), h.get(id).ReadySince, 0, "the hand-back keeps when the row became ready")

		q := h.queueHealth(h.health(at(10*time.Second)), queue)
		require.Equal(h.t, int64(1), q.Scheduled, "handed back for later")
		require.Equal(h.t, 10*time.Second, q.OldestReady, "aged from its first run time, though not due again yet")

		c = h.claimOne("w", at(31*time.Second))
		h.commit("w", at(31*time.Second), handBack(c, at(61*time.Second)))
		require.WithinDuration(h.t, at(0), h.get(id).ReadySince, 0, "a second hand-back keeps the first time")
		q = h.queueHealth(h.health(at(61*time.Second)), queue)
		require.Equal(h.t, int64(1), q.Ready)
		require.Equal(h.t, 61*time.Second, q.OldestReady, "not 0: each hand-back moved its run time")

		// A worker that knows the version runs it: the hand-backs are over.
		c = h.claimOne("w2", at(62*time.Second))
		h.commit("w2", at(62*time.Second), next(c, "two"))
		require.True(h.t, h.get(id).ReadySince.IsZero(), "an outcome that is not a hand-back clears it")
		hl := h.health(at(64 * time.Second))
		require.Equal(h.t, 2*time.Second, h.queueHealth(hl, queue).OldestReady, "aged from its new run time")
		require.Empty(h.t, hl.HandedBack)
	}},
	{"health/handed-back rows are counted per workflow version until they run, bounded", func(h *harness) {
		v2 := inst("")
		v2.Version = 2
		other := inst("")
		other.Workflow = "other"
		ids := h.insert(inst(""), v2, withNewID(v2), other)
		for _, c := range h.claim("w", 10, at(time.Second)) {
			h.commit("w", at(time.Second), handBack(c, at(31*time.Second)))
		}
		hl := h.health(at(2 * time.Second))
		require.Equal(h.t, []store.HandBackHealth{{Workflow: "other", Version: 1, Count: 1},
			{Workflow: "wf", Version: 1, Count: 1}, {Workflow: "wf", Version: 2, Count: 2}}, hl.HandedBack)
		require.False(h.t, hl.HandedBackCapped)

		// Canceled rows are not waiting; a retried one starts afresh.
		require.NoError(h.t, h.s.Cancel(h.ctx, ids[3], at(3*time.Second)))
		require.NoError(h.t, h.s.Cancel(h.ctx, ids[0], at(3*time.Second)))
		require.NoError(h.t, h.s.Retry(h.ctx, ids[0], at(4*time.Second)))
		require.True(h.t, h.get(ids[0]).ReadySince.IsZero(), "retry clears the hand-back")
		hl = h.health(at(5 * time.Second))
		require.Equal(h.t, []store.HandBackHealth{{Workflow: "wf", Version: 2, Count: 2}}, hl.HandedBack)
		require.Equal(h.t, 5*time.Second, h.queueHealth(hl, queue).OldestReady, "the handed-back rows are the oldest")

		// Over the bound: counts stop at store.HealthScanLimit rows.
		many := make([]store.NewInstance, store.HealthScanLimit)
		for i := range many {
			many[i] = inst("")
			many[i].Version = 3
		}
		h.insert(many...)
		for _, c := range h.claim("w", len(many)+10, at(6*time.Second)) {
			if c.Version == 3 {
				h.commit("w", at(6*time.Second), handBack(c, at(36*time.Second)))
			}
		}
		hl = h.health(at(7 * time.Second))
		require.True(h.t, hl.HandedBackCapped)
		require.Equal(h.t, []store.HandBackHealth{{Workflow: "wf", Version: 2, Count: 2},
			{Workflow: "wf", Version: 3, Count: store.HealthScanLimit - 2}}, hl.HandedBack)
	}},
	{"health/an empty store reports empty lists and stable JSON", func(h *harness) {
		hl := h.health(at(0))
		require.Empty(h.t, hl.Queues)
		require.Empty(h.t, hl.Gates)
		require.Empty(h.t, hl.Warnings)
		b, err := json.Marshal(hl)
		require.NoError(h.t, err)
		// The oldest snapshot is the database's, which other sessions may
		// hold (PostgreSQL): its form is stable, its value is not the
		// store's to fix.
		var all map[string]json.RawMessage
		require.NoError(h.t, json.Unmarshal(b, &all))
		var snap map[string]json.RawMessage
		require.NoError(h.t, json.Unmarshal(all["oldest_snapshot"], &snap))
		require.ElementsMatch(h.t, []string{"transactions", "open", "holder"}, slices.Collect(maps.Keys(snap)))
		delete(all, "oldest_snapshot")
		b, err = json.Marshal(all)
		require.NoError(h.t, err)
		require.JSONEq(h.t, `{"queues":[],"gates":[],"warnings":[],"rate_limits":[],"handed_back":[],"handed_back_capped":false,"blocked_by":[]}`, string(b))

		h.insert(inst(""))
		b, err = json.Marshal(h.queueHealth(h.health(at(0)), queue))
		require.NoError(h.t, err)
		var fields map[string]any
		require.NoError(h.t, json.Unmarshal(b, &fields))
		for _, f := range []string{"queue", "ready", "scheduled", "blocked", "executing", "awaiting", "failed",
			"failed_capped", "oldest_ready_ns", "max_active", "max_active_per_key", "active", "blocked_ready", "saturated_keys",
			"saturated_keys_capped"} {
			require.Contains(h.t, fields, f, "queue health JSON field")
		}
		require.Len(h.t, fields, 15, "no undocumented queue field: %s", b)
	}},
	{"health/ready and scheduled split at now, with the oldest ready age", func(h *harness) {
		old := inst("")
		old.RunAt = at(-time.Hour)
		newer := inst("")
		newer.RunAt = at(-time.Minute)
		later := inst("")
		later.RunAt = at(time.Hour)
		h.insertSeq(old, newer, later)

		q := h.queueHealth(h.health(at(0)), queue)
		require.Equal(h.t, int64(2), q.Ready)
		require.Equal(h.t, int64(1), q.Scheduled)
		require.Equal(h.t, time.Hour, q.OldestReady)

		q = h.queueHealth(h.health(at(2*time.Hour)), queue)
		require.Equal(h.t, int64(3), q.Ready, "a delayed row is ready once its time has come")
		require.Equal(h.t, int64(0), q.Scheduled)
		require.Equal(h.t, 3*time.Hour, q.OldestReady)

		// Claimed rows are no longer ready; the oldest age follows the rest.
		require.Len(h.t, h.claim("w", 1, at(2*time.Hour)), 1)
		q = h.queueHealth(h.health(at(2*time.Hour)), queue)
		require.Equal(h.t, int64(2), q.Ready)
		require.Equal(h.t, 2*time.Hour+time.Minute, q.OldestReady)
	}},
	{"health/oldest ready age is zero without ready rows", func(h *harness) {
		later := inst("")
		later.RunAt = at(time.Hour)
		h.insert(later)
		q := h.queueHealth(h.health(at(0)), queue)
		require.Equal(h.t, int64(0), q.Ready)
		require.Equal(h.t, time.Duration(0), q.OldestReady)
	}},
	{"health/zero now means the store's clock", func(h *harness) {
		ni := inst("")
		ni.RunAt = time.Now().Add(-time.Minute).Truncate(time.Microsecond)
		far := inst("")
		far.RunAt = time.Now().Add(time.Hour).Truncate(time.Microsecond)
		h.insertSeq(ni, far)
		q := h.queueHealth(h.health(time.Time{}), queue)
		require.Equal(h.t, int64(1), q.Ready)
		require.Equal(h.t, int64(1), q.Scheduled)
		require.InDelta(h.t, time.Minute.Seconds(), q.OldestReady.Seconds(), 30, "oldest ready by the store's clock")
	}},
	{"health/executing rows count as executing and active", func(h *harness) {
		h.insertKeyed("", 3)
		require.Len(h.t, h.claim("w", 2, at(0)), 2)
		q := h.queueHealth(h.health(at(0)), queue)
		require.Equal(h.t, int64(2), q.Executing)
		require.Equal(h.t, int64(2), q.Active)
		require.Equal(h.t, int64(1), q.Ready)
		require.Equal(h.t, 0, q.MaxActive, "no fleet limit configured")
	}},
	{"health/blocked rows of a saturated key are blocked, not ready", func(h *harness) {
		h.insertKeyed("account:1", 3)
		require.Len(h.t, h.claim("w", 10, at(0)), 1)
		q := h.queueHealth(h.health(at(0)), queue)
		require.Equal(h.t, int64(2), q.Blocked)
		require.Equal(h.t, int64(0), q.Ready)
		require.Equal(h.t, int64(1), q.Executing)
		require.Empty(h.t, h.health(at(0)).Gates, "a K = 1 name is not a gate")
		require.Equal(h.t, []store.NameCount{{Name: "account", Count: 2}}, h.health(at(0)).BlockedBy, "but its blocked rows show by name")
	}},
	{"health/awaiting counts signal, timer and children parks", func(h *harness) {
		h.insertKeyed("", 3)
		cs := h.claim("w", 3, at(0))
		require.Len(h.t, cs, 3)
		timed := await(cs[1], "go", "next")
		timed.TimeoutAt = at(time.Hour)
		spawn, kids := spawnOutcome(cs[2], 1, "")
		h.commit("w", at(time.Second), await(cs[0], "go", "next"), timed, spawn)
		q := h.queueHealth(h.health(at(time.Second)), queue)
		require.Equal(h.t, int64(3), q.Awaiting)
		require.Equal(h.t, int64(len(kids)), q.Ready, "the spawned child is ready")
		require.Equal(h.t, int64(0), q.Executing)

		h.signal(cs[0].ID, "go", `{}`, at(2*time.Second))
		q = h.queueHealth(h.health(at(2*time.Second)), queue)
		require.Equal(h.t, int64(2), q.Awaiting, "a woken row is no longer awaiting")
		require.Equal(h.t, int64(2), q.Ready)
	}},
	{"health/failed rows are counted, done and canceled are not", func(h *harness) {
		h.insertKeyed("", 3)
		cs := h.claim("w", 3, at(0))
		h.commit("w", at(time.Second), done(cs[0]),
			store.Outcome{ID: cs[1].ID, Fence: cs[1].Fence, Kind: store.OutcomeFailed, Error: "boom"})
		require.NoError(h.t, h.s.Cancel(h.ctx, cs[2].ID, at(time.Second)))
		h.commit("w", at(time.Second), next(cs[2], "more")) // the canceled step returns
		hl := h.health(at(time.Second))
		require.Len(h.t, hl.Queues, 1, "a queue with only failed rows is listed")
		q := h.queueHealth(hl, queue)
		require.Equal(h.t, store.QueueHealth{Queue: queue, Failed: 1}, q)
	}},
	{"health/failed rows are counted up to HealthScanLimit per queue", func(h *harness) {
		// Failed rows stay for the retention window: a count over all of
		// them would grow with it, so Health stops one past the bound.
		fail := func(q string, n int) {
			nis := make([]store.NewInstance, n)
			for i := range nis {
				nis[i] = onQueue(q, "")
			}
			h.insert(nis...)
			for left := n; left > 0; {
				cs := h.claimReq(store.ClaimRequest{Queue: q, Worker: "w", Limit: min(left, 500), Now: at(0)}).Claimed
				require.NotEmpty(h.t, cs)
				outs := make([]store.Outcome, len(cs))
				for i, c := range cs {
					outs[i] = store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeFailed, Error: "boom"}
				}
				h.commit("w", at(time.Second), outs...)
				left -= len(cs)
			}
		}
		fail("many", store.HealthScanLimit+1)
		fail("few", 2)
		hl := h.health(at(time.Second))
		many, few := h.queueHealth(hl, "many"), h.queueHealth(hl, "few")
		require.Equal(h.t, int64(store.HealthScanLimit), many.Failed)
		require.True(h.t, many.FailedCapped, "more failed rows than counted")
		require.Equal(h.t, int64(2), few.Failed)
		require.False(h.t, few.FailedCapped)
	}},
	{"health/queues are listed separately, sorted by name", func(h *harness) {
		h.insertSeq(onQueue("zeta", ""), onQueue("alpha", ""), onQueue("alpha", ""), onQueue("mid", ""))
		hl := h.health(at(0))
		var names []string
		for _, q := range hl.Queues {
			names = append(names, q.Queue)
		}
		require.Equal(h.t, []string{"alpha", "mid", "zeta"}, names)
		require.Equal(h.t, int64(2), h.queueHealth(hl, "alpha").Ready)
		require.Equal(h.t, int64(1), h.queueHealth(hl, "zeta").Ready)
	}},
	{"health/every configured limit is a gate, sorted, with its limit and shards", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 4, Shards: 2}, gate.Limit{Name: "openai", Limit: 3})
		hl := h.health(at(0))
		require.Equal(h.t, []store.GateHealth{
			{Name: "openai", Limit: 3, Shards: 1},
			{Name: "stripe", Limit: 4, Shards: 2},
		}, hl.Gates)
		require.Empty(h.t, hl.Queues)
	}},
	{"health/gate active, blocked ready, saturated keys and highest key active", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: 2, Shards: 2}, gate.Limit{Name: "idle", Limit: 5})
		h.insertKeyed("stripe:a", 5)
		h.insertKeyed("stripe:b", 1)
		h.insertKeyed("other:x", 2)
		cs := h.claim("w", 20, at(0))
		require.Len(h.t, cs, 4, "two of a, one of b, one of other")
		hl := h.health(at(0))
		g := h.gateHealth(hl, "stripe")
		require.Equal(h.t, int64(3), g.Active)
		require.Equal(h.t, int64(3), g.BlockedReady)
		require.Equal(h.t, 1, g.SaturatedKeys, "stripe:a is full, stripe:b has room")
		require.False(h.t, g.SaturatedKeysCapped)
		require.Equal(h.t, 2, g.HighestKeyActive)
		require.Equal(h.t, store.GateHealth{Name: "idle", Limit: 5, Shards: 1}, h.gateHealth(hl, "idle"))
		require.Equal(h.t, int64(4), h.queueHealth(hl, queue).Blocked, "the queue counts every blocked row, K = 1 ones too")

		// A holder of stripe:a finishes: the key has room again (one of its
		// blocked rows is promoted), and nothing is saturated.
		for _, c := range cs {
			if c.Key == "stripe:a" {
				h.commit("w", at(time.Second), done(c))
				break
			}
		}
		g = h.gateHealth(h.health(at(time.Second)), "stripe")
		require.Equal(h.t, int64(2), g.Active)
		require.Equal(h.t, 0, g.SaturatedKeys)
		require.Equal(h.t, 1, g.HighestKeyActive)
		require.Equal(h.t, int64(2), g.BlockedReady, "one blocked row was promoted to ready")
	}},
	{"health/saturated keys are counted up to the scan limit", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "t", Limit: 1})
		n := store.HealthScanLimit + 1
		nis := make([]store.NewInstance, n)
		for i := range nis {
			nis[i] = inst(fmt.Sprintf("t:%d", i))
		}
		h.insert(nis...)
		claimed := 0
		for range 3 { // a backend may cap one claim's size
			claimed += len(h.claim("w", n, at(0)))
		}
		require.Equal(h.t, n, claimed)
		g := h.gateHealth(h.health(at(0)), "t")
		require.Equal(h.t, store.HealthScanLimit, g.SaturatedKeys)
		require.True(h.t, g.SaturatedKeysCapped)
		require.Equal(h.t, int64(n), g.Active)
		require.Equal(h.t, 1, g.HighestKeyActive)
	}},
	{"health/warnings name captured identities and gates without limits, never key ids", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "order", Limit: 5})
		captured := inst("order:secret-41")
		captured.KeyIntent = gate.IdentityIntent
		unlimited := inst("stripe:secret-42")
		unlimited.KeyIntent = gate.GateIntent
		plain := inst("order:secret-43")  // no declared intent: no warning
		fine := inst("account:secret-44") // identity without limit: as intended
		fine.KeyIntent = gate.IdentityIntent
		h.insertSeq(captured, unlimited, plain, fine)
		require.Len(h.t, h.claim("w", 1, at(0)), 1, "the captured identity executes; the gate key waits")

		hl := h.health(at(0))
		require.Len(h.t, hl.Warnings, 2)
		require.Equal(h.t, gate.GateWithoutLimit, hl.Warnings[0].Kind)
		require.Equal(h.t, "stripe", hl.Warnings[0].Name)
		require.Equal(h.t, gate.IdentityCaptured, hl.Warnings[1].Kind)
		require.Equal(h.t, "order", hl.Warnings[1].Name)
		b, err := json.Marshal(hl)
		require.NoError(h.t, err)
		require.NotContains(h.t, string(b), "secret-", "health carries no key id")
		require.NotContains(h.t, string(b), captured.ID, "health carries no instance id")
	}},
	{"health/warnings go away with the rows that caused them", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "order", Limit: 5})
		captured := inst("order:1")
		captured.KeyIntent = gate.IdentityIntent
		h.insert(captured)
		c := h.claimOne("w", at(0))
		require.Len(h.t, h.health(at(0)).Warnings, 1)
		h.commit("w", at(time.Second), done(c))
		require.Empty(h.t, h.health(at(time.Second)).Warnings)
	}},
	{"health/a closed store refuses", func(h *harness) {
		require.NoError(h.t, h.s.Close())
		_, err := h.s.Health(h.ctx, at(0))
		require.ErrorIs(h.t, err, store.ErrClosed)
	}},
	{"keys/key info names the longest waiting row", func(h *harness) {
		holder := inst("account:1")
		holder.RunAt = at(-2 * time.Hour)
		holder.Priority = -5
		urgent := inst("account:1")
		urgent.Priority = -1
		urgent.RunAt = at(-time.Minute)
		old := inst("account:1")
		old.RunAt = at(-time.Hour)
		h.insertSeq(holder, urgent, old)
		require.Equal(h.t, holder.ID, h.claimOne("w", at(0)).ID)
		info := h.keyInfo("account:1")
		require.NotNil(h.t, info.NextInLine)
		require.Equal(h.t, urgent.ID, info.NextInLine.ID, "next in line: priority first")
		require.NotNil(h.t, info.OldestWaiting)
		require.Equal(h.t, old.ID, info.OldestWaiting.ID, "oldest: earliest run time")
		require.Nil(h.t, h.keyInfo("account:"+uuid.NewString()).OldestWaiting)
	}},
}

// withNewID is ni with a fresh id.
func withNewID(ni store.NewInstance) store.NewInstance {
	ni.ID = uuid.NewString()
	return ni
}
