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
	bases := map[RoundGroup]int64{
		{Queue: "q", Key: ""}:                 5,
		{Queue: "q", Key: "a:1"}:              5,
		{Queue: "q", Key: "b:1"}:              9,
		{Queue: "q", Priority: 1}:             0,
		{Queue: "r", Key: "a:1"}:              2,
		{Queue: "q", Priority: 1, Key: "a:1"}: 3,
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := map[RoundGroup]int{}
			got := Rounds(tc.rows, func(g RoundGroup) int64 {
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
