package memory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

// chaos drives a store with a seeded random sequence of every operation,
// including the crash paths (reap, reclaim) and limit changes, checks every
// internal invariant after each step, then drains it and checks that every
// instance terminates and every counter comes back to full. It returns a
// trace of what each operation returned, for the determinism test.
type chaos struct {
	t      *testing.T
	s      *Store
	rng    *rand.Rand
	now    time.Time
	ids    []string
	held   []store.Claimed
	nextN  int
	legacy map[string]int64 // claims executing when the limits last changed
	trace  strings.Builder
}

var (
	chaosKeys   = []string{"", "", "acct:1", "acct:2", "acct:3", "g:1", "g:2", "h:1"}
	chaosLimits = [][]gate.Limit{
		{{Name: "g", Limit: 3, Shards: 2}},
		{{Name: "g", Limit: 1}, {Name: "h", Limit: 2}},
		nil,
		{{Name: "g", Limit: 5, Shards: 5}, {Name: "acct", Limit: 2}},
	}
	chaosQueues = []string{"q", "q", "q2"}
)

func newChaos(t *testing.T, seed uint64) *chaos {
	return &chaos{t: t, s: New(Options{}), rng: rand.New(rand.NewPCG(seed, 7)), now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *chaos) logf(format string, args ...any) { fmt.Fprintf(&c.trace, format+"\n", args...) }

func (c *chaos) pick(xs []string) string { return xs[c.rng.IntN(len(xs))] }

func (c *chaos) newInstances(n int) []store.NewInstance {
	out := make([]store.NewInstance, n)
	for i := range out {
		c.nextN++
		out[i] = store.NewInstance{
			ID: tid(fmt.Sprintf("i%05d", c.nextN)), Workflow: c.pick([]string{"a", "a", "b"}), Queue: c.pick(chaosQueues),
			Priority: c.rng.IntN(3), Step: "s", State: json.RawMessage(`{}`), Key: c.pick(chaosKeys),
			RunAt: c.now.Add(time.Duration(c.rng.IntN(4)-1) * time.Second),
		}
		if c.rng.IntN(5) == 0 {
			out[i].UniqueKey = fmt.Sprintf("u%d", c.rng.IntN(3))
		}
	}
	return out
}

func (c *chaos) outcome(cl store.Claimed) store.Outcome {
	o := store.Outcome{ID: cl.ID, Fence: cl.Fence, Kind: store.OutcomeReady, Step: "s", State: json.RawMessage(`{"x":1}`)}
	if cl.Signal != nil && c.rng.IntN(4) > 0 {
		o.ConsumeSignal = cl.Signal.ID
	}
	if c.rng.IntN(6) == 0 {
		o.History = &store.HistoryEntry{Step: cl.Step, Outcome: "next"}
	}
	switch c.rng.IntN(9) {
	case 0:
		o.RunAt = c.now.Add(time.Duration(c.rng.IntN(5)) * time.Second)
		o.Attempt = cl.Attempt + 1
	case 1:
		o.SetKey, o.Key = true, c.pick(chaosKeys)
	case 2:
		o.Kind, o.AwaitSignal = store.OutcomeAwait, c.pick([]string{"go", "stop"})
		if c.rng.IntN(2) == 0 {
			o.TimeoutAt = c.now.Add(time.Duration(c.rng.IntN(10)) * time.Second)
		}
	case 3:
		o.Kind, o.Children = store.OutcomeSpawn, c.newInstances(c.rng.IntN(3))
	case 4, 5:
		o.Kind = store.OutcomeDone
	case 6:
		o.Kind, o.Error = store.OutcomeFailed, "boom"
	}
	return o
}

// takeHeld removes and returns up to n random held claims.
func (c *chaos) takeHeld(n int) []store.Claimed {
	var out []store.Claimed
	for range n {
		if len(c.held) == 0 {
			break
		}
		i := c.rng.IntN(len(c.held))
		out = append(out, c.held[i])
		c.held = slices.Delete(c.held, i, i+1)
	}
	return out
}

func (c *chaos) step(ctx context.Context) {
	t := c.t
	c.now = c.now.Add(time.Duration(c.rng.IntN(1500)) * time.Millisecond)
	worker := c.pick([]string{"w1", "w2", "w3"})
	switch op := c.rng.IntN(16); op {
	case 0, 1:
		res, err := c.s.Insert(ctx, c.newInstances(1+c.rng.IntN(4)))
		require.NoError(t, err)
		for _, r := range res {
			if !r.Duplicate {
				c.ids = append(c.ids, r.ID)
			}
		}
		c.logf("insert %v", res)
	case 2, 3, 4:
		req := store.ClaimRequest{Queue: c.pick(chaosQueues), Worker: worker, Limit: 1 + c.rng.IntN(5), Lease: 10 * time.Second, Now: c.now}
		if c.rng.IntN(5) == 0 {
			req.Workflows = []store.WorkflowVersion{{Workflow: "a"}} // the version its rows are inserted with
		}
		res, err := c.s.Claim(ctx, req)
		require.NoError(t, err)
		c.held = append(c.held, res.Claimed...)
		c.logf("claim %s %v next %v", worker, ids(res.Claimed), res.NextDue)
	case 5, 6, 7:
		for _, cl := range c.takeHeld(1 + c.rng.IntN(3)) {
			res, err := c.s.Complete(ctx, cl.Worker, []store.Outcome{c.outcome(cl)}, c.now)
			require.NoError(t, err)
			c.logf("complete %v", res)
		}
	case 8:
		var id string
		if len(c.ids) > 0 {
			id = c.pick(c.ids)
		}
		res, err := c.s.Signal(ctx, store.SignalRequest{InstanceID: id, Name: c.pick([]string{"go", "go", "stop"}), Now: c.now,
			DedupKey: c.pick([]string{"", "", "d1"})})
		if !errors.Is(err, store.ErrTerminal) && !errors.Is(err, store.ErrNotFound) {
			require.NoError(t, err)
		}
		c.logf("signal %s %v %v", id, res, err)
	case 9:
		var refs []store.ClaimRef
		held := c.takeHeld(2)
		for _, cl := range held {
			refs = append(refs, store.ClaimRef{ID: cl.ID, Fence: cl.Fence})
		}
		if len(held) > 0 {
			require.NoError(t, c.s.Release(ctx, held[0].Worker, refs, c.now))
		}
		c.logf("release %v", refs)
	case 10:
		if len(c.ids) > 0 {
			id := c.pick(c.ids)
			err := c.s.Cancel(ctx, id, c.now)
			if c.rng.IntN(2) == 0 && err == nil {
				err = c.s.Retry(ctx, id, c.now)
			}
			c.logf("cancel/retry %s %v", id, err)
		}
	case 11:
		n, err := c.s.FireTimers(ctx, c.now)
		require.NoError(t, err)
		c.logf("timers %d", n)
	case 12:
		if len(c.held) > 0 {
			cl := c.held[c.rng.IntN(len(c.held))]
			hb, err := c.s.Heartbeat(ctx, cl.Worker, []store.ClaimRef{{ID: cl.ID, Fence: cl.Fence}}, 10*time.Second, c.now)
			require.NoError(t, err)
			c.logf("heartbeat %+v", hb)
		}
	case 13:
		var n int
		var err error
		if c.rng.IntN(3) == 0 {
			n, err = c.s.ReclaimWorker(ctx, worker, c.now)
		} else {
			n, err = c.s.Reap(ctx, c.now)
		}
		require.NoError(t, err)
		c.logf("reap %d", n)
	case 14:
		rep, err := c.s.Reconcile(ctx, time.Duration(c.rng.IntN(2))*time.Minute, c.now)
		require.NoError(t, err)
		c.logf("reconcile %+v", rep)
	case 15:
		res, err := c.s.SyncLimits(ctx, chaosLimits[c.rng.IntN(len(chaosLimits))])
		require.NoError(t, err)
		if len(res.Changes) > 0 {
			c.legacy = map[string]int64{}
			for id, r := range c.s.executing {
				c.legacy[id] = r.inst.Fence
			}
		}
		c.logf("limits %+v", res)
	}
	if err := c.s.check(c.legacy); err != nil {
		t.Fatalf("invariant broken after step: %v\ntrace tail:\n%s", err, tail(c.trace.String(), 15))
	}
}

// drain runs every instance to a terminal status with no more crashes, then
// checks that every counter is back to full after one reconcile sweep.
func (c *chaos) drain(ctx context.Context) {
	t := c.t
	for round := 0; ; round++ {
		require.Less(t, round, 500, "instances never drained")
		c.now = c.now.Add(time.Minute)
		for _, cl := range c.held {
			_, err := c.s.Complete(ctx, cl.Worker, []store.Outcome{{ID: cl.ID, Fence: cl.Fence, Kind: store.OutcomeDone}}, c.now)
			require.NoError(t, err)
		}
		c.held = nil
		_, err := c.s.Reap(ctx, c.now.Add(time.Hour))
		require.NoError(t, err)
		_, err = c.s.FireTimers(ctx, c.now.Add(time.Hour))
		require.NoError(t, err)
		_, err = c.s.Reconcile(ctx, 0, c.now)
		require.NoError(t, err)
		for _, st := range []store.Status{store.StatusAwaiting} {
			aw, err := c.s.List(ctx, store.ListFilter{Status: st})
			require.NoError(t, err)
			for _, in := range aw {
				_, err := c.s.Signal(ctx, store.SignalRequest{InstanceID: in.ID, Name: in.AwaitSignal, Now: c.now})
				require.NoError(t, err)
			}
		}
		claimed := 0
		for _, q := range []string{"q", "q2"} {
			for _, w := range []string{"w1", "w2", "w3"} {
				res, err := c.s.Claim(ctx, store.ClaimRequest{Queue: q, Worker: w, Limit: 50, Lease: time.Minute, Now: c.now.Add(time.Hour)})
				require.NoError(t, err)
				c.held = append(c.held, res.Claimed...)
				claimed += len(res.Claimed)
			}
		}
		require.NoError(t, c.s.check(c.legacy))
		if claimed == 0 {
			live := 0
			for _, r := range c.s.rows {
				if !r.inst.Status.Terminal() {
					live++
					t.Logf("stuck: %+v", r.inst)
				}
			}
			require.Zero(t, live, "no claimable row but %d live instances", live)
			break
		}
	}
	_, err := c.s.Reconcile(ctx, 0, c.now)
	require.NoError(t, err)
	for k, ks := range c.s.keys {
		for i, ct := range ks.counters {
			require.Equal(t, ct.capacity, ct.available, "key %s shard %d not back to full", k, i)
		}
	}
}

func ids(cs []store.Claimed) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

func tail(s string, lines int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(ls[max(0, len(ls)-lines):], "\n")
}

func TestChaosKeepsInvariants(t *testing.T) {
	seeds := []uint64{uint64(time.Now().UnixNano())}
	for seed := range uint64(12) {
		seeds = append(seeds, seed)
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			c := newChaos(t, seed)
			for range 1500 {
				c.step(t.Context())
			}
			c.drain(t.Context())
		})
	}
}

func TestDeterministic(t *testing.T) {
	run := func() string {
		c := newChaos(t, 42)
		for range 1500 {
			c.step(t.Context())
		}
		c.drain(t.Context())
		return c.trace.String()
	}
	a, b := run(), run()
	require.NotEmpty(t, a)
	require.Equal(t, a, b, "the same calls gave different results")
}
