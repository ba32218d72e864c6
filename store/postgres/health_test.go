package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store/postgres"
)

// TestHealthReadsThroughIndexes plans every Health statement with
// sequential scans disabled: a statement no partial index can serve would
// still plan a sequential scan of instances (reading every terminal row of
// the retention window), and fails here.
func TestHealthReadsThroughIndexes(t *testing.T) {
	e := newEnv(t)
	for _, st := range postgres.HealthStatements(e.schema) {
		t.Run(st.Name, func(t *testing.T) {
			err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(e.ctx, "SET LOCAL enable_seqscan = off"); err != nil {
					return err
				}
				rows, err := tx.Query(e.ctx, "EXPLAIN "+st.SQL, st.Args...)
				if err != nil {
					return err
				}
				plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					return err
				}
				text := strings.Join(plan, "\n")
				require.NotContains(t, text, "Seq Scan on instances", "a statement of Health scans the table:\n%s", text)
				return nil
			})
			require.NoError(t, err)
		})
	}
}

// TestHealthNamesTheOldestSnapshot: a transaction left open with its
// snapshot taken shows in Health as the oldest snapshot, with how long it
// has been open and how many transactions ran since, and is gone once it
// ends.
func TestHealthNamesTheOldestSnapshot(t *testing.T) {
	e := newEnv(t)
	conn, err := pgx.Connect(e.ctx, e.pool.Config().ConnConfig.ConnString())
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(e.ctx, "SET application_name = 'left-open'")
	require.NoError(t, err)
	tx, err := conn.BeginTx(e.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx.QueryRow(e.ctx, "SELECT pg_backend_pid()").Scan(&pid))
	// Transactions after the snapshot: each takes a transaction id.
	for range 3 {
		_, err := e.pool.Exec(e.ctx, "SELECT txid_current()")
		require.NoError(t, err)
	}
	time.Sleep(1100 * time.Millisecond)

	h, err := e.s.Health(e.ctx, time.Time{})
	require.NoError(t, err)
	snap := h.OldestSnapshot
	t.Logf("%+v", snap)
	// Another test's transaction in this database may be older still: the
	// oldest is reported, whichever it is.
	require.GreaterOrEqual(t, snap.Transactions, int64(3), "three transactions took an id since the snapshot")
	require.GreaterOrEqual(t, snap.Open, time.Second, "the test runs as a role that sees xact_start")
	if snap.Holder == fmt.Sprintf("pid %d (left-open, idle in transaction)", pid) {
		require.Less(t, snap.Open, time.Minute)
	}

	require.NoError(t, tx.Rollback(e.ctx))
	h, err = e.s.Health(e.ctx, time.Time{})
	require.NoError(t, err)
	ours := fmt.Sprintf("pid %d", pid)
	holder := h.OldestSnapshot.Holder
	require.False(t, holder == ours || strings.HasPrefix(holder, ours+" "), "the transaction ended, yet %q holds the oldest snapshot", holder)
}
