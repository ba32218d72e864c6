package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
)

// TestCLISchedules lists a schedule a worker synced, pauses and resumes it,
// and finds it in health.
func TestCLISchedules(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := migrated(t)
	st := s.st

	out := s.ok(t, "schedules", "ls")
	assert.Contains(t, out, "no schedules")

	e, err := durable.New(durable.Config{Store: st, Namespace: "reports", Logger: slog.New(slog.DiscardHandler),
		Schedules: []durable.Schedule{{Name: "nightly", Workflow: "sync", Cron: "30 2 * * *", TimeZone: "Europe/Paris",
			Overlap: durable.OverlapSkip, Keys: []gate.ConcurrencyKey{gate.Identity("tenant", "acme"), gate.Identity("region", "eu")}}}})
	require.NoError(t, err)
	require.NoError(t, e.Register(workflows()...))
	_, err = e.SyncSchedules(ctx)
	require.NoError(t, err)

	out = s.ok(t, "schedules", "ls")
	row := line(t, out, "nightly")
	assert.Equal(t, []string{"nightly", "reports", "sync", "region:eu,tenant:acme", "30", "2", "*", "*", "*", "Europe/Paris", "active", "-"}, row[:12],
		"the KEYS column lists the schedule's keys, its first key first")
	assert.Contains(t, out, "skip/skip")
	var entries []map[string]any
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "schedules", "ls", "-json")), &entries))
	require.Len(t, entries, 1)
	assert.Equal(t, "nightly", entries[0]["name"])
	assert.NotNil(t, entries[0]["next_fire"])
	assert.Equal(t, false, entries[0]["late"])

	out = s.ok(t, "schedules", "pause", "nightly")
	assert.Contains(t, out, `schedule "nightly" paused`)
	assert.Equal(t, "paused", line(t, s.ok(t, "schedules", "ls"), "nightly")[10])
	_, err = e.SyncSchedules(ctx)
	require.NoError(t, err)
	assert.Equal(t, "paused", line(t, s.ok(t, "schedules", "ls"), "nightly")[10], "a worker's re-sync keeps the pause")

	var h healthReport
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "health", "-json")), &h))
	require.Len(t, h.Schedules, 1)
	assert.True(t, h.Schedules[0].Paused)
	assert.Contains(t, s.ok(t, "health"), "nightly")

	out = s.ok(t, "schedules", "resume", "nightly")
	assert.Contains(t, out, `schedule "nightly" resumed: next fire `)
	scs, err := st.ListSchedules(ctx)
	require.NoError(t, err)
	assert.False(t, scs[0].Paused)

	_, errOut, code := s.cli(t, "schedules", "pause", "weekly")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `no schedule "weekly": `+"`durable schedules ls -schema "+s.schema+"`", "the hint carries the user's -schema")
	_, _, code = s.cli(t, "schedules", "stop", "nightly")
	assert.Equal(t, 2, code)
}
