package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// TestCancelRacesTheEndOfAClaim cancels rows whose claim ends while Cancel
// waits for the row's lock: a cancel that read the row executing and then
// wrote that status back over the row the outcome had made ready (no worker,
// no lease) broke instances_claim_check, and the cancel was lost. Each case
// holds the row's lock in a transaction that ends its claim the way an
// outcome does, starts Cancel, and commits: Cancel must then cancel the row
// it finds.
func TestCancelRacesTheEndOfAClaim(t *testing.T) {
	e := newEnv(t)
	for _, end := range []struct {
		name, sql string
	}{
		{"next step", `UPDATE %s.instances SET status = 'ready', worker = NULL, lease_expires_at = NULL, started_at = NULL, key_shard = NULL WHERE id = $1`},
		{"done", `UPDATE %s.instances SET status = 'done', worker = NULL, lease_expires_at = NULL, started_at = NULL, key_shard = NULL WHERE id = $1`},
	} {
		id := e.insert(newInstance("race:" + end.name))[0]
		cs := e.claim("w", 1)
		require.Len(t, cs, 1)
		require.Equal(t, id, cs[0].ID)

		tx, err := e.pool.Begin(e.ctx)
		require.NoError(t, err)
		_, err = tx.Exec(e.ctx, fmt.Sprintf(end.sql, pgx.Identifier{e.schema}.Sanitize()), id)
		require.NoError(t, err)
		errc := make(chan error, 1)
		go func() { errc <- e.s.Cancel(e.ctx, id, time.Time{}) }()
		time.Sleep(100 * time.Millisecond) // Cancel now waits for the row's lock
		require.NoError(t, tx.Commit(e.ctx))
		err = <-errc
		if end.name == "done" {
			require.ErrorIs(t, err, store.ErrTerminal, end.name)
			require.Equal(t, store.StatusDone, e.get(id).Status)
			continue
		}
		require.NoError(t, err, "%s: a cancel never fails for a constraint", end.name)
		require.Equal(t, store.StatusCanceled, e.get(id).Status, end.name)
	}
}
