package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/godurable/godurable/store"
)

// TestHealthPrintsTheOldestSnapshot: health names the oldest snapshot kept
// alive, and says what it does to claims once it is old.
func TestHealthPrintsTheOldestSnapshot(t *testing.T) {
	out := func(s store.SnapshotHealth) string {
		var b bytes.Buffer
		printSnapshot(&b, s)
		return b.String()
	}
	assert.Empty(t, out(store.SnapshotHealth{}), "nothing keeps a snapshot: no line")

	young := out(store.SnapshotHealth{Holder: "pid 7 (engine, active)", Open: 3 * time.Millisecond, Transactions: 2})
	assert.Equal(t, "\noldest snapshot: pid 7 (engine, active), open 3ms, 2 transactions ago\n", young)

	old := out(store.SnapshotHealth{Holder: "pid 9 (psql, idle in transaction)", Open: 5 * time.Minute, Transactions: 40})
	assert.Contains(t, old, "oldest snapshot: pid 9 (psql, idle in transaction), open 5m0s, 40 transactions ago\n")
	assert.Contains(t, old, "claims read past the rows changed since it was taken")

	slot := out(store.SnapshotHealth{Holder: "replication slot standby1", Transactions: 250_000})
	assert.Contains(t, slot, "oldest snapshot: replication slot standby1, open for an unknown time, 250000 transactions ago\n")
	assert.Contains(t, slot, "claims read past", "many transactions back, its age unknown: the note too")
	assert.NotContains(t, out(store.SnapshotHealth{Holder: "pid 3", Transactions: 10}), "claims read past")
}
