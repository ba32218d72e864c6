package admission

import (
	"fmt"
	"testing"
)

// BenchmarkDecide decides a claim's window of 1,000 rows of one key each
// (a third without a key, a third of 300 K = 1 keys, a third of 20 gate
// keys of 10): the planner's share of a claim.
func BenchmarkDecide(b *testing.B) {
	var window []Candidate
	st := state(nil)
	st.Limit = 1000
	for i := range 1000 {
		switch i % 3 {
		case 0:
			window = append(window, row(fmt.Sprint(i), ""))
		case 1:
			k := fmt.Sprintf("acct:%d", i%300)
			st.Locked[k] = true
			window = append(window, row(fmt.Sprint(i), k))
		default:
			k := fmt.Sprintf("api:%d", i%20)
			st.Gates[k] = counters([]int{10}, []int{10})
			window = append(window, gated(fmt.Sprint(i), k, 10, 1))
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		Decide(window, st)
	}
}
