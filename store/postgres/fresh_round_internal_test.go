package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// TestFreshRoundInlineMatchesTheFunction: the statements read a row's fresh
// round inline (the fresh round of sql.go, written here as they write it);
// it is the value migration 003's fresh_round
// gives, over queues and priorities with keyless, keyed, blocked and
// executing rows at several rounds, for keys with and without rows and for
// no key.
func TestFreshRoundInlineMatchesTheFunction(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	var ins []store.NewInstance
	for i := range 60 {
		in := store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: []string{"a", "b"}[i%2],
			Priority: i % 3, Step: "s", State: json.RawMessage(`{}`)}
		if i%4 != 0 {
			in.Key = fmt.Sprintf("acct:%d", i%5)
		}
		ins = append(ins, in)
	}
	_, err := s.Insert(ctx, ins)
	require.NoError(t, err)
	// Move some rows on: executing (claimed), and rounds that differ by queue.
	_, err = s.Claim(ctx, store.ClaimRequest{Queue: "a", Worker: "w", Limit: 7, Lease: time.Minute})
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, s.q(`UPDATE {schema}.instances SET status = 'blocked'
		WHERE status = 'ready' AND key = 'acct:3' AND queue = 'b'`))
	require.NoError(t, err)

	rows, err := s.pool.Query(ctx, s.q(`
SELECT q, p, coalesce(k, '-'), {schema}.fresh_round(q, p, k),
       (SELECT greatest(coalesce(least(
                            (SELECT r.round FROM {schema}.instances r
                             WHERE r.status = 'ready' AND r.key IS NULL AND r.queue = fr.q AND r.priority = fr.p
                             ORDER BY r.round LIMIT 1),
                            (SELECT r.round FROM {schema}.instances r
                             WHERE r.status = 'ready' AND r.key IS NOT NULL AND r.queue = fr.q AND r.priority = fr.p
                             ORDER BY r.round LIMIT 1)), 0),
                        (SELECT r.round + 1 FROM {schema}.instances r
                         WHERE r.key = fr.k AND r.queue = fr.q AND r.priority = fr.p AND r.status IN ('ready', 'blocked')
                         ORDER BY r.round DESC LIMIT 1))
        FROM (SELECT q AS q, p AS p, k AS k) fr)
FROM unnest(ARRAY['a', 'b', 'c']) AS q, generate_series(0, 3) AS p,
     unnest(ARRAY[NULL, 'acct:0', 'acct:1', 'acct:2', 'acct:3', 'acct:4', 'acct:9']) AS k`))
	require.NoError(t, err)
	type pair struct {
		at         string
		fn, inline int64
	}
	var got []pair
	for rows.Next() {
		var q, k string
		var p int
		var x pair
		if err := rows.Scan(&q, &p, &k, &x.fn, &x.inline); err != nil {
			break
		}
		x.at = fmt.Sprintf("queue %s, priority %d, key %s", q, p, k)
		got = append(got, x)
	}
	rows.Close() // before any assertion: a failed one must not leave the connection held
	require.NoError(t, rows.Err())
	require.Len(t, got, 3*4*7)
	nonzero := 0
	for _, x := range got {
		require.Equal(t, x.fn, x.inline, x.at)
		if x.fn > 0 {
			nonzero++
		}
	}
	require.Greater(t, nonzero, 10, "the rows give rounds other than 0 to compare")
}
