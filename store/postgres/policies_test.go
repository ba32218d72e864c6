package postgres_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
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

// TestConcurrentClaimersUnderPoliciesAndRates: eight claimers on a queue
// with a policy (4 at once, 2 per key), gates, K = 1 keys and rate limits
// per key and per name never deadlock, never exceed a budget as SQL sees it,
// and drain the work.
func TestConcurrentClaimersUnderPoliciesAndRates(t *testing.T) {
	const (
		workers   = 8
		perKey    = 30
		maxActive = 4
		keyBudget = 2
	)
	e := newEnv(t)
	_, err := e.s.SyncKeyLimits(e.ctx, "ns", store.KeyLimits{
		Limits: []gate.Limit{{Name: "api", Limit: 3, Shards: 2}, {Name: "slow", Limit: 10}},
		RateLimits: []gate.RateLimit{
			{Name: "api", Limit: 2000, PerKey: true},
			{Name: "slow", Limit: 300, Burst: 3},
		}}, store.SyncOptions{})
	require.NoError(t, err)
	_, err = e.s.SyncConcurrencyPolicies(e.ctx, "ns", []store.ConcurrencyPolicy{{Queue: "q", MaxActive: maxActive, MaxActivePerKey: keyBudget}}, store.SyncOptions{})
	require.NoError(t, err)
	var ins []store.NewInstance
	for _, k := range []string{"acct:0", "acct:1", "api:x", "api:y", "slow:a", "slow:b", ""} {
		for range perKey {
			ins = append(ins, newInstance(k))
		}
	}
	e.insert(ins...)
	total := int64(len(ins))

	ctx, cancel := context.WithTimeout(e.ctx, 45*time.Second)
	defer cancel()
	var (
		finished   atomic.Int64
		slowStarts atomic.Int64
		errMu      sync.Mutex
		errs       []error
		wg         sync.WaitGroup
	)
	fail := func(err error) {
		errMu.Lock()
		errs = append(errs, err)
		errMu.Unlock()
		cancel()
	}
	began := time.Now()
	for w := range workers {
		worker := fmt.Sprintf("w%d", w)
		wg.Go(func() {
			for ctx.Err() == nil && finished.Load() < total {
				res, err := e.s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: worker, Limit: 3, Lease: time.Minute})
				if err != nil {
					if ctx.Err() == nil {
						fail(fmt.Errorf("%s claim: %w", worker, err))
					}
					return
				}
				if len(res.Claimed) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				var outs []store.Outcome
				for _, c := range res.Claimed {
					if gate.NameOf(c.Key) == "slow" {
						slowStarts.Add(1)
					}
					o := store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone}
					if c.Attempt < 1 {
						o = store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeReady, Step: "again", Attempt: 1}
					} else {
						finished.Add(1)
					}
					outs = append(outs, o)
				}
				time.Sleep(200 * time.Microsecond)
				if _, err := e.s.Complete(ctx, worker, outs, time.Time{}); err != nil {
					if ctx.Err() == nil {
						fail(fmt.Errorf("%s complete: %w", worker, err))
					}
					return
				}
			}
		})
	}
	wg.Go(func() {
		for ctx.Err() == nil && finished.Load() < total {
			var all, worst int
			err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM instances WHERE queue = 'q' AND status = 'executing'),
				coalesce((SELECT max(n) FROM (SELECT count(*) AS n FROM instances
				          WHERE queue = 'q' AND status = 'executing' AND key IS NOT NULL GROUP BY key) k), 0)`).Scan(&all, &worst)
			if err != nil {
				if ctx.Err() == nil {
					fail(err)
				}
				return
			}
			if all > maxActive || worst > keyBudget {
				fail(fmt.Errorf("SQL sees %d executing (max %d), %d of one key (max %d)", all, maxActive, worst, keyBudget))
			}
			time.Sleep(time.Millisecond)
		}
	})
	wg.Wait()
	require.Empty(t, errs)
	require.NoError(t, ctx.Err(), "work did not drain: %d of %d finished", finished.Load(), total)
	elapsed := time.Since(began)
	bound := int64(300*elapsed.Seconds()) + 3
	t.Logf("%d rows drained in %s; %d steps of slow:* started (rate bound %d)", total, elapsed, slowStarts.Load(), bound)
	require.LessOrEqual(t, slowStarts.Load(), bound)
	require.Zero(t, e.scalar(`SELECT count(*) FROM key_slots WHERE available <> capacity`))
}

// freshStores returns a constructor of stores, each in a schema of its own.
func freshStores(t *testing.T) func() store.Store {
	return func() store.Store { return newEnv(t).stores()() }
}

func TestWakesWithoutPolling(t *testing.T) {
	enginetest.WakesWithoutPolling(t, freshStores(t))
}

func TestClaimsOncePerRow(t *testing.T) {
	enginetest.ClaimsOncePerRow(t, freshStores(t))
}

func TestClaimingOnlyWhileClaimsComeBackFull(t *testing.T) {
	enginetest.ClaimingOnlyWhileClaimsComeBackFull(t, freshStores(t))
}

func TestGateSpreadsOverTheFleet(t *testing.T) {
	enginetest.GateSpreadsOverTheFleet(t, newEnv(t).stores())
}

func TestClaimedRowsDoNotWaitBehindChains(t *testing.T) {
	enginetest.ClaimedRowsDoNotWaitBehindChains(t, newEnv(t).stores())
}

func TestCancelOfAReservationMeansItNeverStarts(t *testing.T) {
	enginetest.CancelOfAReservationMeansItNeverStarts(t, newEnv(t).stores())
}

// TestPauseAcrossEngines: a queue paused while three engines run starts
// no step after the pause commits plus one poll interval, and drains after
// the resume.
func TestPauseAcrossEngines(t *testing.T) {
	e := newEnv(t)
	admin := e.stores()()
	enginetest.PauseAcrossEngines(t, e.stores(), func(t *testing.T, paused bool) {
		_, err := admin.PauseQueue(context.Background(), "mail", paused, time.Time{})
		require.NoError(t, err)
	})
}

// TestDebounceAcrossEngines: 8 goroutines × 3 engines insert 1,000 events
// over 50 debounce keys within 2 s; one instance per key runs, after the
// burst, and none later than MaxWait after its first event.
func TestDebounceAcrossEngines(t *testing.T) {
	enginetest.DebounceAcrossEngines(t, newEnv(t).stores())
}

func TestPerKeyLimitLive(t *testing.T) {
	enginetest.PerKeyLimitLive(t, newEnv(t).stores())
}

func TestPerKeyLimitLiveSeveralKeys(t *testing.T) {
	enginetest.PerKeyLimitLiveSeveralKeys(t, newEnv(t).stores())
}
