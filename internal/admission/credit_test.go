package admission

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
)

func TestCredit(t *testing.T) {
	lim := func(limit, shards int) *gate.Limit { return &gate.Limit{Name: "a", Limit: limit, Shards: shards} }
	for _, tc := range []struct {
		name string
		c    Counter
		n    int
		lim  *gate.Limit
		want Counter
		drop bool
	}{
		{name: "plain credit", c: Counter{Shard: 0, Capacity: 3, Available: 1}, n: 1, lim: lim(3, 1),
			want: Counter{Shard: 0, Capacity: 3, Available: 2}},
		{name: "several slots at once", c: Counter{Shard: 1, Capacity: 2, Available: 0}, n: 2, lim: lim(4, 2),
			want: Counter{Shard: 1, Capacity: 2, Available: 2}},
		{name: "never above capacity", c: Counter{Shard: 0, Capacity: 3, Available: 3}, n: 1, lim: lim(3, 1),
			want: Counter{Shard: 0, Capacity: 3, Available: 3}},
		{name: "n larger than the slots in use", c: Counter{Shard: 0, Capacity: 3, Available: 2}, n: 3, lim: lim(3, 1),
			want: Counter{Shard: 0, Capacity: 3, Available: 3}},
		{name: "debt is paid off first", c: Counter{Shard: 0, Capacity: 2, Available: -1}, n: 1, lim: lim(2, 1),
			want: Counter{Shard: 0, Capacity: 2, Available: 0}},
		{name: "debt beyond n keeps the slots in use, nothing available",
			c: Counter{Shard: 0, Capacity: 2, Available: -2}, n: 1, lim: lim(2, 1),
			want: Counter{Shard: 0, Capacity: 3, Available: 0}},
		{name: "debt paid off past n frees the rest", c: Counter{Shard: 0, Capacity: 2, Available: -1}, n: 3, lim: lim(2, 1),
			want: Counter{Shard: 0, Capacity: 2, Available: 2}},
		{name: "a shard beyond the limit's shards keeps what is in use",
			c: Counter{Shard: 2, Capacity: 2, Available: 0}, n: 1, lim: lim(4, 2),
			want: Counter{Shard: 2, Capacity: 1, Available: 0}},
		{name: "a shard beyond the limit's shards is dropped once empty",
			c: Counter{Shard: 2, Capacity: 2, Available: 1}, n: 1, lim: lim(4, 2),
			want: Counter{Shard: 2, Capacity: 0, Available: 0}, drop: true},
		{name: "an oversized shard shrinks to the slots in use",
			c: Counter{Shard: 0, Capacity: 5, Available: 0}, n: 1, lim: lim(2, 1),
			want: Counter{Shard: 0, Capacity: 4, Available: 0}},
		{name: "an oversized shard shrinks to its share",
			c: Counter{Shard: 0, Capacity: 5, Available: 2}, n: 2, lim: lim(2, 1),
			want: Counter{Shard: 0, Capacity: 2, Available: 1}},
		{name: "the remainder goes to the first shards",
			c: Counter{Shard: 0, Capacity: 4, Available: 0}, n: 4, lim: lim(5, 3),
			want: Counter{Shard: 0, Capacity: 2, Available: 2}},
		{name: "a later shard gets the quotient",
			c: Counter{Shard: 2, Capacity: 4, Available: 0}, n: 4, lim: lim(5, 3),
			want: Counter{Shard: 2, Capacity: 1, Available: 1}},
		{name: "a raised limit does not grow a capacity",
			c: Counter{Shard: 0, Capacity: 2, Available: 0}, n: 1, lim: lim(9, 1),
			want: Counter{Shard: 0, Capacity: 2, Available: 1}},
		{name: "no limit keeps the capacity", c: Counter{Shard: 3, Capacity: 4, Available: 1}, n: 2,
			want: Counter{Shard: 3, Capacity: 4, Available: 3}},
		{name: "no limit, an empty counter is dropped", c: Counter{Shard: 0, Capacity: 0, Available: 0}, n: 1,
			want: Counter{Shard: 0, Capacity: 0, Available: 0}, drop: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, drop := Credit(tc.c, tc.n, tc.lim)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.drop, drop)
		})
	}
}

// TestCreditProperties checks, over a grid of shapes, what the rule
// promises: no capacity above the old one or the slots in use, slots in use
// lowered by at most n and never below zero, nothing available beyond the
// shard's share, and a share-shaped counter credited as min(capacity,
// available + n) when its debt is at most n.
func TestCreditProperties(t *testing.T) {
	for capacity := 0; capacity <= 5; capacity++ {
		for available := -3; available <= capacity; available++ {
			for n := 1; n <= 4; n++ {
				for shards := 1; shards <= 3; shards++ {
					for limit := shards; limit <= 6; limit++ {
						for shard := 0; shard <= 3; shard++ {
							lim := &gate.Limit{Name: "a", Limit: limit, Shards: shards}
							c := Counter{Shard: shard, Capacity: capacity, Available: available}
							got, drop := Credit(c, n, lim)
							used, was := got.Capacity-got.Available, capacity-available
							share := shardShare(*lim, shard)
							require.GreaterOrEqual(t, got.Available, 0, "%+v n=%d %+v", c, n, lim)
							require.Equal(t, max(0, was-n), used, "%+v n=%d %+v", c, n, lim)
							require.LessOrEqual(t, got.Capacity, max(capacity, used), "%+v n=%d %+v", c, n, lim)
							require.LessOrEqual(t, got.Available, max(0, share-used), "%+v n=%d %+v", c, n, lim)
							require.Equal(t, got.Capacity == 0, drop)
							if capacity == share && available >= -n {
								require.Equal(t, Counter{Shard: shard, Capacity: capacity, Available: min(capacity, available+n)}, got)
							}
						}
					}
				}
			}
		}
	}
}
