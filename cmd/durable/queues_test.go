package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/internal/enginetest"
	"github.com/godurable/godurable/store"
)

var resumeHint = regexp.MustCompile("resume it with `(durable [^`]*)`")

// TestCLIQueues pauses a queue with rows, finds it paused in queues ls and
// health with its waiting rows, and resumes it with the hint the pause
// printed, pasted as it is.
func TestCLIQueues(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := migrated(t)
	idle := newEngine(t, s.st) // not started: the rows wait
	for range 2 {
		_, err := idle.Insert(ctx, "sync", payment{Amount: 1}, durable.InsertOptions{Queue: "mail"})
		require.NoError(t, err)
	}

	out := s.ok(t, "queues", "ls")
	assert.Equal(t, []string{"mail", "active", "2"}, line(t, out, "mail")[:3])

	// The global flags before the command, as an operator types them.
	out, errOut, code := runBinary(t, nil, "-database-url", s.url, "-schema", s.schema, "queues", "pause", "mail")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `queue "mail" paused: engines start no step of it from their next claim`)
	m := resumeHint.FindStringSubmatch(out)
	require.NotNil(t, m, out)
	assert.Contains(t, m[1], "-schema "+s.schema)
	assert.Contains(t, m[1], "-database-url ")
	assert.Contains(t, s.ok(t, "queues", "pause", "mail"), `queue "mail" was paused already`)
	_, err := s.st.PauseQueue(ctx, "idle", true, time.Time{}) // a paused queue without rows is listed too
	require.NoError(t, err)

	out = s.ok(t, "queues", "ls")
	row := line(t, out, "mail")
	assert.Equal(t, []string{"mail", "paused"}, row[:2])
	assert.Equal(t, "2", row[len(row)-7], "its ready rows: %q", row)
	assert.Equal(t, "paused", line(t, out, "idle")[1])
	assert.Contains(t, out, "resume mail: durable queues resume mail -schema "+s.schema)
	var entries []queueEntry
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "queues", "ls", "-json")), &entries))
	require.Len(t, entries, 2)
	assert.Equal(t, "idle", entries[0].Queue)
	assert.True(t, entries[1].Paused)
	assert.Equal(t, int64(2), entries[1].Ready)

	out = s.ok(t, "health")
	_, section, found := strings.Cut(out, "PAUSED QUEUES")
	require.True(t, found, out)
	row = line(t, section, "mail")
	assert.Equal(t, "2", row[len(row)-5], "health's paused queue with its ready rows: %s", section)
	assert.Contains(t, section, "resume mail: durable queues resume mail -schema "+s.schema)
	var h healthReport
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "health", "-json")), &h))
	require.Len(t, h.PausedQueues, 2)
	assert.Equal(t, "mail", h.PausedQueues[1].Queue)
	assert.Equal(t, int64(2), h.PausedQueues[1].Ready)

	out, errOut, code = pasted(t, m[1])
	require.Equal(t, 0, code, "%s: %s", m[1], errOut)
	assert.Contains(t, out, `queue "mail" resumed`)
	assert.Equal(t, "active", line(t, s.ok(t, "queues", "ls"), "mail")[1])
	assert.Contains(t, s.ok(t, "queues", "resume", "mail"), `queue "mail" was not paused`)

	_, _, code = s.cli(t, "queues", "stop", "mail")
	assert.Equal(t, 2, code)
	_, _, code = s.cli(t, "queues", "pause")
	assert.Equal(t, 2, code)
}

// TestCLIPauseAcrossEngines: `durable queues pause mail` while three
// engines run: no step of mail starts after the pause commits plus one
// poll interval; after `durable queues resume mail` the backlog drains.
func TestCLIPauseAcrossEngines(t *testing.T) {
	t.Parallel()
	s := migrated(t)
	enginetest.PauseAcrossEngines(t, func() store.Store { return s.st }, func(t *testing.T, paused bool) {
		verb := "resume"
		if paused {
			verb = "pause"
		}
		s.ok(t, "queues", verb, "mail")
	})
}
