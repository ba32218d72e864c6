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
		{Queue: "q", Priority: 1}:             one(0),
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
		{name: "keyless rows all take the current round",
			rows: []RoundRow{row("q", 0, "", 0, 1), row("q", 0, "", time.Second, 2), row("q", 0, "", 0, 3)},
			want: []int64{5, 5, 5}},
		{name: "a key's rows take consecutive rounds from its fresh round",
			rows: []RoundRow{row("q", 0, "a:1", 0, 1), row("q", 0, "a:1", 0, 2), row("q", 0, "a:1", 0, 3)},
			want: []int64{5, 6, 7}},
		{name: "a key's rows go in run_at order, then insertion order",
			rows: []RoundRow{row("q", 0, "a:1", 2*time.Second, 1), row("q", 0, "a:1", 0, 3), row("q", 0, "a:1", time.Second, 2),
				row("q", 0, "a:1", 0, 0)},
			want: []int64{8, 6, 7, 5}},
		{name: "the input order does not break ties, the sequence does",
			rows: []RoundRow{row("q", 0, "a:1", 0, 9), row("q", 0, "a:1", 0, 4)},
			want: []int64{6, 5}},
		{name: "keys, queues and priorities are separate groups",
			rows: []RoundRow{row("q", 0, "a:1", 0, 1), row("q", 0, "b:1", 0, 2), row("r", 0, "a:1", 0, 3),
				row("q", 1, "a:1", 0, 4), row("q", 0, "a:1", 0, 5), row("q", 0, "b:1", 0, 6), row("q", 1, "", 0, 7),
				row("q", 0, "", 0, 8)},
			want: []int64{5, 9, 2, 3, 6, 10, 0, 5}},
		{name: "a gate key takes its turns a round, after those taken",
			rows: []RoundRow{row("q", 0, "g:1", 0, 1), row("q", 0, "g:1", 0, 2), row("q", 0, "g:1", 0, 3),
				row("q", 0, "g:1", 0, 4), row("q", 0, "g:1", 0, 5), row("q", 0, "g:2", 0, 6), row("q", 0, "g:2", 0, 7),
				row("q", 0, "g:2", 0, 8)},
			want: []int64{7, 8, 8, 8, 9, 4, 4, 5}},
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

func TestKeyFresh(t *testing.T) {
	for _, tc := range []struct {
		name         string
		head, last   int64
		ok           bool
		taken, turns int
		want         Fresh
		firstFour    []int64
	}{
		{name: "a key with no row waiting starts at the head", head: 5, turns: 1,
			want: Fresh{Round: 5, Turns: 1}, firstFour: []int64{5, 6, 7, 8}},
		{name: "a K = 1 key goes one past its last round", head: 5, last: 7, ok: true, taken: 1, turns: 1,
			want: Fresh{Round: 7, Taken: 1, Turns: 1}, firstFour: []int64{8, 9, 10, 11}},
		{name: "a key whose last round is the head's goes one past it", head: 5, last: 5, ok: true, taken: 1, turns: 1,
			want: Fresh{Round: 5, Taken: 1, Turns: 1}, firstFour: []int64{6, 7, 8, 9}},
		{name: "a key whose rows are all behind the head starts at the head", head: 5, last: 4, ok: true, taken: 3, turns: 3,
			want: Fresh{Round: 5, Turns: 3}, firstFour: []int64{5, 5, 5, 6}},
		{name: "a gate fills its last round's turns", head: 5, last: 6, ok: true, taken: 1, turns: 3,
			want: Fresh{Round: 6, Taken: 1, Turns: 3}, firstFour: []int64{6, 6, 7, 7}},
		{name: "a gate whose last round is full starts the next", head: 5, last: 6, ok: true, taken: 3, turns: 3,
			want: Fresh{Round: 6, Taken: 3, Turns: 3}, firstFour: []int64{7, 7, 7, 8}},
		{name: "more taken than turns (a lowered limit) counts as full", head: 5, last: 6, ok: true, taken: 9, turns: 2,
			want: Fresh{Round: 6, Taken: 2, Turns: 2}, firstFour: []int64{7, 7, 8, 8}},
		{name: "no limit reads as one turn", head: 0, turns: 0,
			want: Fresh{Round: 0, Turns: 1}, firstFour: []int64{0, 1, 2, 3}},
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
