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

// Rounds come in two kinds, told apart by their parity. An odd round is an
// open round: rows of no waiting line take it, that is rows without a key
// and the first rows of a key with none of its rows waiting. An even round
// is a turn round: a key's further rows take their turns in those. A
// queue's open round (Open) is never behind its current round, and comes
// before the turn round the queue is at, so that a new row of a key
// without a backlog, or without a key, never waits behind the turns of the
// keys that have one, however many they are: behind 20,000 backlogged keys
// a turn round holds 20,000 rows. The keys with a backlog share what is
// left, a turn each a round. Rows of no waiting line arriving faster than
// the queue runs them therefore delay the turn rounds for as long as that
// lasts, as a queue would without keys.

// Open is the open round of a queue whose current round is head (the
// lowest round among its due ready rows of a priority, 0 when none): head
// itself when it is an open round, or else the open round just before it.
func Open(head int64) int64 {
	return (head - 1) | 1
}

// Fresh is where a group's rows made ready together start: at round
// Round, of which Taken turns are already taken, Turns turns a round.
type Fresh struct {
	Round        int64
	Taken, Turns int
}

// KeylessFresh is the Fresh of the rows without a key of a queue and
// priority whose current round is head: its open round.
func KeylessFresh(head int64) Fresh {
	return Fresh{Round: Open(head), Turns: 1}
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
// turn a round would let it run one row a round whatever its K. A key with
// no row waiting (none, or all behind the open round) starts in the open
// round. Otherwise its next rows fill its last round while that round has
// turns left, and then take the turn rounds after it.
func KeyFresh(head, last int64, ok bool, taken, turns int) Fresh {
	turns = max(turns, 1)
	open := Open(head)
	if !ok || last < open {
		return Fresh{Round: open, Turns: turns}
	}
	return Fresh{Round: last, Taken: min(taken, turns), Turns: turns}
}

// Nth is the round of the n-th (from 0) of a key's rows made ready
// together: f.Round while it has turns left, then a turn round for every
// Turns rows, the first one after f.Round.
func (f Fresh) Nth(n int) int64 {
	return TurnRound(f.Round, int64((f.Taken+n)/max(f.Turns, 1)))
}

// TurnRound is the k-th round from round r in which a key's rows take
// their turns: r itself for k = 0, otherwise the k-th turn round after r.
// In SQL: greatest(r, r - (r & 1) + 2 * k).
func TurnRound(r, k int64) int64 {
	return max(r, r-(r&1)+2*k)
}

// Rounds returns the round of each row of rows, which are made ready
// together. base returns a group's Fresh as read before any of rows is
// made ready: for the rows without a key, KeylessFresh; for a key's rows,
// KeyFresh. base is called once per group of rows.
//
// A row without a key takes its group's open round, so it is claimed
// ahead of the turns of the keys with a backlog. A key's rows take their
// turns from its Fresh, in At then Seq order, Turns rows a round, so that
// a key with many rows waiting takes its turns in each round beside other
// keys rather than running ahead of them.
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
