package postgres

import (
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// freedSlot is a slot a row gave up when it left executing: a K = 1 key
// (shard -1) or a gate key's shard.
type freedSlot struct {
	key   string
	shard int
}

// queueFree queues, on b, what must follow rows leaving executing: the
// advisory locks of their K = 1 keys (waiting for any claim that holds one,
// so that the promotion below sees that claim's blocked rows), the credit of
// their gate shards when credit is set (counters locked in (key, shard)
// order), and the promotion of each key's first blocked rows, one per freed
// slot. Reaped claims do not credit gates (under-credit is the safe
// direction; the reconciler repairs it) and so promote only K = 1 keys.
func (s *Store) queueFree(b *pgx.Batch, freed []freedSlot, credit bool, now time.Time) {
	var one []string
	gates := map[shardKey]int{}
	for _, f := range freed {
		switch {
		case f.key == "":
		case f.shard < 0:
			one = append(one, f.key)
		case credit:
			gates[shardKey(f)]++
		}
	}
	slices.Sort(one)
	one = slices.Compact(one)
	if len(one) == 0 && len(gates) == 0 {
		return
	}
	if len(one) > 0 {
		b.Queue(s.q(sqlKeyLock), one, s.keySalt)
	}
	promote := map[string]int{}
	for _, k := range one {
		promote[k] = 1
	}
	if len(gates) > 0 {
		keys, shards, ns := shardCounts(gates)
		b.Queue(s.q(sqlSlotsLockExisting), keys, shards)
		b.Queue(s.q(sqlCredit), keys, shards, ns)
		for i, k := range keys {
			promote[k] += int(ns[i])
		}
	}
	keys := make([]string, 0, len(promote))
	for k := range promote {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	ns := make([]int32, len(keys))
	for i, k := range keys {
		ns[i] = int32(promote[k])
	}
	b.Queue(s.q(sqlPromote), keys, ns, tsArg(now), s.channel)
}
