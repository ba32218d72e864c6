package postgres_test

import (
	"strings"
	"testing"

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
