package enginepg

import (
	"encoding/json"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestHeartbeatAndCompleteDoNotDeadlock runs heartbeats of a worker's
// claims concurrently with the Complete of the same claims, as the engine's
// heartbeat loop and flusher do. Both must lock the rows in the same (id)
// order: heartbeats that locked them in plan order deadlocked with Complete
// (found by the outage test, whose reconciler and heartbeat ran every few
// hundred milliseconds on a small table).
func TestHeartbeatAndCompleteDoNotDeadlock(t *testing.T) {
	st, _ := pgStore(t)
	ctx := waitCtx(t, 60*time.Second)
	errs := 0
	for round := 0; round < 40; round++ {
		ins := make([]store.NewInstance, 8)
		for i := range ins {
			ins[i] = store.NewInstance{ID: uuid.NewString(), Workflow: "w", Queue: "q", Step: "s", State: json.RawMessage(`{}`)}
		}
		_, err := st.Insert(ctx, ins)
		require.NoError(t, err)
		res, err := st.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 8, Lease: time.Minute})
		require.NoError(t, err)
		refs := make([]store.ClaimRef, len(res.Claimed))
		outs := make([]store.Outcome, len(res.Claimed))
		for i, c := range res.Claimed {
			refs[i] = store.ClaimRef{ID: c.ID, Fence: c.Fence}
			outs[i] = store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone, Result: json.RawMessage(`1`)}
		}
		sort.Slice(refs, func(i, j int) bool { return refs[i].ID < refs[j].ID })
		var wg sync.WaitGroup
		var mu sync.Mutex
		for g := 0; g < 3; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 5; k++ {
					if _, err := st.Heartbeat(ctx, "w", refs, time.Minute, time.Time{}); err != nil {
						mu.Lock()
						errs++
						t.Log(err)
						mu.Unlock()
					}
				}
			}()
		}
		if _, err := st.Complete(ctx, "w", outs, time.Time{}); err != nil {
			mu.Lock()
			errs++
			t.Log(err)
			mu.Unlock()
		}
		wg.Wait()
	}
	require.Zero(t, errs, "deadlocks between heartbeat and complete")
}

// TestHeartbeatAndChainFlushDoNotDeadlock runs heartbeats of a worker's
// claims and reservations concurrently with the hand-off flushes that pass
// each slot to its reserved successor, on chains whose successors have
// smaller ids than their predecessors (normal with time-ordered ids: an
// older instance on a later step queues behind a newer one). A flush that
// locked its outcome rows, then its successors in a second statement,
// took them out of the heartbeat's id order: a lock cycle, 40P01 on the
// hottest key. Every statement that locks several instance rows must lock
// them in one global (id) order.
func TestHeartbeatAndChainFlushDoNotDeadlock(t *testing.T) {
	st, _ := pgStore(t)
	ctx := waitCtx(t, 120*time.Second)
	const keys, rows = 6, 40
	ids := make([]string, keys*rows)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	sort.Sort(sort.Reverse(sort.StringSlice(ids))) // each key's later rows have smaller ids
	for k := range keys {
		for r := range rows {
			in := store.NewInstance{ID: ids[k*rows+r], Workflow: "w", Queue: "q", Step: "s", State: json.RawMessage(`{}`),
				Key: "chain:" + string(rune('a'+k))}
			_, err := st.Insert(ctx, []store.NewInstance{in}) // one insert each: the key's line is insertion order
			require.NoError(t, err)
		}
	}
	res, err := st.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: keys, Lease: time.Minute, Reserve: 1})
	require.NoError(t, err)
	type link struct{ pred, succ store.Claimed }
	chains := map[string]*link{} // key -> its running row and its reservation
	for _, c := range res.Claimed {
		if c.After == "" {
			chains[c.Key] = &link{pred: c}
		}
	}
	for _, c := range res.Claimed {
		if c.After != "" {
			chains[c.Key].succ = c
			require.Less(t, c.ID, chains[c.Key].pred.ID, "the successor's id is smaller")
		}
	}
	require.Len(t, chains, keys)

	var mu sync.Mutex // guards chains' refs for the heartbeats
	refsNow := func() []store.ClaimRef {
		mu.Lock()
		defer mu.Unlock()
		var out []store.ClaimRef
		for _, l := range chains {
			out = append(out, store.ClaimRef{ID: l.pred.ID, Fence: l.pred.Fence})
			if l.succ.ID != "" {
				out = append(out, store.ClaimRef{ID: l.succ.ID, Fence: l.succ.Fence})
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
		return out
	}
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 { // the heartbeat loop, and a second engine's worth of pressure
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := st.Heartbeat(ctx, "w", refsNow(), time.Minute, time.Time{}); err != nil {
					fail(err)
					return
				}
			}
		}()
	}
	var ho store.HandOffer = st
	var flushers sync.WaitGroup
	keyNames := make([]string, 0, len(chains))
	for key := range chains {
		keyNames = append(keyNames, key)
	}
	for _, key := range keyNames {
		flushers.Add(1)
		go func() { // the chain's flusher: each outcome passes the slot on and reserves the next row
			defer flushers.Done()
			for {
				mu.Lock()
				l := *chains[key]
				mu.Unlock()
				if l.succ.ID == "" {
					return
				}
				o := store.Outcome{ID: l.pred.ID, Fence: l.pred.Fence, Kind: store.OutcomeDone, Result: json.RawMessage(`1`),
					Contended: true, Ahead: 1, Successor: store.ClaimRef{ID: l.succ.ID, Fence: l.succ.Fence}}
				_, got, err := ho.CompleteHandOff(ctx, "w", []store.Outcome{o}, time.Time{},
					store.HandOff{Room: map[string]int{}, Lease: time.Minute, Reserve: true})
				if err != nil {
					fail(err)
					return
				}
				next := link{pred: l.succ}
				for _, c := range got {
					if c.After != "" {
						next.succ = c
					}
				}
				mu.Lock()
				chains[key] = &next
				mu.Unlock()
			}
		}()
	}
	flushers.Wait()
	close(stop)
	wg.Wait()
	require.Empty(t, errs, "no deadlock (40P01) between heartbeats and chain flushes")
}
