package postgres

import (
	"testing"

	"github.com/godurable/godurable/gate"
)

func TestCleanShards(t *testing.T) {
	lim := gate.Limit{Name: "api", Limit: 10, Shards: 3} // capacities 4, 3, 3
	for _, tc := range []struct {
		name   string
		locked []slotRow
		n      int
		want   bool
	}{
		{"every counter as the limit makes it", []slotRow{{shard: 0, capacity: 4}, {shard: 2, capacity: 3}}, 3, true},
		{"nothing locked, counters as the limit", nil, 3, true},
		{"a counter left from a wider sharding", []slotRow{{shard: 0, capacity: 4}}, 4, false},
		{"a shard not created yet", []slotRow{{shard: 0, capacity: 4}}, 2, false},
		{"a locked shard beyond the limit's shards", []slotRow{{shard: 3, capacity: 3}}, 3, false},
		{"a capacity from an older limit", []slotRow{{shard: 1, capacity: 5}}, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cleanShards(lim, tc.locked, tc.n); got != tc.want {
				t.Fatalf("cleanShards = %v, want %v", got, tc.want)
			}
		})
	}
}
