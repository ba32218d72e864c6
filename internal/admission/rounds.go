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

// Fresh is where a group's rows made ready together start: at round
// Round, of which Taken turns are already taken, Turns turns a round.
type Fresh struct {
	Round        int64
	Taken, Turns int
}

// KeyFresh is a key's Fresh in a queue and priority, from what a store
// reads there before making any row ready: head, the queue's current round
// (the lowest round among its due ready rows of that priority, 0 when none);
// last, the key's highest round among its due ready and blocked rows, and
// taken, how many of those rows have round last (ok false: the key has
// none); and turns, the key's limit (1 for a K = 1 key).
//
// A key takes as many turns a round as it may run rows at once, so that a
// gate of K keeps K rows in each round: behind a backlog of many keys, one
// turn a round would let it run one row a round whatever its K. The key's
// next rows fill its last round when that round is not behind the head and
// has turns left; otherwise they start a round later, or at the head.
func KeyFresh(head, last int64, ok bool, taken, turns int) Fresh {
	turns = max(turns, 1)
	if !ok || last < head {
		return Fresh{Round: head, Turns: turns}
	}
	return Fresh{Round: last, Taken: min(taken, turns), Turns: turns}
}

// Nth is the round of the n-th (from 0) of a key's rows made ready
// together.
func (f Fresh) Nth(n int) int64 {
	return f.Round + int64((f.Taken+n)/max(f.Turns, 1))
}

// Rounds returns the round of each row of rows, which are made ready
// together. base returns a group's Fresh as read before any of rows is
// made ready: for the rows without a key, the group's current round (the
// lowest round among the queue's due ready rows of that priority, 0 when
// none) with nothing taken; for a key's rows, KeyFresh. base is called
// once per group of rows.
//
// A row without a key takes its group's current round, so it is claimed
// with the queue's current round. A key's rows take their turns from its
// Fresh, in At then Seq order, Turns rows a round, so that a key with many
// rows waiting takes its turns in each round beside other keys rather than
// running ahead of them.
func Rounds(rows []RoundRow, base func(RoundGroup) Fresh) []int64 {
	out := make([]int64, len(rows))
	order := make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(rows[a].At.Compare(rows[b].At), cmp.Compare(rows[a].Seq, rows[b].Seq))
	})
	type group struct {
		fresh Fresh
		n     int
	}
	groups := make(map[RoundGroup]*group)
	for _, i := range order {
		g := rows[i].RoundGroup
		gr := groups[g]
		if gr == nil {
			gr = &group{fresh: base(g)}
			groups[g] = gr
		}
		if g.Key == "" {
			out[i] = gr.fresh.Round
			continue
		}
		out[i] = gr.fresh.Nth(gr.n)
		gr.n++
	}
	return out
}
