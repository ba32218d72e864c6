package admission

import (
	"testing"

	"github.com/godurable/godurable/gate"
)

func TestCleanShards(t *testing.T) {
	lim := gate.Limit{Name: "api", Limit: 10, Shards: 3} // capacities 4, 3, 3
	for _, tc := range []struct {
		name   string
		locked []Counter
		n      int
		want   bool
	}{
		{"every counter as the limit makes it", []Counter{{Shard: 0, Capacity: 4}, {Shard: 2, Capacity: 3}}, 3, true},
		{"nothing locked, counters as the limit", nil, 3, true},
		{"a counter left from a wider sharding", []Counter{{Shard: 0, Capacity: 4}}, 4, false},
		{"a shard not created yet", []Counter{{Shard: 0, Capacity: 4}}, 2, false},
		{"a locked shard beyond the limit's shards", []Counter{{Shard: 3, Capacity: 3}}, 3, false},
		{"a capacity from an older limit", []Counter{{Shard: 1, Capacity: 5}}, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := CleanShards(lim, tc.locked, tc.n); got != tc.want {
				t.Fatalf("CleanShards = %v, want %v", got, tc.want)
			}
		})
	}
}
