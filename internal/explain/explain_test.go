package explain_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/explain"
	"github.com/godurable/godurable/internal/keystest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
)

// TestKeySeveralKeys: the key a row of several keys is blocked on lists
// it with its other keys and the key it waits for; its holder shows its
// other keys; a key whose row waits elsewhere says so, and on which key.
func TestKeySeveralKeys(t *testing.T) {
	ctx := context.Background()
	f := keystest.New(t)
	now := time.Now()

	x, err := explain.Key(ctx, f.Store, "stripe:t", now)
	require.NoError(t, err)
	require.Len(t, x.Holders, 1)
	assert.Equal(t, f.Holder, x.Holders[0].ID)
	assert.Equal(t, []string{"account:1"}, x.Holders[0].OtherKeys)
	assert.Equal(t, 1, x.Waiting.Count)
	assert.Equal(t, 1, x.Waiting.Blocked)
	assert.Zero(t, x.Waiting.Elsewhere)
	require.NotNil(t, x.Waiting.Next)
	assert.Equal(t, f.Blocked, x.Waiting.Next.ID)
	assert.Equal(t, []string{"account:2"}, x.Waiting.Next.OtherKeys)
	assert.Equal(t, "stripe:t", x.Waiting.Next.BlockedOn)
	assert.Equal(t, "concurrency", x.Blocking)
	assert.NotContains(t, x.Verdict, "another of their keys")

	// account:2 is free: its one row waits in stripe:t's line.
	x, err = explain.Key(ctx, f.Store, "account:2", now)
	require.NoError(t, err)
	assert.Empty(t, x.Holders)
	assert.Zero(t, x.Waiting.Count)
	assert.Equal(t, 1, x.Waiting.Elsewhere)
	assert.Equal(t, []explain.KeyCount{{Key: "stripe:t", Count: 1}}, x.Waiting.ElsewhereOn)
	assert.Empty(t, x.Blocking)
	assert.Equal(t, "nothing holds account:2 and no row waits in its own line; 1 row(s) that also need account:2 "+
		"wait for another of their keys (blocked on stripe:t (1)); they run once each of their keys has room", x.Verdict)

	// account:1 is held by the row of two keys, and nothing else waits.
	x, err = explain.Key(ctx, f.Store, "account:1", now)
	require.NoError(t, err)
	require.Len(t, x.Holders, 1)
	assert.Equal(t, []string{"stripe:t"}, x.Holders[0].OtherKeys)
	assert.Equal(t, "not blocked: nothing waits for account:1", x.Verdict)
	assert.Equal(t, 1, x.Limits[0].InUse, "the row of two keys holds account:1's one slot")
}

// TestKeyOneKeyUnchanged: rows of one key carry no other keys and no
// blocked-on, and the verdict says nothing of other keys.
func TestKeyOneKeyUnchanged(t *testing.T) {
	ctx := context.Background()
	st := memory.New(memory.Options{})
	var nis []store.NewInstance
	for range 2 {
		nis = append(nis, store.NewInstance{ID: store.NewInstanceID(), Workflow: "w", Version: 1, Queue: "default",
			Step: "s", State: json.RawMessage(`{}`), Key: "account:7", KeyIntent: gate.IdentityIntent})
	}
	_, err := st.Insert(ctx, nis)
	require.NoError(t, err)
	_, err = st.Claim(ctx, store.ClaimRequest{Queue: "default", Worker: "w1", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	x, err := explain.Key(ctx, st, "account:7", time.Now())
	require.NoError(t, err)
	require.Len(t, x.Holders, 1)
	assert.Nil(t, x.Holders[0].OtherKeys)
	require.NotNil(t, x.Waiting.Next)
	assert.Nil(t, x.Waiting.Next.OtherKeys)
	assert.Empty(t, x.Waiting.Next.BlockedOn)
	assert.Zero(t, x.Waiting.Elsewhere)
	assert.Nil(t, x.Waiting.ElsewhereOn)
	b, err := json.Marshal(x)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "other_keys")
	assert.NotContains(t, string(b), "blocked_on")
	assert.Contains(t, x.Verdict, "blocked by its concurrency limit: all 1 slot(s) of account:7 are held")
}

func TestKeys(t *testing.T) {
	in := store.Instance{Key: "a:1", Also: []store.KeyRef{{Key: "b:1"}, {Key: "c:1"}}}
	assert.Equal(t, []string{"a:1", "b:1", "c:1"}, in.KeyList())
	assert.Equal(t, []string{"a:1", "c:1"}, explain.OtherKeys(in, "b:1"))
	assert.Nil(t, store.Instance{}.KeyList())
	assert.Nil(t, explain.OtherKeys(store.Instance{Key: "a:1"}, "a:1"))
}
