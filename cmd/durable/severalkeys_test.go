package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
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

// severalKeysStore is keystest's store of two rows of two keys, holder
// (account:1, stripe:t) executing and blocked (account:2, stripe:t) waiting
// for stripe:t, and one row of one key, account:7, ready.
func severalKeysStore(t *testing.T) (st store.Store, holder, blocked, single string) {
	t.Helper()
	f := keystest.New(t)
	one, err := f.Store.Insert(context.Background(), []store.NewInstance{{ID: store.NewInstanceID(), Workflow: "charge",
		Version: 1, Queue: "default", Step: "start", State: json.RawMessage(`{}`), Key: "account:7", KeyIntent: gate.IdentityIntent}})
	require.NoError(t, err)
	return f.Store, f.Holder, f.Blocked, one[0].ID
}

// TestExplainSeveralKeys prints the explanation of keys of rows of
// several keys: a holder's other keys, a waiter's other keys and the key
// it is blocked on, and the rows of a key that wait for another key.
func TestExplainSeveralKeys(t *testing.T) {
	ctx := context.Background()
	st, holder, blocked, _ := severalKeysStore(t)
	now := time.Now().UTC()
	explainText := func(key string) string {
		x, err := explain.Key(ctx, st, key, now)
		require.NoError(t, err)
		var b bytes.Buffer
		printExplanation(&b, x)
		t.Log("\n" + b.String())
		return b.String()
	}

	out := explainText("stripe:t")
	assert.Equal(t, []string{"INSTANCE", "WORKFLOW", "STEP", "ATTEMPT", "WORKER", "SINCE", "LEASE", "EXPIRES", "ALSO", "HOLDS"},
		line(t, out, "INSTANCE"))
	h := line(t, out, holder)
	assert.Equal(t, "account:1", h[len(h)-1], "the holder's other key")
	assert.Contains(t, out, "waiting: 1 (1 blocked)\n")
	assert.Regexp(t, `next in line: `+blocked+` charge/start, blocked, priority 0, queue default, also needs account:2, blocked on stripe:t\n`, out)
	assert.Contains(t, out, "blocking now: concurrency")

	out = explainText("account:2")
	assert.Contains(t, out, "holders: none")
	assert.Contains(t, out, "waiting: 0 (0 blocked); 1 more that also need account:2 wait for another of their keys\n")
	assert.Contains(t, out, "  elsewhere:    blocked on stripe:t (1)\n")
	assert.Contains(t, out, "blocking now: none\nnothing holds account:2 and no row waits in its own line; 1 row(s) that also need account:2")

	out = explainText("account:1")
	assert.Equal(t, "stripe:t", line(t, out, holder)[len(line(t, out, holder))-1])
}

// TestHealthSeveralKeys: health lists the blocked rows by the name of the
// key that blocked them.
func TestHealthSeveralKeys(t *testing.T) {
	st, _, _, _ := severalKeysStore(t)
	h, err := st.Health(context.Background(), time.Time{})
	require.NoError(t, err)
	var b bytes.Buffer
	printHealth(&b, h)
	out := b.String()
	t.Log("\n" + out)
	assert.Regexp(t, `\nBLOCKED ON KEY NAME +ROWS\nstripe +1\n`, out, "the row of two keys waits for stripe:t")
}

// TestExplainOneKeyUnchanged: a key whose rows have one key prints no
// column or clause of other keys.
func TestExplainOneKeyUnchanged(t *testing.T) {
	ctx := context.Background()
	st := memory.New(memory.Options{})
	for range 2 {
		_, err := st.Insert(ctx, []store.NewInstance{{ID: store.NewInstanceID(), Workflow: "w", Version: 1, Queue: "default",
			Step: "s", State: json.RawMessage(`{}`), Key: "account:7"}})
		require.NoError(t, err)
	}
	_, err := st.Claim(ctx, store.ClaimRequest{Queue: "default", Worker: "worker-a", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	x, err := explain.Key(ctx, st, "account:7", time.Now().UTC())
	require.NoError(t, err)
	var b bytes.Buffer
	printExplanation(&b, x)
	out := b.String()
	assert.Equal(t, []string{"INSTANCE", "WORKFLOW", "STEP", "ATTEMPT", "WORKER", "SINCE", "LEASE", "EXPIRES"}, line(t, out, "INSTANCE"))
	assert.Contains(t, out, "waiting: 1 (1 blocked)\n")
	assert.NotContains(t, out, "also needs")
	assert.NotContains(t, out, "elsewhere")
	assert.NotContains(t, out, "another of their keys")
}

// TestListAndShowSeveralKeys: ls lists every key of a row and, for a page
// with a blocked row of several keys, the key it is blocked on; show
// prints every key, the shards an executing row holds and the key a
// blocked row waits for; their JSON carries keys and blocked_on.
func TestListAndShowSeveralKeys(t *testing.T) {
	ctx := context.Background()
	st, holder, blocked, single := severalKeysStore(t)
	now := time.Now()
	ins, err := st.List(ctx, store.ListFilter{Newest: true})
	require.NoError(t, err)
	var b bytes.Buffer
	printList(&b, ins, now)
	out := b.String()
	t.Log("\n" + out)
	assert.Equal(t, []string{"ID", "STATUS", "WORKFLOW", "STEP", "ATTEMPT", "QUEUE", "KEY", "UPDATED", "BLOCKED", "ON"}, line(t, out, "ID"))
	assert.Equal(t, []string{blocked, "blocked", "charge", "start", "0", "default", "account:2,stripe:t"}, line(t, out, blocked)[:7])
	assert.Equal(t, "stripe:t", line(t, out, blocked)[len(line(t, out, blocked))-1])
	assert.Equal(t, []string{holder, "executing", "charge", "start", "0", "default", "account:1,stripe:t"}, line(t, out, holder)[:7])
	assert.Equal(t, "-", line(t, out, holder)[len(line(t, out, holder))-1])
	assert.Equal(t, "account:7", line(t, out, single)[6])

	// A page of rows of one key has no BLOCKED ON column.
	b.Reset()
	printList(&b, ins[:1], now)
	require.Equal(t, single, ins[0].ID)
	assert.Equal(t, []string{"ID", "STATUS", "WORKFLOW", "STEP", "ATTEMPT", "QUEUE", "KEY", "UPDATED"}, line(t, b.String(), "ID"))

	showText := func(id string) string {
		in, err := st.Get(ctx, id)
		require.NoError(t, err)
		var b bytes.Buffer
		printInstance(&b, in, nil, now)
		t.Log("\n" + b.String())
		return b.String()
	}
	out = showText(blocked)
	assert.Regexp(t, `^keys\s+account:2 \(identity\), stripe:t \(gate\)$`, strings.TrimSpace(lineText(t, out, "keys")))
	assert.Equal(t, []string{"blocked", "on", "stripe:t:"}, line(t, out, "blocked on")[:3])
	out = showText(holder)
	assert.Regexp(t, `keys\s+account:1 \(identity(, shard -?\d+)?\), stripe:t \(gate, shard 0\)\n`, out)
	assert.NotContains(t, out, "blocked on")
	out = showText(single)
	assert.Equal(t, []string{"key", "account:7", "(identity)"}, line(t, out, "key"))
	assert.NotContains(t, out, "keys")

	for id, want := range map[string]instanceView{
		blocked: {Keys: []string{"account:2", "stripe:t"}, BlockedOn: "stripe:t"},
		holder:  {Keys: []string{"account:1", "stripe:t"}},
		single:  {Keys: []string{"account:7"}},
	} {
		in, err := st.Get(ctx, id)
		require.NoError(t, err)
		v := viewOf(in)
		assert.Equal(t, want.Keys, v.Keys)
		assert.Equal(t, want.BlockedOn, v.BlockedOn)
	}
	js, err := json.Marshal(viewOf(store.Instance{}))
	require.NoError(t, err)
	assert.Contains(t, string(js), `"keys":[]`, "a row without a key has no keys, not null")
}

// lineText is the output line starting with prefix (after spaces).
func lineText(t *testing.T, out, prefix string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), prefix) {
			return l
		}
	}
	t.Fatalf("no line starting with %q in:\n%s", prefix, out)
	return ""
}

// TestShowHistoryKeys prints each step of `durable show`'s history with
// every key it ran under, its first key first, and "-" for a step that ran
// under none.
func TestShowHistoryKeys(t *testing.T) {
	now := time.Now().UTC()
	in := store.Instance{ID: store.NewInstanceID(), Workflow: "charge", Status: store.StatusDone, Step: "charge",
		Key: "account:1", KeyIntent: gate.IdentityIntent, KeyShard: -1, CreatedAt: now, UpdatedAt: now}
	hist := []store.HistoryEntry{
		{Step: "load", Outcome: "next", StartedAt: now, FinishedAt: now},
		{Step: "charge", Key: "account:1", Also: []string{"stripe:t"}, Outcome: "done", StartedAt: now, FinishedAt: now},
	}
	var b bytes.Buffer
	printInstance(&b, in, hist, now)
	out := b.String()
	assert.Equal(t, []string{"STEP", "ATTEMPT", "KEYS", "OUTCOME"}, line(t, out, "STEP")[:4])
	assert.Equal(t, []string{"load", "0", "-", "next"}, line(t, out, "load")[:4])
	assert.Equal(t, []string{"charge", "0", "account:1,stripe:t", "done"}, line(t, out, "charge")[:4])
}
