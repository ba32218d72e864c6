package postgres

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
		var cs claimScan
		for rows.Next() {
			c, err := scanClaimed(rows, &cs)
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

// BenchmarkEncodeArgs builds and encodes the parameters of a flush of 32
// plain outcomes (sqlCompleteApply: completeArgs) and of a claim of 32 rows
// (sqlClaim's ids), as pgx does before sending them; allocs/op / 32 is
// about the allocations per row.
//
//	go test ./store/postgres -run '^$' -bench EncodeArgs -benchmem
func BenchmarkEncodeArgs(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.Pool(b)
	_, err := Migrate(ctx, pool, pgtest.SchemaOf(pool))
	require.NoError(b, err)
	s, err := New(ctx, pool, Options{Schema: pgtest.SchemaOf(pool)})
	require.NoError(b, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(b, err)
	defer conn.Release()
	const n = 32
	outs := make([]store.Outcome, n)
	ids := make([]string, n)
	shards := make([]int32, n)
	for i := range outs {
		ids[i] = uuid.NewString()
		outs[i] = store.Outcome{ID: ids[i], Fence: int64(1_000_000 + i), Kind: store.OutcomeDone, Step: "run",
			State: json.RawMessage(`{"i":12345,"k":0}`), Result: json.RawMessage(`null`), Attempt: 1}
	}
	for _, bc := range []struct {
		name string
		sql  string
		args func() []any
	}{
		{"complete", sqlCompleteApply, func() []any { return s.completeArgs("bench-worker", outs, time.Time{}, outcomeChains{}) }},
		{"claim", sqlClaim, func() []any {
			return []any{uuidArg(ids), "bench-worker", micros(time.Minute), shards, nil, nil, nil, nil}
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			sd, err := conn.Conn().Prepare(ctx, "", s.q(bc.sql))
			require.NoError(b, err)
			var eqb pgx.ExtendedQueryBuilder
			m := conn.Conn().TypeMap()
			b.ReportAllocs()
			for b.Loop() {
				if err := eqb.Build(m, sd, bc.args()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
