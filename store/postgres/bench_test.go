package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// benchStore is a migrated store whose pool commits durably (fsync) unless
// nosync is set.
func benchStore(b *testing.B, nosync bool) *env {
	b.Helper()
	ctx := context.Background()
	scratch := pgtest.Pool(b) // a fresh schema, dropped at cleanup
	schema := pgtest.SchemaOf(scratch)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(b))
	require.NoError(b, err)
	cfg.MaxConns = 16
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	if !nosync {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	} else {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	_, err = postgres.Migrate(ctx, pool, schema)
	require.NoError(b, err)
	s, err := postgres.New(ctx, pool, postgres.Options{Schema: schema})
	require.NoError(b, err)
	return &env{t: b, ctx: ctx, pool: pool, schema: schema, s: s}
}

// BenchmarkClaimComplete measures claim + complete throughput: 4 workers,
// each claiming up to 32 rows and completing them as done in one batch,
// until b.N rows are done.
//
//	go test ./store/postgres -run '^$' -bench ClaimComplete -benchtime 20000x
func BenchmarkClaimComplete(b *testing.B) {
	for _, sync := range []string{"fsync", "nosync"} {
		for _, kind := range []string{"nokey", "k1", "gate"} {
			b.Run(kind+"/"+sync, func(b *testing.B) {
				benchClaimComplete(b, kind, sync == "nosync")
			})
		}
	}
}

func benchClaimComplete(b *testing.B, kind string, nosync bool) {
	benchClaimCompleteBehind(b, kind, nosync, 0)
}

// BenchmarkUnregisteredBacklog is BenchmarkClaimComplete's keyless and K =
// 1 runs, with workers that claim only their workflow, on their own and
// behind a backlog of 200,000 ready rows of a workflow none of them runs
// (half of them keyless, half of distinct K = 1 keys), inserted first: a
// rolling deploy's backlog at the head of the queue. The two rates should
// be about the same.
//
//	go test ./store/postgres -run '^$' -bench UnregisteredBacklog -benchtime 20000x
func BenchmarkUnregisteredBacklog(b *testing.B) {
	for _, kind := range []string{"nokey", "k1"} {
		for _, backlog := range []int{0, 200_000} {
			b.Run(fmt.Sprintf("%s/behind-%d", kind, backlog), func(b *testing.B) {
				benchClaimCompleteBehind(b, kind, true, backlog)
			})
		}
	}
}

// benchClaimCompleteBehind runs BenchmarkClaimComplete's workload behind
// backlog ready rows of a workflow the workers do not claim (see
// BenchmarkUnregisteredBacklog).
func benchClaimCompleteBehind(b *testing.B, kind string, nosync bool, backlog int) {
	workers, batch := benchWorkers, 32
	e := benchStore(b, nosync)
	if kind == "gate" {
		_, err := e.s.SyncLimits(e.ctx, []gate.Limit{{Name: "api", Limit: 64, Shards: 8}})
		require.NoError(b, err)
	}
	var workflows []store.WorkflowVersion
	if backlog > 0 {
		workflows = []store.WorkflowVersion{{Workflow: "wf", Version: 1}}
		next := make([]store.NewInstance, backlog)
		for i := range next {
			key := ""
			if i%2 == 1 {
				key = fmt.Sprintf("next:%d", i) // one row per key: all ready
			}
			next[i] = store.NewInstance{ID: uuid.NewString(), Workflow: "next", Queue: "q", Step: "s",
				State: json.RawMessage(`{"n":1}`), Key: key}
		}
		for i := 0; i < len(next); i += 10_000 {
			_, err := e.s.Insert(e.ctx, next[i:min(i+10_000, len(next))])
			require.NoError(b, err)
		}
	}
	ins := make([]store.NewInstance, b.N)
	for i := range ins {
		key := ""
		switch kind {
		case "k1":
			key = fmt.Sprintf("acct:%d", i%2000) // 2000 keys, ~N/2000 rows each
		case "gate":
			key = fmt.Sprintf("api:%d", i%4) // 4 gate keys of K = 64
		}
		ins[i] = store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s",
			State: json.RawMessage(`{"n":1}`), Key: key}
	}
	for i := 0; i < len(ins); i += 10_000 {
		_, err := e.s.Insert(e.ctx, ins[i:min(i+10_000, len(ins))])
		require.NoError(b, err)
	}
	_, err := e.pool.Exec(e.ctx, "ANALYZE instances")
	require.NoError(b, err)

	var done, claims, completes atomic.Int64
	var claimNs, completeNs atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			worker := fmt.Sprintf("w%d", w)
			for done.Load() < int64(b.N) {
				t0 := time.Now()
				res, err := e.s.Claim(e.ctx, store.ClaimRequest{Queue: "q", Worker: worker, Limit: batch, Lease: time.Minute,
					Workflows: workflows})
				claimNs.Add(int64(time.Since(t0)))
				claims.Add(1)
				if err != nil {
					b.Error(err)
					return
				}
				if len(res.Claimed) == 0 {
					time.Sleep(200 * time.Microsecond)
					continue
				}
				outs := make([]store.Outcome, len(res.Claimed))
				for i, c := range res.Claimed {
					outs[i] = store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone}
				}
				t0 = time.Now()
				if _, err := e.s.Complete(e.ctx, worker, outs, time.Time{}); err != nil {
					b.Error(err)
					return
				}
				completeNs.Add(int64(time.Since(t0)))
				completes.Add(1)
				done.Add(int64(len(outs)))
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	if n := claims.Load(); n > 0 {
		b.ReportMetric(float64(claimNs.Load())/float64(n)/1e6, "ms/claim")
	}
	if n := completes.Load(); n > 0 {
		b.ReportMetric(float64(completeNs.Load())/float64(n)/1e6, "ms/complete")
		b.ReportMetric(float64(b.N)/float64(n), "rows/complete")
	}
}

// BenchmarkSaturatedBacklog measures how long keyless work waits behind a
// saturated key: 100,000 ready rows of one K = 1 key (its first row
// executing) are ahead of 10,000 keyless rows in the pick order. It reports
// the claims and the time to claim all keyless rows in batches of 50.
//
//	go test ./store/postgres -run '^$' -bench SaturatedBacklog -benchtime 1x
func BenchmarkSaturatedBacklog(b *testing.B) {
	for range b.N {
		b.StopTimer()
		e := benchStore(b, true)
		const hot, cold = 100_000, 10_000
		ins := make([]store.NewInstance, 0, hot+cold)
		base := time.Now().Add(-time.Hour)
		for i := range hot + cold {
			key := "tenant:hot"
			if i >= hot {
				key = ""
			}
			ins = append(ins, store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s",
				State: json.RawMessage(`{}`), Key: key, RunAt: base.Add(time.Duration(i) * time.Microsecond)})
		}
		for i := 0; i < len(ins); i += 10_000 {
			_, err := e.s.Insert(e.ctx, ins[i:i+10_000])
			require.NoError(b, err)
		}
		_, err := e.pool.Exec(e.ctx, "ANALYZE instances")
		require.NoError(b, err)
		b.StartTimer()

		start := time.Now()
		got, claims := 0, 0
		var first time.Duration
		for got < cold {
			res, err := e.s.Claim(e.ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 50, Lease: time.Hour})
			require.NoError(b, err)
			claims++
			for _, c := range res.Claimed {
				if c.Key == "" {
					if got == 0 {
						first = time.Since(start)
					}
					got++
				}
			}
			require.Less(b, claims, 10_000)
		}
		b.ReportMetric(float64(claims), "claims")
		b.ReportMetric(float64(first.Milliseconds()), "ms-to-first-keyless")
		b.ReportMetric(float64(time.Since(start).Milliseconds()), "ms-to-all-keyless")
		b.ReportMetric(float64(e.scalar(`SELECT count(*) FROM instances WHERE status = 'blocked'`)), "blocked")
	}
}

// benchWorkers is the number of claiming workers of BenchmarkClaimComplete
// (BENCH_WORKERS overrides it).
var benchWorkers = func() int {
	var n int
	if _, err := fmt.Sscan(os.Getenv("BENCH_WORKERS"), &n); err == nil && n > 0 {
		return n
	}
	return 4
}()

// BenchmarkInsertMany measures Store.Insert of one batch per iteration
// (fresh rows each time, durable commits) for batches of 100, 500, 1,000 and
// 20,000 rows, keyless, with a concurrency key per row (500 keys) and with
// two (a K = 1 key of 500 and a gate key of 20), through the single
// statement (stmt) and through COPY (copy).
//
//	go test ./store/postgres -run '^$' -bench InsertMany -benchtime 20x
func BenchmarkInsertMany(b *testing.B) {
	for _, kind := range []string{"nokey", "key", "several"} {
		for _, size := range []int{1, 10, 100, 500, 1000, 20_000} {
			for _, path := range []string{"stmt", "copy"} {
				b.Run(fmt.Sprintf("%s/%d/%s", kind, size, path), func(b *testing.B) {
					benchInsertMany(b, kind, size, path == "copy")
				})
			}
		}
	}
}

func benchInsertMany(b *testing.B, kind string, size int, copyIn bool) {
	e := benchStore(b, false)
	if copyIn {
		postgres.SetCopyInsertMin(e.s, 0)
	} else {
		postgres.SetCopyInsertMin(e.s, math.MaxInt)
	}
	batches := make([][]store.NewInstance, b.N)
	for n := range batches {
		ins := make([]store.NewInstance, size)
		off := 0
		if size < 100 {
			off = n * size // small batches spread over the keys, as separate requests would
		}
		for i := range ins {
			key := ""
			if kind != "nokey" {
				key = fmt.Sprintf("acct:%d", (off+i)%500)
			}
			ins[i] = store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Version: 1, Queue: "q", Step: "s",
				State: json.RawMessage(fmt.Sprintf(`{"I":%d,"K":-1}`, i)), Key: key}
			if kind == "several" {
				ins[i].Also = []store.KeyRef{{Key: fmt.Sprintf("api:%d", (off+i)%20), Intent: gate.GateIntent}}
			}
		}
		batches[n] = ins
	}
	b.ResetTimer()
	for n := range b.N {
		_, err := e.s.Insert(e.ctx, batches[n])
		require.NoError(b, err)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkInsertConcurrent measures single-row inserts of due keyless
// rows made by 16 goroutines at once (8 per core on this machine), as
// request handlers make them: each insert is its own transaction and
// notifies its queue.
//
//	go test ./store/postgres -run '^$' -bench InsertConcurrent -benchtime 3s
func BenchmarkInsertConcurrent(b *testing.B) {
	e := benchStore(b, false)
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			in := store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Version: 1, Queue: "q", Step: "s", State: json.RawMessage(`{}`)}
			if _, err := e.s.Insert(context.Background(), []store.NewInstance{in}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkChildCompletionsConcurrent measures the outcomes of last
// children, each waking its parent, made by 16 goroutines at once (8 per
// core on this machine), one child an outcome: the joins of many fan-outs
// on a fleet.
//
//	go test ./store/postgres -run '^$' -bench ChildCompletionsConcurrent -benchtime 2000x
func BenchmarkChildCompletionsConcurrent(b *testing.B) {
	e := benchStore(b, false)
	ctx := context.Background()
	parents := make([]store.NewInstance, b.N)
	for i := range parents {
		parents[i] = store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Version: 1, Queue: "q", Step: "s", State: json.RawMessage(`{}`)}
	}
	_, err := e.s.Insert(ctx, parents)
	require.NoError(b, err)
	claimAll := func(queue string) []store.Claimed {
		var all []store.Claimed
		for len(all) < b.N {
			res, err := e.s.Claim(ctx, store.ClaimRequest{Queue: queue, Worker: "w", Limit: 1000})
			require.NoError(b, err)
			require.NotEmpty(b, res.Claimed)
			all = append(all, res.Claimed...)
		}
		return all
	}
	var spawns []store.Outcome
	for _, c := range claimAll("q") {
		kid := store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Version: 1, Queue: "kids", Step: "s", State: json.RawMessage(`{}`)}
		spawns = append(spawns, store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeSpawn, Step: "joined", Children: []store.NewInstance{kid}})
	}
	for chunk := range slices.Chunk(spawns, 500) {
		_, err := e.s.Complete(ctx, "w", chunk, time.Time{})
		require.NoError(b, err)
	}
	kids := make(chan store.Claimed, b.N)
	for _, c := range claimAll("kids") {
		kids <- c
	}
	close(kids)
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c := <-kids
			if _, err := e.s.Complete(ctx, "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone}}, time.Time{}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "outcomes/s")
}

// BenchmarkReconcileBacklog measures one reconciler sweep over 12,000 K =
// 1 keys with a backlog past the ready cap (64 ready and 2 blocked rows
// each: 792,000 rows), on the table never analyzed (a bulk insert before
// autoanalyze) and then analyzed.
//
//	go test ./store/postgres -run '^$' -bench ReconcileBacklog -benchtime 1x
func BenchmarkReconcileBacklog(b *testing.B) {
	for range b.N {
		b.StopTimer()
		e := benchStore(b, true)
		_, err := e.pool.Exec(e.ctx, `INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, created_at, updated_at)
			SELECT gen_random_uuid(), 'wf', 'q', CASE WHEN r < 64 THEN 'ready' ELSE 'blocked' END, 's', now(), r,
			       'acct:' || k, now(), now()
			FROM generate_series(0, 11999) k, generate_series(0, 65) r`)
		require.NoError(b, err)
		b.StartTimer()
		for _, analyzed := range []bool{false, true} {
			if analyzed {
				_, err := e.pool.Exec(e.ctx, "ANALYZE instances")
				require.NoError(b, err)
			}
			t0 := time.Now()
			_, err := e.s.Reconcile(e.ctx, time.Hour, time.Time{})
			require.NoError(b, err)
			name := "ms-sweep-no-stats"
			if analyzed {
				name = "ms-sweep-analyzed"
			}
			b.ReportMetric(float64(time.Since(t0).Microseconds())/1000, name)
		}
	}
}

// BenchmarkLimitChange measures a limit change of a gate with 200 live
// rows in a table of 600,000 other rows (a third of them ready, the rest
// terminal): what every credit of the gate waits for while the change
// holds its counters.
//
//	go test ./store/postgres -run '^$' -bench LimitChange -benchtime 20x
func BenchmarkLimitChange(b *testing.B) {
	e := benchStore(b, true)
	_, err := e.pool.Exec(e.ctx, `INSERT INTO instances (id, workflow, queue, status, step, run_at, key, created_at, updated_at)
		SELECT gen_random_uuid(), 'wf', 'q', CASE WHEN i % 3 = 0 THEN 'ready' ELSE 'done' END, 's', now(), NULL, now(), now()
		FROM generate_series(1, 600000) i`)
	require.NoError(b, err)
	_, err = e.pool.Exec(e.ctx, `INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, created_at, updated_at)
		SELECT gen_random_uuid(), 'wf', 'q', 'blocked', 's', now(), 0, 'api:' || (i % 20), now(), now()
		FROM generate_series(1, 200) i`)
	require.NoError(b, err)
	_, err = e.s.SyncLimits(e.ctx, []gate.Limit{{Name: "api", Limit: 10}})
	require.NoError(b, err)
	b.ResetTimer()
	for i := range b.N {
		res, err := e.s.SyncLimits(e.ctx, []gate.Limit{{Name: "api", Limit: 11 + i%2}})
		require.NoError(b, err)
		require.Equal(b, int64(200), res.Live["api"])
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/change")
}

// BenchmarkManyKeyLimits measures the limits of a fleet that stores a
// per-key limit for each of 100,000 tenants (api:t0 .. api:t99999, under
// a name limit), with 200,000 ready rows over 10,000 of those keys and as
// many holding one of them beside an account's key (rows of several keys):
// setting the limit of one of them (`durable limits set`), syncing the
// whole set with one changed (`durable limits sync`), and a reconciler
// sweep over 20,000 other keys with counters (idle ones: the sweep deletes
// them) in chunks.
//
//	go test ./store/postgres -run '^$' -bench ManyKeyLimits -benchtime 5x
func BenchmarkManyKeyLimits(b *testing.B) {
	e := benchStore(b, true)
	limits := []gate.Limit{{Name: "api", Limit: 5}}
	for i := range 100_000 {
		limits = append(limits, gate.Limit{Name: fmt.Sprintf("api:t%d", i), Limit: 5 + i%50})
	}
	_, err := e.s.SyncKeyLimits(e.ctx, "ops", store.KeyLimits{Limits: limits}, store.SyncOptions{})
	require.NoError(b, err)
	_, err = e.pool.Exec(e.ctx, `INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, created_at, updated_at)
		SELECT gen_random_uuid(), 'wf', 'q', 'ready', 's', now(), i / 10000, 'api:t' || (i % 10000), now(), now()
		FROM generate_series(0, 199999) i`)
	require.NoError(b, err)
	_, err = e.pool.Exec(e.ctx, `INSERT INTO instances (id, workflow, queue, status, step, run_at, round, key, extra_keys, extra_intents, created_at, updated_at)
		SELECT gen_random_uuid(), 'wf', 'q', 'ready', 's', now(), 0, 'acct:' || i, ARRAY['api:t' || (i % 10000)], ARRAY[''], now(), now()
		FROM generate_series(0, 199999) i`)
	require.NoError(b, err)
	_, err = e.pool.Exec(e.ctx, "VACUUM ANALYZE instances")
	require.NoError(b, err)
	b.Run("set one", func(b *testing.B) {
		for i := range b.N {
			one := []gate.Limit{{Name: "api:t7", Limit: 60 + i%2}}
			_, err := e.s.SyncKeyLimits(e.ctx, "ops", store.KeyLimits{Limits: one}, store.SyncOptions{KeepOmitted: true})
			require.NoError(b, err)
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/set")
	})
	b.Run("set one, its counters busy", func(b *testing.B) {
		// Four transactions take the key's counters in turn, each for
		// 2 ms, as claims and step ends of a saturated gate key do: the
		// set must re-shape counters that are nearly never free.
		_, err := e.pool.Exec(e.ctx, `INSERT INTO key_slots (key, shard, capacity, available) VALUES ('api:t8', 0, 5, 5)
			ON CONFLICT DO NOTHING`)
		require.NoError(b, err)
		ctx, stop := context.WithCancel(e.ctx)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil {
					tx, err := e.pool.Begin(ctx)
					if err != nil {
						return
					}
					_, err = tx.Exec(ctx, "SELECT 1 FROM key_slots WHERE key = 'api:t8' FOR UPDATE")
					if err == nil {
						time.Sleep(2 * time.Millisecond)
						err = tx.Commit(ctx)
					}
					if err != nil {
						_ = tx.Rollback(e.ctx)
					}
				}
			})
		}
		time.Sleep(100 * time.Millisecond)
		b.ResetTimer()
		for i := range b.N {
			one := []gate.Limit{{Name: "api:t8", Limit: 60 + i%2}}
			_, err := e.s.SyncKeyLimits(e.ctx, "ops", store.KeyLimits{Limits: one}, store.SyncOptions{KeepOmitted: true})
			require.NoError(b, err)
		}
		b.StopTimer()
		stop()
		wg.Wait()
		var capacity int
		require.NoError(b, e.pool.QueryRow(e.ctx, "SELECT capacity FROM key_slots WHERE key = 'api:t8'").Scan(&capacity))
		require.Equal(b, 60+(b.N-1)%2, capacity, "the counters follow the last set")
		b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/set")
	})
	b.Run("sync all, one changed", func(b *testing.B) {
		for i := range b.N {
			limits[1].Limit = 70 + i%2
			_, err := e.s.SyncKeyLimits(e.ctx, "ops", store.KeyLimits{Limits: limits}, store.SyncOptions{})
			require.NoError(b, err)
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/sync")
	})
	b.Run("reconcile 20,000 keys", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			_, err := e.pool.Exec(e.ctx, `INSERT INTO key_slots (key, shard, capacity, available)
				SELECT 'api:t' || (10000 + i * 4), 0, 5, 5 FROM generate_series(0, 19999) i`)
			require.NoError(b, err)
			b.StartTimer()
			rep, err := e.s.Reconcile(e.ctx, 0, time.Time{})
			require.NoError(b, err)
			require.Equal(b, 20_000, rep.CountersDeleted)
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/sweep")
	})
}
