package admission

import "github.com/godurable/godurable/gate"

// This file is the credit side: what a gate shard's counter becomes when
// slots it lent come back (rows leaving executing, not handed off). Credit
// is the rule's one statement; PostgreSQL's sqlCredit and sqlSlotsDropEmpty
// are its SQL form (pinned equal to it by a differential test), and the
// memory store calls it.

// Credit returns what counter c becomes when n of its slots come back, and
// whether it is then to be deleted. lim is the limit of the key's name (nil:
// the name has no limit).
//
// The shard's slots in use drop by n, never below zero:
//
//	used = max(0, c.Capacity − c.Available − n)
//
// (a negative Available is debt: more rows hold the shard than its capacity,
// after its limit was lowered). The shard's share of the limit is
// c.Capacity when the name has no limit, 0 when c.Shard is beyond the
// limit's shards, and otherwise its part of gate.Limit.ShardCapacities,
// never more than c.Capacity. The counter becomes
//
//	Capacity  = max(share, used)
//	Available = Capacity − used
//
// and is dropped when its Capacity is 0: a shard the limit no longer has,
// once the last row it admitted is gone.
//
// So a shard that a lowered limit or shard count left larger than its share
// gives the returned slots back to the limit, not to its capacity, until it
// is down to its share. Available is max(0, share − used) and share is never
// above the old capacity: a credit makes a slot available only where the
// shard's share has room beside the rows still holding it, never grows a
// capacity past the slots in use, and never lowers the slots in use by more
// than n, so it cannot admit more than before. The result is what a
// reconciliation computes from the executing rows (see the PostgreSQL
// store's resizeShards: capacity max(share, used), the rest available), so
// no drift appears on this path.
//
// A counter whose capacity is its share and that is not in debt beyond n
// gets Available = min(Capacity, Available + n), its Capacity unchanged.
// Deeper debt (Available < −n) comes back as the Capacity raised to the
// slots still in use, with nothing available: the same slots in use as
// Capacity − Available, without a negative Available.
func Credit(c Counter, n int, lim *gate.Limit) (next Counter, drop bool) {
	used := max(0, c.Capacity-c.Available-n)
	share := c.Capacity
	if lim != nil {
		share = min(c.Capacity, shardShare(*lim, c.Shard))
	}
	capacity := max(share, used)
	return Counter{Shard: c.Shard, Capacity: capacity, Available: capacity - used}, capacity == 0
}

// shardShare is the capacity lim gives shard (see gate.Limit.ShardCapacities):
// 0 for a shard beyond its shards.
func shardShare(lim gate.Limit, shard int) int {
	shards := max(lim.Shards, 1)
	if shard >= shards {
		return 0
	}
	share := lim.Limit / shards
	if shard < lim.Limit%shards {
		share++
	}
	return share
}
