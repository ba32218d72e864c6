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
