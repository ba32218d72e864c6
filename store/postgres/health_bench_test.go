package postgres_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// BenchmarkHealth measures Health on a schema holding 200,000 ready rows
// (150,000 keyless, 50,000 with distinct keys), 100,000 done rows (the retention window, which Health must never read),
// 10,000 awaiting rows, 2,000 failed rows, 5,000 blocked rows of 50
// saturated gate keys and 500 executing rows:
//
//	go test ./store/postgres -run '^$' -bench BenchmarkHealth -benchtime 50x
//
// Set HEALTH_EXPLAIN=1 to log each statement's plan.
func BenchmarkHealth(b *testing.B) {
	e := newEnv(b)
	const (
		ready   = 200_000
		done    = 100_000
		parked  = 10_000
		failed  = 2_000
		keys    = 50
		perKey  = 100
		running = 500
	)
	_, err := e.s.SyncLimits(e.ctx, []gate.Limit{{Name: "stripe", Limit: 2}})
	require.NoError(b, err)
	insert := func(queue string, n int, key func(i int) string) {
		for off := 0; off < n; off += 10_000 {
			batch := make([]store.NewInstance, 0, 10_000)
			for i := off; i < min(n, off+10_000); i++ {
				ni := newInstance(key(i))
				ni.Queue = queue
				ni.RunAt = time.Now().Add(-time.Duration(n-i) * time.Millisecond)
				batch = append(batch, ni)
			}
			e.insert(batch...)
		}
	}
	none := func(int) string { return "" }
	// Rows that end done, awaiting and failed are seeded with SQL: walking
	// 112,000 rows through claims would only slow the setup down.
	insert("old", done+parked+failed, none)
	_, err = e.pool.Exec(e.ctx, `UPDATE instances SET status = CASE
		WHEN seq % 56 < 5 THEN 'awaiting' WHEN seq % 56 = 5 THEN 'failed' ELSE 'done' END,
		await_signal = CASE WHEN seq % 56 < 5 THEN 'go' END WHERE queue = 'old'`)
	require.NoError(b, err)
	// Saturated gate keys: two executing rows each, the rest blocked.
	insert("hot", keys*perKey, func(i int) string { return fmt.Sprintf("stripe:%d", i%keys) })
	for {
		res, err := e.s.Claim(e.ctx, store.ClaimRequest{Queue: "hot", Worker: "w", Limit: 1000, Lease: time.Hour})
		require.NoError(b, err)
		if len(res.Claimed) == 0 {
			break
		}
	}
	insert("busy", running, none)
	res, err := e.s.Claim(e.ctx, store.ClaimRequest{Queue: "busy", Worker: "w", Limit: running, Lease: time.Hour})
	require.NoError(b, err)
	require.Len(b, res.Claimed, running)
	insert("q", ready-50_000, none)
	insert("q", 50_000, func(i int) string { return fmt.Sprintf("acct:%d", i) })
	_, err = e.pool.Exec(e.ctx, "VACUUM ANALYZE instances")
	require.NoError(b, err)

	h, err := e.s.Health(e.ctx, time.Time{})
	require.NoError(b, err)
	byName := map[string]store.QueueHealth{}
	for _, q := range h.Queues {
		byName[q.Queue] = q
	}
	require.Equal(b, int64(ready), byName["q"].Ready)
	require.Equal(b, int64(running), byName["busy"].Executing)
	require.Equal(b, int64(keys*2), byName["hot"].Executing)
	require.Equal(b, int64(keys*(perKey-2)), byName["hot"].Blocked)
	require.Positive(b, byName["old"].Awaiting)
	require.Positive(b, byName["old"].Failed)
	require.Equal(b, keys, h.Gates[0].SaturatedKeys)
	b.Logf("health: %+v", h)

	if os.Getenv("HEALTH_EXPLAIN") == "1" {
		for _, q := range postgres.HealthStatements(e.schema) {
			// As Health runs them: in one transaction, without parallel workers.
			err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(e.ctx, "SET LOCAL max_parallel_workers_per_gather = 0"); err != nil {
					return err
				}
				rows, err := tx.Query(e.ctx, "EXPLAIN (ANALYZE, BUFFERS) "+q.SQL, q.Args...)
				if err != nil {
					return err
				}
				plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
				b.Logf("%s:\n%s", q.Name, strings.Join(plan, "\n"))
				return err
			})
			require.NoError(b, err)
		}
	}

	b.ResetTimer()
	for b.Loop() {
		if _, err := e.s.Health(e.ctx, time.Time{}); err != nil {
			b.Fatal(err)
		}
	}
}
