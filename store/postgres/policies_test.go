package postgres_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/enginetest"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/transitions"
)

// stores returns a constructor of stores sharing e's database, one per
// engine, as separate processes would have.
func (e *env) stores() func() store.Store {
	return func() store.Store {
		s, err := postgres.New(e.ctx, e.pool, postgres.Options{Schema: e.schema})
		require.NoError(e.t, err)
		return s
	}
}

func TestMaxActiveAcrossEngines(t *testing.T) {
	enginetest.MaxActiveAcrossEngines(t, newEnv(t).stores())
}

func TestRateLimitAcrossEngines(t *testing.T) {
	enginetest.RateAcrossEngines(t, newEnv(t).stores(), time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
}

// TestTenantBacklogDoesNotDelayAnotherTenant: with a tenant gate of 50 and
// 20 executors, tenant A inserts 10,000 instances, then tenant B inserts
// one: B's instance starts before A's 100th does.
func TestTenantBacklogDoesNotDelayAnotherTenant(t *testing.T) {
	e := newEnv(t)
	var (
		mu      sync.Mutex
		aStarts int
		bAfter  = -1 // A's starts before B's
		bDone   = make(chan struct{})
	)
	type st struct{}
	wf := durable.NewWorkflow[st]("tenant", "run", durable.WorkflowOptions{})
	wf.Step("run", func(ctx steps.Context, s st) (transitions.Transition, error) {
		mu.Lock()
		if ctx.Key() == "tenant:b" {
			bAfter = aStarts
			close(bDone)
		} else {
			aStarts++
		}
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		return transitions.Done(0), nil
	})
	eng, err := durable.New(durable.Config{Store: e.s, Queues: map[string]int{durable.DefaultQueue: 20},
		Limits: []gate.Limit{{Name: "tenant", Limit: 50}}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, eng.Register(wf))
	require.NoError(t, eng.Start(e.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Stop(ctx)
	})

	reqs := make([]durable.InsertRequest, 10_000)
	for i := range reqs {
		reqs[i] = durable.InsertRequest{Workflow: "tenant", State: st{}, Options: durable.InsertOptions{Key: gate.Gate("tenant", "a")}}
	}
	_, err = eng.InsertMany(e.ctx, reqs)
	require.NoError(t, err)
	_, err = eng.Insert(e.ctx, "tenant", st{}, durable.InsertOptions{Key: gate.Gate("tenant", "b")})
	require.NoError(t, err)
	select {
	case <-bDone:
	case <-time.After(60 * time.Second):
		t.Fatal("tenant B's instance never started")
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("tenant B started after %d of tenant A's instances", bAfter)
	require.Less(t, bAfter, 100, "tenant B waited behind tenant A's backlog")
}
