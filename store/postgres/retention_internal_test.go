package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRetentionChunksResumeWhereTheLastEnded: a sweep deletes every
// terminal row past the retention over several chunks, each starting at
// the last one's updated_at, including rows that share the updated_at a
// chunk ended on, and keeps the rest.
func TestRetentionChunksResumeWhereTheLastEnded(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	now := time.Now()
	// 2,500 old rows, seven to each updated_at (no chunk of 1,000 ends on
	// a group's last row), 300 recent ones, 40 old rows still running.
	_, err := s.pool.Exec(ctx, s.q(`
INSERT INTO {schema}.instances (id, workflow, version, queue, status, step, state, attempt, run_at, created_at, updated_at)
SELECT gen_random_uuid(), 'wf', 1, 'default', CASE WHEN i % 3 = 0 THEN 'failed' ELSE 'done' END, 's', '{}'::jsonb, 0, t, t, t
FROM (SELECT i, $1::timestamptz - interval '10 days' + (i / 7) * interval '1 second' AS t FROM generate_series(0, 2499) i) g
UNION ALL
SELECT gen_random_uuid(), 'wf', 1, 'default', 'done', 's', '{}'::jsonb, 0, $1, $1, $1 FROM generate_series(1, 300)
UNION ALL
SELECT gen_random_uuid(), 'wf', 1, 'default', 'awaiting', 's', '{}'::jsonb, 0, t, t, t
FROM (SELECT $1::timestamptz - interval '10 days' AS t FROM generate_series(1, 40)) g`), now)
	require.NoError(t, err)
	rep, err := s.Reconcile(ctx, 7*24*time.Hour, now)
	require.NoError(t, err)
	require.Equal(t, 2500, rep.InstancesDeleted)
	var left, old int
	require.NoError(t, s.pool.QueryRow(ctx, s.q(`SELECT count(*), count(*) FILTER (WHERE updated_at < $1::timestamptz - interval '1 day')
		FROM {schema}.instances`), now).Scan(&left, &old))
	require.Equal(t, 340, left)
	require.Equal(t, 40, old, "only the running rows are older than the retention")
}
