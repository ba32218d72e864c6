package storetest

import (
	"fmt"
	"sync"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

// Races between two callers that each must see the other's commit or none
// of it. The memory store serializes everything, so these matter most for
// backends with real concurrency.

const raceRows = 60

var raceTests = []test{
	{"races/a signal racing the park is never lost", func(h *harness) {
		nis := make([]store.NewInstance, raceRows)
		for i := range nis {
			nis[i] = inst("")
		}
		h.insert(nis...)
		cs := h.claim("w", raceRows, at(time.Second))
		require.Len(h.t, cs, raceRows)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, c := range cs {
			wg.Go(func() {
				<-start
				res, err := h.s.Complete(h.ctx, "w", []store.Outcome{await(c, "go", "after")}, at(2*time.Second))
				if err != nil || res[0].Stale {
					h.t.Errorf("await of %s: %v %+v", c.ID, err, res)
				}
			})
			wg.Go(func() {
				<-start
				if _, err := h.s.Signal(h.ctx, store.SignalRequest{InstanceID: c.ID, Name: "go", Now: at(2 * time.Second)}); err != nil {
					h.t.Errorf("signal %s: %v", c.ID, err)
				}
			})
		}
		close(start)
		wg.Wait()
		require.Empty(h.t, h.list(store.ListFilter{Status: store.StatusAwaiting}), "an await missed the signal that raced it")
		woken := h.claim("w", raceRows, at(3*time.Second))
		require.Len(h.t, woken, raceRows)
		for _, c := range woken {
			require.NotNil(h.t, c.Signal, "%s ran without its signal", c.ID)
			require.Equal(h.t, "go", c.Signal.Name)
		}
	}},
	{"races/reap racing an outcome commits exactly one of them", func(h *harness) {
		h.syncLimits(gate.Limit{Name: "stripe", Limit: raceRows, Shards: 4})
		for i := range raceRows {
			ni := inst("stripe:a")
			if i%2 == 1 {
				ni.Key = fmt.Sprintf("account:%d", i)
			}
			h.insert(ni)
		}
		cs := h.claim("w", raceRows, at(0))
		require.Len(h.t, cs, raceRows)
		stale := make([]bool, len(cs))
		var reaped int
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, c := range cs {
			wg.Go(func() {
				<-start
				res, err := h.s.Complete(h.ctx, "w", []store.Outcome{done(c)}, at(2*lease))
				if err != nil {
					h.t.Errorf("complete %s: %v", c.ID, err)
					return
				}
				stale[i] = res[0].Stale
			})
		}
		wg.Go(func() {
			<-start
			for range 5 {
				n, err := h.s.Reap(h.ctx, at(2*lease))
				if err != nil {
					h.t.Errorf("reap: %v", err)
					return
				}
				reaped += n
			}
		})
		close(start)
		wg.Wait()

		nStale := 0
		for i, c := range cs {
			got := h.get(c.ID)
			if stale[i] {
				nStale++
				require.Equal(h.t, store.StatusReady, got.Status, "%s: stale outcome, so the reap won", c.ID)
				require.Equal(h.t, 1, got.Attempt)
			} else {
				require.Equal(h.t, store.StatusDone, got.Status, "%s: committed outcome, so the reap lost", c.ID)
				require.Equal(h.t, 0, got.Attempt)
			}
		}
		require.Equal(h.t, reaped, nStale, "every reaped claim, and only those, reported stale")
		require.Empty(h.t, h.executing("stripe:a"))
		require.Equal(h.t, raceRows-countReapedGate(cs, stale), h.available("stripe:a"),
			"committed outcomes credited their slots; reaped ones did not")
		h.reconcile(0, at(3*lease))
		require.Equal(h.t, raceRows, h.available("stripe:a"), "reconcile restores the reaped slots")
	}},
}

// countReapedGate counts the gate rows (even indexes) whose outcome was stale.
func countReapedGate(cs []store.Claimed, stale []bool) int {
	n := 0
	for i, c := range cs {
		if stale[i] && c.Key == "stripe:a" {
			n++
		}
	}
	return n
}
