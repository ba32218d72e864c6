package admission

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRounds(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	row := func(queue string, prio int, key string, at time.Duration, seq int64) RoundRow {
		return RoundRow{RoundGroup: RoundGroup{Queue: queue, Priority: prio, Key: key}, At: t0.Add(at), Seq: seq}
	}
	one := func(r int64) Fresh { return Fresh{Round: r, Turns: 1} }
	bases := map[RoundGroup]Fresh{
		{Queue: "q", Key: ""}:                 one(5),
		{Queue: "q", Key: "a:1"}:              one(5),
		{Queue: "q", Key: "b:1"}:              one(9),
		{Queue: "q", Priority: 1}:             one(-1),
		{Queue: "r", Key: "a:1"}:              one(2),
		{Queue: "q", Priority: 1, Key: "a:1"}: one(3),
		{Queue: "q", Key: "g:1"}:              {Round: 7, Taken: 2, Turns: 3},
		{Queue: "q", Key: "g:2"}:              {Round: 4, Turns: 2},
	}
	for _, tc := range []struct {
		name string
		rows []RoundRow
		want []int64
	}{
		{name: "none", rows: nil, want: []int64{}},
		{name: "keyless rows all take the open round",
			rows: []RoundRow{row("q", 0, "", 0, 1), row("q", 0, "", time.Second, 2), row("q", 0, "", 0, 3)},
			want: []int64{5, 5, 5}},
		{name: "a key's rows take its fresh round, then a turn round each",
			rows: []RoundRow{row("q", 0, "a:1", 0, 1), row("q", 0, "a:1", 0, 2), row("q", 0, "a:1", 0, 3)},
			want: []int64{5, 6, 8}},
		{name: "a key's rows go in run_at order, then insertion order",
			rows: []RoundRow{row("q", 0, "a:1", 2*time.Second, 1), row("q", 0, "a:1", 0, 3), row("q", 0, "a:1", time.Second, 2),
				row("q", 0, "a:1", 0, 0)},
			want: []int64{10, 6, 8, 5}},
		{name: "the input order does not break ties, the sequence does",
			rows: []RoundRow{row("q", 0, "a:1", 0, 9), row("q", 0, "a:1", 0, 4)},
			want: []int64{6, 5}},
		{name: "keys, queues and priorities are separate groups",
			rows: []RoundRow{row("q", 0, "a:1", 0, 1), row("q", 0, "b:1", 0, 2), row("r", 0, "a:1", 0, 3),
				row("q", 1, "a:1", 0, 4), row("q", 0, "a:1", 0, 5), row("q", 0, "b:1", 0, 6), row("q", 1, "", 0, 7),
				row("q", 0, "", 0, 8)},
			want: []int64{5, 9, 2, 3, 6, 10, -1, 5}},
		{name: "a gate key takes its turns a round, after those taken",
			rows: []RoundRow{row("q", 0, "g:1", 0, 1), row("q", 0, "g:1", 0, 2), row("q", 0, "g:1", 0, 3),
				row("q", 0, "g:1", 0, 4), row("q", 0, "g:1", 0, 5), row("q", 0, "g:2", 0, 6), row("q", 0, "g:2", 0, 7),
				row("q", 0, "g:2", 0, 8)},
			want: []int64{7, 8, 8, 8, 10, 4, 4, 6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := map[RoundGroup]int{}
			got := Rounds(tc.rows, func(g RoundGroup) Fresh {
				calls[g]++
				b, ok := bases[g]
				require.True(t, ok, "no base for %+v", g)
				return b
			})
			require.Equal(t, tc.want, got)
			for g, n := range calls {
				require.Equal(t, 1, n, "base of %+v read %d times", g, n)
			}
		})
	}
}

func TestOpen(t *testing.T) {
	for head, want := range map[int64]int64{-3: -3, -2: -3, -1: -1, 0: -1, 1: 1, 2: 1, 5: 5, 6: 5} {
		require.Equal(t, want, Open(head), "head %d", head)
		require.Equal(t, want, Open(Open(head)), "an open round is its own open round (head %d)", head)
		require.Equal(t, KeylessFresh(head), Fresh{Round: want, Turns: 1})
	}
}

func TestKeyFresh(t *testing.T) {
	for _, tc := range []struct {
		name         string
		head, last   int64
		ok           bool
		taken, turns int
		want         Fresh
		firstFour    []int64
	}{
		{name: "a key with no row waiting starts in the open round, then takes turn rounds", head: 5, turns: 1,
			want: Fresh{Round: 5, Turns: 1}, firstFour: []int64{5, 6, 8, 10}},
		{name: "the open round of a queue at a turn round is the one before it", head: 6, turns: 1,
			want: Fresh{Round: 5, Turns: 1}, firstFour: []int64{5, 6, 8, 10}},
		{name: "a gate with no row waiting takes its first turns in the open round", head: 6, turns: 2,
			want: Fresh{Round: 5, Turns: 2}, firstFour: []int64{5, 5, 6, 6}},
		{name: "a K = 1 key goes to the turn round after its last", head: 5, last: 8, ok: true, taken: 1, turns: 1,
			want: Fresh{Round: 8, Taken: 1, Turns: 1}, firstFour: []int64{10, 12, 14, 16}},
		{name: "a key whose last round is the open round goes to the next turn round", head: 6, last: 5, ok: true, taken: 1, turns: 1,
			want: Fresh{Round: 5, Taken: 1, Turns: 1}, firstFour: []int64{6, 8, 10, 12}},
		{name: "a key whose rows are all behind the open round starts in it", head: 6, last: 4, ok: true, taken: 3, turns: 3,
			want: Fresh{Round: 5, Turns: 3}, firstFour: []int64{5, 5, 5, 6}},
		{name: "a gate fills its last round's turns", head: 5, last: 6, ok: true, taken: 1, turns: 3,
			want: Fresh{Round: 6, Taken: 1, Turns: 3}, firstFour: []int64{6, 6, 8, 8}},
		{name: "a gate whose last round is full starts the next", head: 5, last: 6, ok: true, taken: 3, turns: 3,
			want: Fresh{Round: 6, Taken: 3, Turns: 3}, firstFour: []int64{8, 8, 8, 10}},
		{name: "more taken than turns (a lowered limit) counts as full", head: 5, last: 6, ok: true, taken: 9, turns: 2,
			want: Fresh{Round: 6, Taken: 2, Turns: 2}, firstFour: []int64{8, 8, 10, 10}},
		{name: "an odd last round of a turn (rows of before the open rounds) goes on in turn rounds", head: 2, last: 7, ok: true, taken: 1, turns: 1,
			want: Fresh{Round: 7, Taken: 1, Turns: 1}, firstFour: []int64{8, 10, 12, 14}},
		{name: "no limit reads as one turn", head: 0, turns: 0,
			want: Fresh{Round: -1, Turns: 1}, firstFour: []int64{-1, 0, 2, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := KeyFresh(tc.head, tc.last, tc.ok, tc.taken, tc.turns)
			require.Equal(t, tc.want, f)
			var got []int64
			for n := range 4 {
				got = append(got, f.Nth(n))
			}
			require.Equal(t, tc.firstFour, got)
		})
	}
}
