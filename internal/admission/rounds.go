package admission

import (
	"cmp"
	"slices"
	"time"
)

// This file is the round rule: the fairness order in which rows made ready
// are claimed (see store.Store, Order). Rounds gives rows their rounds from
// their groups' fresh rounds, which a store reads before making any of them
// ready. The memory store calls it for every row it makes ready without a
// round; PostgreSQL's COPY insert path calls it, and its statement insert
// (sqlInsert) is the rule's SQL form, pinned equal to the COPY path by
// TestInsertCopyMatchesStatement.

// RoundGroup is the rows that share a fresh round: one queue and priority,
// and one key ("" for the rows without a key).
type RoundGroup struct {
	Queue    string
	Priority int
	Key      string
}

// RoundRow is a row about to be made ready that has no round yet.
type RoundRow struct {
	RoundGroup
	// At is the row's run_at: a key's rows take their rounds in At order.
	At time.Time
	// Seq orders rows of equal At: their insertion order.
	Seq int64
}

// Rounds returns the round of each row of rows, which are made ready
// together. base returns a group's fresh round as read before any of rows
// is made ready: for the rows without a key, the group's current round
// (the lowest round among the queue's due ready rows of that priority, 0
// when none); for a key's rows, the greater of that and one past the
// highest round of the key's due ready and blocked rows there. base is
// called once per group of rows.
//
// A row without a key takes its group's fresh round, so it is claimed
// with the queue's current round. A key's rows take consecutive rounds from
// its group's fresh round, in At then Seq order, so that a key with many
// rows waiting takes one turn per round beside other keys rather than
// running ahead of them.
func Rounds(rows []RoundRow, base func(RoundGroup) int64) []int64 {
	out := make([]int64, len(rows))
	order := make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(rows[a].At.Compare(rows[b].At), cmp.Compare(rows[a].Seq, rows[b].Seq))
	})
	next := make(map[RoundGroup]int64)
	for _, i := range order {
		g := rows[i].RoundGroup
		n, ok := next[g]
		if !ok {
			n = base(g)
		}
		out[i] = n
		if g.Key != "" {
			n++
		}
		next[g] = n
	}
	return out
}
