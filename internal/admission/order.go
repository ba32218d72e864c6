package admission

import (
	"cmp"
	"math"
)

// This file is the order rule every way a slot moves follows: a claim takes
// ready rows in (priority, round, run_at, insertion) order (see
// store.Store, Order), and a freed slot that goes straight to a waiting row
// of its key (a hand-off) or is promised to one ahead (a successor
// reservation) may go to that row only when no ready row of the row's
// queue that a claim would take first is waiting for the executor the slot
// comes with. Free applies it through Waiting.InTurn; Decide applies it to
// the claim's own window, which is in claim order.

// Turn is a row's place in its queue's claim order as far as turns go:
// its priority (lower first), then its round. A row without a round (one
// that was never made ready by the round rule) has NoRound.
type Turn struct {
	Priority int
	Round    int64
}

// NoRound is the round of a row that has none: it comes first within its
// priority.
const NoRound = math.MinInt64

// Compare orders turns as claims take them: -1 when t comes first.
func (t Turn) Compare(u Turn) int {
	return cmp.Or(cmp.Compare(t.Priority, u.Priority), cmp.Compare(t.Round, u.Round))
}

// InTurn reports whether a waiting row at turn t may take a freed slot of
// its key ahead of the ready rows of its queue, of which head is the first
// in claim order among those without a key or of another key, of the
// workflows the worker that would take the slot runs: the row its own
// claim would take first (nil: there are none). A row of the key with a better priority or an earlier round
// than t is the key's own line, which the store reads in that order, so
// only other rows compete. A tie is in turn: rows of one round take it in
// run_at order, which a store that reads only (priority, round) cannot
// tell apart, and a tie costs the other row at most the one step.
func InTurn(t Turn, head *Turn) bool {
	return head == nil || head.Compare(t) >= 0
}
