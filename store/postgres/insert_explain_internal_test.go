package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestExplainInsert prints EXPLAIN (ANALYZE, BUFFERS) of sqlInsert for three
// successive batches of 10,000 rows (keyless; 500 keys with
// EXPLAIN_KEYED=1), each followed by a batch of the same shape through the
// COPY path: the execution time of its round query (sqlInsertRounds, under
// EXPLAIN ANALYZE, in a transaction rolled back) and the wall time of
// copyInsert and its commit. It is a measuring tool, skipped unless
// EXPLAIN_INSERT is set:
//
//	EXPLAIN_INSERT=1 go test -v -count=1 -run TestExplainInsert ./store/postgres/
func TestExplainInsert(t *testing.T) {
	if os.Getenv("EXPLAIN_INSERT") == "" {
		t.Skip()
	}
	ctx := context.Background()
	s := newInternalStore(t)
	batch := func() []insertRow {
		ins := make([]store.NewInstance, 10_000)
		for i := range ins {
			key := ""
			if os.Getenv("EXPLAIN_KEYED") != "" {
				key = fmt.Sprintf("acct:%d", i%500)
			}
			ins[i] = store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Version: 1, Queue: "q", Step: "s", State: json.RawMessage(fmt.Sprintf(`{"I":%d,"K":-1}`, i)), Key: key}
		}
		p, err := prepareInsert(ins)
		require.NoError(t, err)
		return p.rows
	}
	for round := 0; round < 3; round++ {
		rows, err := s.pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+s.q(sqlInsert), s.insertArgs(&insertPlan{rows: batch(), block: true, wakeAfter: true})...)
		require.NoError(t, err)
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			fmt.Println(line)
		}
		require.NoError(t, rows.Err())

		cp := batch()
		tx, err := s.pool.Begin(ctx)
		require.NoError(t, err)
		// The round query's groups: (q, 0, key) of every key of the batch.
		var qs, keys []string
		var prios []int32
		var runAts []*time.Time
		var delays []int64
		seen := map[string]bool{}
		for _, r := range cp {
			if !seen[r.in.Key] {
				seen[r.in.Key] = true
				qs, prios, keys = append(qs, "q"), append(prios, 0), append(keys, r.in.Key)
				runAts, delays = append(runAts, nil), append(delays, 0)
			}
		}
		var plan string
		err = tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+s.q(sqlInsertRounds), s.clockNow(),
			qs, prios, keys, runAts, delays, s.channel, true).Scan(&plan)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		t0 := time.Now()
		require.NoError(t, s.inTx(ctx, func(tx pgx.Tx) error { return s.copyInsert(ctx, tx, &insertPlan{rows: cp, block: true}) }))
		fmt.Printf("COPY path: round query %s; copyInsert + commit %s\n", planTime(plan), time.Since(t0))
		fmt.Println("-----")
	}
}

// planTime is the "Execution Time" of an EXPLAIN (ANALYZE, FORMAT JSON).
func planTime(plan string) string {
	var p []struct {
		ExecutionTime float64 `json:"Execution Time"`
	}
	if err := json.Unmarshal([]byte(plan), &p); err != nil || len(p) == 0 {
		return "?"
	}
	return fmt.Sprintf("%.2fms", p[0].ExecutionTime)
}
