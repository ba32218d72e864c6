package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestExplainInsert prints EXPLAIN (ANALYZE, BUFFERS) of sqlInsert for three
// successive batches of 10,000 rows (keyless; 500 keys with
// EXPLAIN_KEYED=1). It is a measuring tool, skipped unless EXPLAIN_INSERT is
// set:
//
//	EXPLAIN_INSERT=1 go test -v -count=1 -run TestExplainInsert ./store/postgres/
func TestExplainInsert(t *testing.T) {
	if os.Getenv("EXPLAIN_INSERT") == "" {
		t.Skip()
	}
	ctx := context.Background()
	s := newInternalStore(t)
	for round := 0; round < 3; round++ {
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
		rows, err := s.pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+s.q(sqlInsert), s.insertArgs(p.rows)...)
		require.NoError(t, err)
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			fmt.Println(line)
		}
		require.NoError(t, rows.Err())
		fmt.Println("-----")
	}
}
