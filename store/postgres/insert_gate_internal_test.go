package postgres

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// gatedRow is a row of acct:<a> and gate key api:x, due now.
func gatedRow(acct string) store.NewInstance {
	return store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`),
		Key: acct, Also: []store.KeyRef{{Key: "api:x", Intent: gate.GateIntent}}}
}

// TestInsertAtAFullGateHoldsOffItsCredit: an insert that finds a gate full
// puts its row of several keys in the gate's line, blocked, holding the
// gate's counter FOR SHARE to its commit. The outcome of the gate's holder,
// committing meanwhile, waits for the insert before it credits the slot, so
// that its promotion sees the blocked row: no lost wakeup, and no heal.
func TestInsertAtAFullGateHoldsOffItsCredit(t *testing.T) {
	ctx := context.Background()
	s := storeWithLimits(t, gate.Limit{Name: "api", Limit: 1})
	_, err := s.Insert(ctx, []store.NewInstance{gatedRow("acct:0")})
	require.NoError(t, err)
	holder := claimExactly(t, s, 1)[0]

	p, err := prepareInsert([]store.NewInstance{gatedRow("acct:1")})
	require.NoError(t, err)
	p.block, p.atGates = true, true // as Insert plans it
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	var insertPID int32
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&insertPID))
	require.NoError(t, s.blockAtGates(ctx, tx, p))
	require.Equal(t, "api:x", p.rows[0].blockedIn, "the gate is full")
	require.NoError(t, s.runInsert(ctx, tx, p))
	id := p.rows[0].in.ID

	completed := make(chan error, 1)
	go func() {
		_, err := s.Complete(ctx, "w", []store.Outcome{{ID: holder.ID, Fence: holder.Fence, Kind: store.OutcomeDone}}, time.Time{})
		completed <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND $1::int = ANY (pg_blocking_pids(pid))`, insertPID).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond, "the outcome never waited for the insert's lock on the counter")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-completed)

	require.Equal(t, store.StatusReady, statusOf(t, s, id), "the freed slot's promotion saw the row the insert blocked")
	require.True(t, s.hot.has("api:x"), "a promotion of the gate's blocked rows marks it hot (the insert's own mark is afterInsert's, not run here)")
	got := claimExactly(t, s, 1)
	require.Equal(t, id, got[0].ID)
	require.Equal(t, "acct:1", got[0].Key, "it runs under its first key")
}

// TestInsertAtAGateWhoseCounterIsHeldGoesInReady: a counter another
// transaction holds (a credit in flight) may be freeing a slot the insert
// cannot see, so the insert does not wait for it and puts its row ready,
// for a claim to decide.
func TestInsertAtAGateWhoseCounterIsHeldGoesInReady(t *testing.T) {
	ctx := context.Background()
	s := storeWithLimits(t, gate.Limit{Name: "api", Limit: 1})
	_, err := s.Insert(ctx, []store.NewInstance{gatedRow("acct:0")})
	require.NoError(t, err)
	claimExactly(t, s, 1)

	held, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer held.Rollback(ctx) //nolint:errcheck
	_, err = held.Exec(ctx, s.q(`SELECT 1 FROM {schema}.key_slots WHERE key = 'api:x' FOR UPDATE`))
	require.NoError(t, err)

	row := gatedRow("acct:1")
	insertCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = s.Insert(insertCtx, []store.NewInstance{row})
	require.NoError(t, err, "the insert does not wait for the held counter")
	require.Equal(t, store.StatusReady, statusOf(t, s, row.ID))
	require.NoError(t, held.Rollback(ctx))
	in, err := s.Get(ctx, row.ID)
	require.NoError(t, err)
	require.Empty(t, in.BlockedOn)

	// With the counter free again, the next insert sees the gate full.
	row2 := gatedRow("acct:2")
	_, err = s.Insert(ctx, []store.NewInstance{row2})
	require.NoError(t, err)
	require.Equal(t, store.StatusBlocked, statusOf(t, s, row2.ID))
}
