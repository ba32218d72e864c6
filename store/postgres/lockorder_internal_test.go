package postgres

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// TestSuccessorsBefore pins when a flush locks its whole set in one id
// order first: only when a successor sorts before an outcome row.
func TestSuccessorsBefore(t *testing.T) {
	const (
		a = "01a23660-0000-7000-8000-000000000001"
		b = "01a23660-0000-7000-8000-000000000002"
		c = "01a23660-0000-7000-8000-000000000003"
	)
	outs := func(ids ...string) []store.Outcome {
		var o []store.Outcome
		for _, id := range ids {
			o = append(o, store.Outcome{ID: id})
		}
		return o
	}
	require.False(t, successorsBefore(outs(a, b), nil), "no successors")
	require.False(t, successorsBefore(outs(a, b), []string{c}), "every successor after every outcome row")
	require.True(t, successorsBefore(outs(a, c), []string{b}), "a successor between two outcome rows")
	require.True(t, successorsBefore(outs(b), []string{a}), "a successor older than its predecessor")
	require.True(t, successorsBefore(outs(a), []string{"not-a-uuid"}), "an id it cannot read: lock to be safe")
}
