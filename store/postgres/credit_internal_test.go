package postgres

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
)

// TestCreditMatchesAdmission pins sqlCredit and sqlSlotsDropEmpty to
// admission.Credit, the credit rule's one statement: over a grid of counter
// shapes, slots returned, and limits (none; shards 1..3 with limits that
// leave shards beyond their count and shards larger than their share), it
// writes the counters and limits, runs what queueFree runs for a credit
// (sqlSlotsLockExisting, sqlCredit, sqlSlotsDropEmpty, in one transaction,
// with every case in the same arrays), and compares each counter it reads
// back (or its absence) with what Credit returns. The schema's check that
// available is not negative is dropped, so that debt (which this store
// never writes, but the rule defines) is compared too.
func TestCreditMatchesAdmission(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	_, err := s.pool.Exec(ctx, s.q(`ALTER TABLE {schema}.key_slots DROP CONSTRAINT key_slots_available_check`))
	require.NoError(t, err)

	// limits[0] is no limit (the name "none" has none).
	limits := []*gate.Limit{nil}
	for shards := 1; shards <= 3; shards++ {
		for limit := shards; limit <= 5; limit++ {
			limits = append(limits, &gate.Limit{Name: fmt.Sprintf("l%dx%d", limit, shards), Limit: limit, Shards: shards})
		}
	}
	for _, l := range limits[1:] {
		_, err := s.pool.Exec(ctx, s.q(`INSERT INTO {schema}.limits (name, "limit", shards) VALUES ($1, $2, $3)`),
			l.Name, l.Limit, l.Shards)
		require.NoError(t, err)
	}

	type tcase struct {
		key string
		c   admission.Counter
		n   int
		lim *gate.Limit
	}
	var cases []tcase
	var ks []string
	var shards, capacities, availables, ns []int32
	for li, l := range limits {
		name := "none"
		if l != nil {
			name = l.Name
		}
		for capacity := 0; capacity <= 4; capacity++ {
			for available := -2; available <= capacity; available++ {
				for n := 1; n <= 3; n++ {
					for shard := 0; shard <= 3; shard++ {
						tc := tcase{key: fmt.Sprintf("%s:%d", name, len(cases)), n: n, lim: limits[li],
							c: admission.Counter{Shard: shard, Capacity: capacity, Available: available}}
						cases = append(cases, tc)
						ks = append(ks, tc.key)
						shards = append(shards, int32(shard))
						capacities = append(capacities, int32(capacity))
						availables = append(availables, int32(available))
						ns = append(ns, int32(n))
					}
				}
			}
		}
	}
	_, err = s.pool.Exec(ctx, s.q(`INSERT INTO {schema}.key_slots (key, shard, capacity, available)
		SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::int[])`), ks, shards, capacities, availables)
	require.NoError(t, err)

	// What queueFree queues for a credit, in one transaction. Its arrays
	// come sorted by (key, shard) (see shardCounts); the statements lock in
	// that order themselves, so the cases' order does not matter here.
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(s.q(sqlSlotsLockExisting), ks, shards)
		b.Queue(s.q(sqlCredit), ks, shards, ns)
		b.Queue(s.q(sqlSlotsDropEmpty), ks, shards)
		return tx.SendBatch(ctx, b).Close()
	})
	require.NoError(t, err)

	type got struct{ capacity, available int }
	after := map[string]got{}
	rows, err := s.pool.Query(ctx, s.q(`SELECT key, capacity, available FROM {schema}.key_slots`))
	require.NoError(t, err)
	var k string
	var g got
	_, err = pgx.ForEachRow(rows, []any{&k, &g.capacity, &g.available}, func() error {
		after[k] = g
		return nil
	})
	require.NoError(t, err)

	bad := 0
	for _, tc := range cases {
		want, drop := admission.Credit(tc.c, tc.n, tc.lim)
		have, kept := after[tc.key]
		switch {
		case drop && kept:
			t.Errorf("%s %+v n=%d limit %+v: Credit drops it, PostgreSQL kept %+v", tc.key, tc.c, tc.n, tc.lim, have)
		case !drop && !kept:
			t.Errorf("%s %+v n=%d limit %+v: Credit gives %+v, PostgreSQL dropped it", tc.key, tc.c, tc.n, tc.lim, want)
		case kept && (have.capacity != want.Capacity || have.available != want.Available):
			t.Errorf("%s %+v n=%d limit %+v: Credit gives %+v, PostgreSQL %+v", tc.key, tc.c, tc.n, tc.lim, want, have)
		default:
			continue
		}
		if bad++; bad >= 20 {
			t.Fatalf("more differences left out (%d cases)", len(cases))
		}
	}
	// The grid must reach every branch of the rule.
	var drops, shrunk, beyond, none int
	for _, tc := range cases {
		want, drop := admission.Credit(tc.c, tc.n, tc.lim)
		switch {
		case drop:
			drops++
		case want.Capacity < tc.c.Capacity:
			shrunk++
		}
		if tc.lim == nil {
			none++
		} else if tc.c.Shard >= tc.lim.Shards {
			beyond++
		}
	}
	require.Positive(t, drops)
	require.Positive(t, shrunk)
	require.Positive(t, beyond)
	require.Positive(t, none)
}
