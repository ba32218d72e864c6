package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// TestRepairsReadTheLimitsOfTheirKeys: the counters' repairs (a limit
// change's re-shape, the reconciler's chunks) read the names' limits and
// the per-key limits of the keys they repair, not every stored limit (a
// fleet may store one for each of many thousand tenants, which every chunk
// of a sweep read while holding its counters), and still repair every key
// to the limit it runs under: its own where it has one, its name's
// otherwise, in chunks of two keys, and for a blocked key with no counter,
// read by the sweep's last chunk outside its range.
func TestRepairsReadTheLimitsOfTheirKeys(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	limits := []gate.Limit{{Name: "api", Limit: 3}, {Name: "mail", Limit: 2}}
	for i := range 500 {
		limits = append(limits, gate.Limit{Name: fmt.Sprintf("api:t%03d", i), Limit: 10})
	}
	limits = append(limits, gate.Limit{Name: "api:a", Limit: 7})
	_, err := s.SyncKeyLimits(ctx, "ops", store.KeyLimits{Limits: limits}, store.SyncOptions{})
	require.NoError(t, err)

	t.Run("the read", func(t *testing.T) {
		read := func(after string, upto *string, also []string) []gate.Limit {
			t.Helper()
			b := &pgx.Batch{}
			got := s.queueLimitsFor(b, after, upto, also)
			require.NoError(t, s.pool.SendBatch(ctx, b).Close())
			ls, err := got()
			require.NoError(t, err)
			return ls.All()
		}
		upto := "api:t012"
		require.Equal(t, []gate.Limit{
			{Name: "api", Limit: 3, Shards: 1}, {Name: "api:a", Limit: 7, Shards: 1},
			{Name: "api:t010", Limit: 10, Shards: 1}, {Name: "api:t011", Limit: 10, Shards: 1}, {Name: "api:t012", Limit: 10, Shards: 1},
			{Name: "mail", Limit: 2, Shards: 1},
		}, read("api:t009", &upto, []string{"api:a", "api:none", "api:t011"}))
		none := ""
		require.Equal(t, []gate.Limit{{Name: "api", Limit: 3, Shards: 1}, {Name: "mail", Limit: 2, Shards: 1}},
			read("", &none, nil), "no key: the names' limits only")
		require.Len(t, read("api:t489", nil, nil), 2+10, "no end: every per-key limit after")
	})

	t.Run("the reconciler", func(t *testing.T) {
		old := reconcileChunk
		reconcileChunk = 2
		defer func() { reconcileChunk = old }()
		// Counters made under wrong limits, over three chunks and the last.
		_, err := s.pool.Exec(ctx, s.q(`INSERT INTO {schema}.key_slots (key, shard, capacity, available) VALUES
			('api:b', 0, 5, 5), ('api:t007', 0, 4, 1), ('api:t200', 0, 3, 3), ('api:x', 0, 9, 9), ('mail:m', 0, 1, 0)`))
		require.NoError(t, err)
		// api:t200's counter has a row executing; api:a has blocked rows
		// and no counter, nothing executing: the last chunk promotes as many
		// as its own limit of 7.
		_, err = s.pool.Exec(ctx, s.q(`INSERT INTO {schema}.instances (id, workflow, queue, status, step, run_at, round, key, key_shard, worker, lease_expires_at, created_at, updated_at)
			SELECT gen_random_uuid(), 'wf', 'q', 'blocked', 's', now(), r, 'api:a', NULL, NULL, NULL, now(), now() FROM generate_series(0, 9) r
			UNION ALL
			SELECT gen_random_uuid(), 'wf', 'q', 'executing', 's', now(), 0, 'api:t200', 0, 'w', now() + interval '1 hour', now(), now()`))
		require.NoError(t, err)
		rep, err := s.Reconcile(ctx, 0, time.Time{})
		require.NoError(t, err)
		require.Equal(t, 7, rep.Promoted, "api:a's own limit, not its name's 3")
		counters := map[string][2]int{}
		rows, err := s.pool.Query(ctx, s.q(`SELECT key, capacity, available FROM {schema}.key_slots WHERE shard = 0`))
		require.NoError(t, err)
		var k string
		var c [2]int
		_, err = pgx.ForEachRow(rows, []any{&k, &c[0], &c[1]}, func() error { counters[k] = c; return nil })
		require.NoError(t, err)
		require.Equal(t, [2]int{10, 9}, counters["api:t200"], "its own limit of 10, one slot held")
		for _, idle := range []string{"api:b", "api:t007", "api:x", "mail:m"} {
			require.NotContains(t, counters, idle, "an idle counter is deleted")
		}
	})
}
