package postgres

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store"
)

// BenchmarkScanClaimed reads 32 claimed rows (the columns and signal of a
// claim's RETURNING, without the claim) and scans each with scanClaimed, as
// Claim does; allocs/op / 32 is about the allocations per claimed row
// (the query's own are shared by the 32).
//
//	go test ./store/postgres -run '^$' -bench ScanClaimed -benchmem
func BenchmarkScanClaimed(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.Pool(b)
	_, err := Migrate(ctx, pool, pgtest.SchemaOf(pool))
	require.NoError(b, err)
	s, err := New(ctx, pool, Options{Schema: pgtest.SchemaOf(pool)})
	require.NoError(b, err)
	const n = 32
	ins := make([]store.NewInstance, n)
	ids := make([]string, n)
	for i := range ins {
		ids[i] = uuid.NewString()
		ins[i] = store.NewInstance{ID: ids[i], Workflow: "noop", Queue: "default", Step: "run", State: json.RawMessage(`{"i":12345,"k":0}`)}
	}
	_, err = s.Insert(ctx, ins)
	require.NoError(b, err)
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "default", Worker: "bench-worker", Limit: n})
	require.NoError(b, err)
	require.Len(b, res.Claimed, n)
	query := s.q(`SELECT ` + instanceColumns + `, NULL::bigint, NULL::text, NULL::jsonb, NULL::text, NULL::timestamptz
FROM {schema}.instances c WHERE id = ANY($1::uuid[]) ORDER BY id`)
	claimed := make([]store.Claimed, 0, n)
	b.ReportAllocs()
	for b.Loop() {
		rows, err := s.pool.Query(ctx, query, ids)
		if err != nil {
			b.Fatal(err)
		}
		claimed = claimed[:0]
		for rows.Next() {
			c, err := scanClaimed(rows)
			if err != nil {
				b.Fatal(err)
			}
			claimed = append(claimed, c)
		}
		if err := rows.Err(); err != nil || len(claimed) != n {
			b.Fatal(err, len(claimed))
		}
	}
}
