package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
)

// TestFreshRoundInlineMatchesTheRule: the statements read a row's fresh
// round inline (the fresh round and the key's last round of sql.go,
// written here as they write them); for the n-th row of a key made ready
// together it is admission.KeyFresh's, given the queue head, the key's
// last round and its rows there read plainly, and the key's limit. Over
// queues and priorities with keyless, K = 1 and gate rows (a per-key limit
// among them), blocked and executing rows at several rounds, for keys with
// and without rows and for no key.
func TestFreshRoundInlineMatchesTheRule(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	limits := []gate.Limit{{Name: "api", Limit: 3}, {Name: "api:big", Limit: 5}}
	_, err := s.SyncKeyLimits(ctx, store.DefaultNamespace, store.KeyLimits{Limits: limits}, store.SyncOptions{})
	require.NoError(t, err)
	ls, err := gate.NewLimits(limits)
	require.NoError(t, err)
	keys := []string{"acct:0", "acct:1", "acct:2", "acct:3", "acct:4", "api:a", "api:big"} // 7, 2 queues, 3 priorities: every mix
	var ins []store.NewInstance
	for i := range 130 {
		in := store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: []string{"a", "b"}[i%2],
			Priority: i % 3, Step: "s", State: json.RawMessage(`{}`)}
		if i%5 != 0 {
			in.Key = keys[i%len(keys)]
		}
		ins = append(ins, in)
	}
	_, err = s.Insert(ctx, ins)
	require.NoError(t, err)
	// Move some rows on: executing (claimed), and rounds that differ by queue.
	_, err = s.Claim(ctx, store.ClaimRequest{Queue: "a", Worker: "w", Limit: 7, Lease: time.Minute})
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, s.q(`UPDATE {schema}.instances SET status = 'blocked'
		WHERE status = 'ready' AND key = 'acct:3' AND queue = 'b'`))
	require.NoError(t, err)

	rows, err := s.pool.Query(ctx, s.q(freshRoundProbe))
	require.NoError(t, err)
	type sample struct {
		at          string
		key         string
		n           int
		head, taken int64
		last        *int64
		inline      int64
	}
	var got []sample
	for rows.Next() {
		var q string
		var p int
		var x sample
		if err := rows.Scan(&q, &p, &x.key, &x.n, &x.head, &x.last, &x.taken, &x.inline); err != nil {
			break
		}
		x.at = fmt.Sprintf("queue %s, priority %d, key %s, row %d", q, p, x.key, x.n)
		got = append(got, x)
	}
	rows.Close() // before any assertion: a failed one must not leave the connection held
	require.NoError(t, rows.Err())
	require.Len(t, got, 3*4*9*7)
	filled := 0
	for _, x := range got {
		var want int64
		if x.key == "-" {
			want = admission.KeylessFresh(x.head).Round // a keyless row is the only one of its group it is given
			if x.n > 0 {
				continue
			}
		} else {
			var last int64
			if x.last != nil {
				last = *x.last
			}
			f := admission.KeyFresh(x.head, last, x.last != nil, int(x.taken), ls.K(x.key))
			want = f.Nth(x.n)
			if f.Taken > 0 && f.Turns > 1 && x.n == 0 {
				filled++ // a gate key whose rows start in its last round, as many as it has turns left
			}
		}
		require.Equal(t, want, x.inline, x.at)
	}
	require.Greater(t, filled, 3, "some gate keys start in their last round, so the count of its turns is compared")
}

// freshRoundProbe reads, for every queue, priority, key and n of its
// lists, the parts admission.KeyFresh takes (read plainly) and the n-th
// fresh round as the statements write it inline; TestRulesAreWrittenAlike
// keeps its copy of the rules alike with theirs.
const freshRoundProbe = `
SELECT q, p, coalesce(k, '-'), n,
       coalesce((SELECT min(r.round) FROM {schema}.instances r WHERE r.status = 'ready' AND r.queue = q AND r.priority = p), 0),
       (SELECT max(r.round) FROM {schema}.instances r
        WHERE r.key = k AND r.queue = q AND r.priority = p AND r.status IN ('ready', 'blocked')),
       (SELECT count(*) FROM {schema}.instances r
        WHERE r.key = k AND r.queue = q AND r.priority = p AND r.status IN ('ready', 'blocked')
          AND r.round = (SELECT max(m.round) FROM {schema}.instances m
                         WHERE m.key = k AND m.queue = q AND m.priority = p AND m.status IN ('ready', 'blocked'))),
       (SELECT CASE WHEN fk.last >= fh.head THEN greatest(fk.last, fk.last - (fk.last & 1) + 2 * ((fk.taken + fr.n) / fk.turns))
                    ELSE greatest(fh.head, fh.head - (fh.head & 1) + 2 * (fr.n / fk.turns)) END
        FROM (SELECT q AS q, p AS p, k AS k, n AS n) fr
        CROSS JOIN LATERAL (SELECT (coalesce(least(
                                       (SELECT r.round FROM {schema}.instances r
                                        WHERE r.status = 'ready' AND r.key IS NULL AND r.queue = fr.q AND r.priority = fr.p
                                        ORDER BY r.round LIMIT 1),
                                       (SELECT r.round FROM {schema}.instances r
                                        WHERE r.status = 'ready' AND r.key IS NOT NULL AND r.queue = fr.q AND r.priority = fr.p
                                        ORDER BY r.round LIMIT 1)), 0) - 1) | 1 AS head) fh
        CROSS JOIN LATERAL (SELECT x.last, x.turns,
                                   CASE WHEN x.turns = 1 THEN 1
                                        ELSE (SELECT count(*) FROM (SELECT 1 FROM {schema}.instances r
                                                                    WHERE r.key = fr.k AND r.queue = fr.q AND r.priority = fr.p
                                                                      AND r.status IN ('ready', 'blocked') AND r.round = x.last
                                                                    LIMIT x.turns) c) END AS taken
                            FROM (SELECT (SELECT r.round FROM {schema}.instances r
                                          WHERE r.key = fr.k AND r.queue = fr.q AND r.priority = fr.p
                                            AND r.status IN ('ready', 'blocked')
                                          ORDER BY r.round DESC LIMIT 1) AS last,
                                         coalesce((SELECT greatest(lk."limit", 1) FROM {schema}.limits lk
                                                   WHERE lk.name IN (fr.k, split_part(fr.k, ':', 1))
                                                   ORDER BY length(lk.name) DESC LIMIT 1), 1) AS turns OFFSET 0) x) fk)
FROM unnest(ARRAY['a', 'b', 'c']) AS q, generate_series(0, 3) AS p,
     unnest(ARRAY[NULL, 'acct:0', 'acct:1', 'acct:2', 'acct:3', 'api:a', 'api:big', 'api:none', 'acct:9']) AS k,
     generate_series(0, 6) AS n`
