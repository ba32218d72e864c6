package storetest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// The randomized test: several workers claim and complete concurrently with
// random outcomes over K = 1 keys and a sharded gate, while an outside
// recorder checks that no key ever has more than K rows between claim and
// outcome. At the end every instance is done and every counter is full.

const (
	randomInstances = 240
	randomWorkers   = 4
	randomDeadline  = 30 * time.Second
)

var randomGate = gate.Limit{Name: "g", Limit: 3, Shards: 2}

// randomKeys are the keys instances start with and switch between.
var randomKeys = []string{"", "", "acct:0", "acct:1", "acct:2", "acct:3", "acct:4", "acct:5", "g:0", "g:1", "g:2"}

// recorder is the outside observer of who runs under which key.
type recorder struct {
	mu      sync.Mutex
	running map[string]int
	most    map[string]int
}

func (r *recorder) enter(t require.TestingT, key string) {
	if key == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running[key]++
	r.most[key] = max(r.most[key], r.running[key])
	k := 1
	if gate.NameOf(key) == randomGate.Name {
		k = randomGate.Limit
	}
	if r.running[key] > k {
		t.Errorf("key %s has %d rows running, K = %d", key, r.running[key], k)
	}
}

func (r *recorder) leave(key string) {
	if key == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running[key]--
}

var randomTests = []test{
	{"random/concurrent workers never exceed K and leave counters full", func(h *harness) { randomRun(h, false) }},
	{"random/concurrent workers never exceed any key's K with rows of several keys", func(h *harness) {
		h.severalKeys()
		randomRun(h, true)
	}},
}

// randomKeysOf draws a row's keys: one of randomKeys and, with several, up
// to two more of them (none twice), as NewInstance and Outcome take them.
func randomKeysOf(rng *rand.Rand, several bool) (string, []store.KeyRef) {
	key := randomKeys[rng.IntN(len(randomKeys))]
	if !several || key == "" {
		return key, nil
	}
	var also []store.KeyRef
	for range rng.IntN(3) {
		k := randomKeys[rng.IntN(len(randomKeys))]
		if k != "" && k != key && !slices.ContainsFunc(also, func(a store.KeyRef) bool { return a.Key == k }) {
			also = append(also, store.KeyRef{Key: k})
		}
	}
	return key, also
}

// keysOf lists a claimed row's keys.
func keysOf(c store.Claimed) []string {
	var out []string
	if c.Key != "" {
		out = append(out, c.Key)
	}
	for _, a := range c.Also {
		out = append(out, a.Key)
	}
	return out
}

// randomRun is the randomized test, with rows of several keys when several
// is set.
func randomRun(h *harness, several bool) {
	h.syncLimits(randomGate)
	seed := uint64(time.Now().UnixNano())
	h.t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	nis := make([]store.NewInstance, randomInstances)
	for i := range nis {
		key, also := randomKeysOf(rng, several)
		nis[i] = store.NewInstance{ID: uuid.NewString(), Workflow: "rand", Queue: queue, Step: "s0",
			State: json.RawMessage(`{"steps":0}`), Key: key, Also: also,
			Priority: rng.IntN(3), RunAt: base}
	}
	h.insert(nis...)

	rec := &recorder{running: map[string]int{}, most: map[string]int{}}
	var clock atomic.Int64 // logical milliseconds after base
	var finished atomic.Int64
	deadline := time.Now().Add(randomDeadline)
	var wg sync.WaitGroup
	for w := range randomWorkers {
		wg.Go(func() {
			runWorker(h, rec, fmt.Sprintf("w%d", w), rand.New(rand.NewPCG(seed, uint64(w)+2)), several, &clock, &finished, deadline)
		})
	}
	wg.Wait()
	if h.t.Failed() {
		return
	}
	require.EqualValues(h.t, randomInstances, finished.Load())
	require.Len(h.t, h.list(store.ListFilter{Status: store.StatusDone}), randomInstances)
	for _, st := range []store.Status{store.StatusReady, store.StatusBlocked, store.StatusExecuting, store.StatusAwaiting} {
		require.Empty(h.t, h.list(store.ListFilter{Status: st}), "no row left %s", st)
	}
	for _, k := range randomKeys {
		if k == "" {
			continue
		}
		info := h.keyInfo(k)
		require.Empty(h.t, info.Holders, k)
		if gate.NameOf(k) == randomGate.Name {
			require.Equal(h.t, randomGate.Limit, info.Available, "counters of %s back to full", k)
		}
	}
	h.t.Logf("most running per key: %v", rec.most)
}

// runWorker claims and completes with random outcomes until every instance
// is done or the deadline passes.
func runWorker(h *harness, rec *recorder, worker string, rng *rand.Rand, several bool, clock, finished *atomic.Int64, deadline time.Time) {
	t := h.t
	for finished.Load() < randomInstances {
		if time.Now().After(deadline) {
			t.Errorf("%s: deadline passed with %d of %d instances done", worker, finished.Load(), randomInstances)
			return
		}
		now := base.Add(time.Duration(clock.Add(1)) * time.Millisecond)
		if _, err := h.s.FireTimers(h.ctx, now); err != nil {
			t.Errorf("fire timers: %v", err)
			return
		}
		res, err := h.s.Claim(h.ctx, store.ClaimRequest{Queue: queue, Worker: worker, Limit: 1 + rng.IntN(3), Lease: time.Hour, Now: now})
		if err != nil {
			t.Errorf("claim: %v", err)
			return
		}
		if len(res.Claimed) == 0 {
			time.Sleep(100 * time.Microsecond)
			continue
		}
		for _, c := range res.Claimed {
			for _, k := range keysOf(c) {
				rec.enter(t, k)
			}
		}
		time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond) // the steps "run"

		var outs []store.Outcome
		var release []store.ClaimRef
		var signalAfter, signalBefore []string
		for _, c := range res.Claimed {
			if rng.IntN(10) == 0 {
				release = append(release, ref(c))
				continue
			}
			var st struct{ Steps int }
			if err := json.Unmarshal(c.State, &st); err != nil {
				t.Errorf("state of %s: %v", c.ID, err)
				return
			}
			st.Steps++
			state, _ := json.Marshal(st)
			o := store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeReady, Step: fmt.Sprintf("s%d", st.Steps), State: state, RunAt: now}
			if c.Signal != nil {
				o.ConsumeSignal = c.Signal.ID
			}
			switch choice := rng.IntN(8); {
			case st.Steps > 6 || choice == 0:
				o.Kind, o.Result = store.OutcomeDone, state
			case choice == 1: // release the key
				o.SetKey = true
			case choice == 2: // switch keys
				o.SetKey = true
				o.Key, o.Also = randomKeysOf(rng, several)
			case choice == 3: // await a signal, sent before or after the park
				o.Kind, o.AwaitSignal = store.OutcomeAwait, "go"
				if rng.IntN(2) == 0 {
					signalBefore = append(signalBefore, c.ID)
				} else {
					signalAfter = append(signalAfter, c.ID)
				}
			case choice == 4: // await a timer
				o.Kind, o.AwaitSignal, o.TimeoutAt = store.OutcomeAwait, "never", now.Add(time.Duration(1+rng.IntN(5))*time.Millisecond)
			case choice == 5: // retry later
				o.Attempt, o.RunAt, o.Error = c.Attempt+1, now.Add(time.Duration(1+rng.IntN(5))*time.Millisecond), "transient"
			}
			outs = append(outs, o)
		}
		for _, c := range res.Claimed {
			for _, k := range keysOf(c) {
				rec.leave(k)
			}
		}
		for _, id := range signalBefore {
			if _, err := h.s.Signal(h.ctx, store.SignalRequest{InstanceID: id, Name: "go", Now: now}); err != nil {
				t.Errorf("signal before await: %v", err)
				return
			}
		}
		if len(release) > 0 {
			if err := h.s.Release(h.ctx, worker, release, now); err != nil {
				t.Errorf("release: %v", err)
				return
			}
		}
		if len(outs) > 0 {
			results, err := h.s.Complete(h.ctx, worker, outs, now)
			if err != nil {
				t.Errorf("complete: %v", err)
				return
			}
			for i, r := range results {
				if r.Stale {
					t.Errorf("outcome for %s stale with no reaper running", r.ID)
				} else if outs[i].Kind == store.OutcomeDone {
					finished.Add(1)
				}
			}
		}
		for _, id := range signalAfter {
			if _, err := h.s.Signal(h.ctx, store.SignalRequest{InstanceID: id, Name: "go", Payload: json.RawMessage(`{"late":true}`), Now: now}); err != nil {
				t.Errorf("signal after await: %v", err)
				return
			}
		}
	}
}
