// Package keystest builds the store the views of rows of several keys are
// tested against (explain, the CLI, the UI): one fixture, so that each
// view's test reads the same rows.
package keystest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
)

// SeveralKeys is a memory store with a gate stripe of K = 1 and two rows
// of two keys each, claimed by worker "worker-1": Holder (account:1,
// stripe:t) executes; Blocked (account:2, stripe:t) waits for stripe:t,
// which Holder has, while its account:2 is free.
type SeveralKeys struct {
	Store           store.Store
	Holder, Blocked string
}

// New builds the fixture, failing t if any step of it does not go as
// described.
func New(t testing.TB) SeveralKeys {
	t.Helper()
	ctx := context.Background()
	st := memory.New(memory.Options{})
	_, err := st.SyncLimits(ctx, []gate.Limit{{Name: "stripe", Limit: 1, Shards: 1}})
	require.NoError(t, err)
	ni := func(account string) store.NewInstance {
		return store.NewInstance{ID: store.NewInstanceID(), Workflow: "charge", Version: 1, Queue: "default", Step: "start",
			State: json.RawMessage(`{}`), Key: account, KeyIntent: gate.IdentityIntent,
			Also: []store.KeyRef{{Key: "stripe:t", Intent: gate.GateIntent}}}
	}
	res, err := st.Insert(ctx, []store.NewInstance{ni("account:1"), ni("account:2")})
	require.NoError(t, err)
	cl, err := st.Claim(ctx, store.ClaimRequest{Queue: "default", Worker: "worker-1", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, cl.Claimed, 1, "stripe:t admits one")
	require.Equal(t, res[0].ID, cl.Claimed[0].ID)
	in, err := st.Get(ctx, res[1].ID)
	require.NoError(t, err)
	require.Equal(t, store.StatusBlocked, in.Status)
	require.Equal(t, "stripe:t", in.BlockedOn)
	return SeveralKeys{Store: st, Holder: res[0].ID, Blocked: res[1].ID}
}
