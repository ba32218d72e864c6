package admission

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestInsertBlocked(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	row := func(key string, prio int, at time.Duration, seq int64) InsertRow {
		return InsertRow{Key: key, Priority: prio, At: t0.Add(at), Seq: seq}
	}
	many := func(key string, n int) []InsertRow {
		rs := make([]InsertRow, n)
		for i := range rs {
			rs[i] = row(key, 0, 0, int64(i))
		}
		return rs
	}
	states := map[string]KeyState{"busy:1": {Busy: true}, "ready:1": {Ready: ReadyCap - 2}, "full:1": {Ready: ReadyCap}}
	upTo := func(n, of int) []bool {
		out := make([]bool, of)
		for i := n; i < of; i++ {
			out[i] = true
		}
		return out
	}
	// Past the cap, by priority, then run_at, then sequence, not input order.
	ordered := many("a:1", ReadyCap-1)
	ordered = append(ordered, row("a:1", 1, 0, 100), row("a:1", 0, time.Second, 101), row("a:1", 0, 0, 103), row("a:1", 0, 0, 102))
	orderedWant := upTo(ReadyCap-1, ReadyCap-1+4)
	orderedWant[ReadyCap-1+3] = false // seq 102: the cap's last row
	for _, tc := range []struct {
		name string
		rows []InsertRow
		want []bool
	}{
		{name: "none", rows: nil, want: []bool{}},
		{name: "rows of a free key go in ready up to the cap", rows: many("a:1", ReadyCap), want: upTo(ReadyCap, ReadyCap)},
		{name: "past the cap they go in blocked", rows: many("a:1", ReadyCap+3), want: upTo(ReadyCap, ReadyCap+3)},
		{name: "every row of a busy key goes in blocked", rows: many("busy:1", 2), want: []bool{true, true}},
		{name: "ready rows already there count", rows: many("ready:1", 4), want: upTo(2, 4)},
		{name: "a key at the cap takes no more ready rows", rows: many("full:1", 1), want: []bool{true}},
		{name: "past the cap by priority, run_at, sequence", rows: ordered, want: orderedWant},
		{name: "keys are independent",
			rows: []InsertRow{row("a:1", 0, 0, 1), row("busy:1", 0, 0, 2), row("ready:1", 0, 0, 3), row("full:1", 0, 0, 4)},
			want: []bool{false, true, false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := map[string]int{}
			got := InsertBlocked(tc.rows, func(k string) KeyState { calls[k]++; return states[k] })
			require.Equal(t, tc.want, got)
			for k, n := range calls {
				require.Equal(t, 1, n, "state(%s) called once", k)
			}
		})
	}
}

func TestInsertBlockedAtGate(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	row := func(gate string, prio int, at time.Duration, seq int64) InsertRow {
		return InsertRow{Key: gate, Priority: prio, At: t0.Add(at), Seq: seq}
	}
	free := map[string]int{"full:g": 0, "two:g": 2, "held:g": 0, "lined:g": 2, "heldlined:g": 2}
	lined := map[string]bool{"lined:g": true, "heldlined:g": true}
	for _, tc := range []struct {
		name string
		rows []InsertRow
		want []bool
	}{
		{name: "none", rows: nil, want: []bool{}},
		{name: "a full gate blocks every row", rows: []InsertRow{row("full:g", 0, 0, 1), row("full:g", 0, 0, 2)}, want: []bool{true, true}},
		{name: "rows take the free slots, the rest go in blocked",
			rows: []InsertRow{row("two:g", 0, 0, 1), row("two:g", 0, 0, 2), row("two:g", 0, 0, 3)},
			want: []bool{false, false, true}},
		{name: "by priority, then run_at, then sequence, not input order",
			rows: []InsertRow{row("two:g", 1, 0, 1), row("two:g", 0, time.Second, 2), row("two:g", 0, 0, 4), row("two:g", 0, 0, 3)},
			want: []bool{true, true, false, false}},
		{name: "a gate whose counters could not all be read takes every row ready",
			rows: []InsertRow{row("held:g", 0, 0, 1)}, want: []bool{false}},
		{name: "gates are independent",
			rows: []InsertRow{row("full:g", 0, 0, 1), row("two:g", 0, 0, 2), row("held:g", 0, 0, 3)},
			want: []bool{true, false, false}},
		{name: "rows waiting in a gate's line keep its free slots: the batch goes in behind them",
			rows: []InsertRow{row("lined:g", -1, 0, 1), row("lined:g", 0, 0, 2), row("two:g", 0, 0, 3)},
			want: []bool{true, true, false}},
		{name: "a gate whose counters could not all be read takes every row ready, lined or not",
			rows: []InsertRow{row("heldlined:g", 0, 0, 1)}, want: []bool{false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls, lines := map[string]int{}, map[string]int{}
			got := InsertBlockedAtGate(tc.rows,
				func(g string) (int, bool) { calls[g]++; return free[g], g != "held:g" && g != "heldlined:g" },
				func(g string) bool { lines[g]++; return lined[g] })
			require.Equal(t, tc.want, got)
			for g, n := range calls {
				require.Equal(t, 1, n, "free(%s) called once", g)
			}
			for g, n := range lines {
				require.Equal(t, 1, n, "lined(%s) called once", g)
			}
		})
	}
}

func TestInsertBehindFirst(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	row := func(key string, prio int, seq int64) InsertRow {
		return InsertRow{Key: key, Priority: prio, At: t0, Seq: seq}
	}
	ahead := []InsertRow{row("acct:1", 0, 1), row("zz:1", 0, 1), row("acct:3", 0, 9)}
	for _, tc := range []struct {
		name  string
		rows  []InsertRow
		gates []string
		want  []bool
	}{
		{name: "none", rows: nil, gates: nil, want: []bool{}},
		{name: "a row of its key goes in ready ahead of it: its key's line", rows: []InsertRow{row("acct:1", 0, 2)}, gates: []string{"hot:x"}, want: []bool{true}},
		{name: "no row of its key ahead: the gate's line", rows: []InsertRow{row("acct:2", 0, 2)}, gates: []string{"hot:x"}, want: []bool{false}},
		{name: "the row of its key comes after it", rows: []InsertRow{row("acct:3", 0, 2)}, gates: []string{"hot:x"}, want: []bool{false}},
		{name: "... or after it by priority", rows: []InsertRow{row("acct:1", -1, 2)}, gates: []string{"hot:x"}, want: []bool{false}},
		{name: "the gate comes first in key order", rows: []InsertRow{row("zz:1", 0, 2)}, gates: []string{"hot:x"}, want: []bool{false}},
		{name: "a first key that is no K = 1 key", rows: []InsertRow{row("", 0, 2)}, gates: []string{"hot:x"}, want: []bool{false}},
		{name: "rows wait in the gate's line already", rows: []InsertRow{row("acct:1", 0, 2)}, gates: []string{"lined:x"}, want: []bool{false}},
		{name: "a row of the batch goes in the gate's line ahead of it",
			rows: []InsertRow{row("acct:1", 0, 5), row("acct:2", 0, 3), row("acct:1", 0, 2)}, gates: []string{"hot:x", "hot:x", "hot:x"},
			want: []bool{false, false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, InsertBehindFirst(tc.rows, tc.gates, ahead, func(g string) bool { return g == "lined:x" }))
		})
	}
}
