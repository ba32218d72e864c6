package postgres

import (
	"testing"

	"github.com/godurable/godurable/internal/admission"
	"github.com/stretchr/testify/require"
)

// TestWindowFollowsWhatTheLastClaimPassedOver pins the keyed window of a
// claim (windows): twice the limit for a queue's first claim, then the
// limit plus the keyed rows the last claim could not admit, within
// [minWindow, max(limit, maxWindow)].
func TestWindowFollowsWhatTheLastClaimPassedOver(t *testing.T) {
	var w windows
	cand := func(id, key string) admission.Candidate { return admission.Candidate{ID: id, Key: key} }
	adm := func(ids ...string) []admission.Admitted {
		var out []admission.Admitted
		for _, id := range ids {
			out = append(out, admission.Admitted{ID: id, Shard: -1})
		}
		return out
	}
	require.Equal(t, 200, w.size("q", 100), "first claim: twice the limit")
	require.Equal(t, minWindow, w.size("q", 4), "never below minWindow")
	require.Equal(t, maxWindow, w.size("q", 800), "never above max(limit, maxWindow)")
	require.Equal(t, 1500, w.size("q", 1500), "a limit above maxWindow is the window")

	// A full claim (limit 2) that passed over one keyed row before its last
	// admitted row, and one after it: only the one before counts.
	w.record("q", 2, []admission.Candidate{cand("a", "k:1"), cand("b", "k:2"), cand("c", ""), cand("d", "k:3")}, adm("a", "c"))
	require.Equal(t, minWindow, w.size("q", 2))
	require.Equal(t, 101, w.size("q", 100))
	// A claim that admitted fewer than its limit: every keyed row it did not
	// admit counts; keyless rows never do.
	w.record("q", 10, []admission.Candidate{cand("a", "k:1"), cand("b", ""), cand("c", "k:2"), cand("d", "k:3")}, adm("a", "b"))
	require.Equal(t, 102, w.size("q", 100))
	// At most the limit again.
	many := make([]admission.Candidate, 300)
	for i := range many {
		many[i] = cand(string(rune('A'+i%26))+string(rune('a'+i/26)), "k:1")
	}
	w.record("q", 100, many, nil)
	require.Equal(t, 200, w.size("q", 100))
	// Queues are apart.
	require.Equal(t, 200, w.size("other", 100))
}
