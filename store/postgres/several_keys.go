package postgres

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
)

// Rows of several keys (store.NewInstance.Also). Migration 025 describes
// how they are stored: one key in the key column, the others in
// extra_keys, and, while the row executes, a key_holds row for each of the
// others. This file holds what the claim and the freeing paths add for
// them; a window or a batch without such rows runs none of it.
//
// The rules are admission.Decide's, as for every row: a claim tries the
// locks of every K = 1 key of such a row (in the one sorted list of K = 1
// keys of sql.go's lock order) and locks its gates' counters with the
// others'; Decide admits the row only when each key has room, debiting
// nothing otherwise, and blocks it on the first full key in key order, a
// key whose lock the claim holds. The row then waits in that key's line
// (sqlBlockMulti puts the key in its key column), so that the key's
// freeing, which takes the same lock, promotes it. Admitted, it gets its
// first key back in its key column in the update that makes it executing
// (sqlClaim, sqlHandOff) and a hold of each other key (sqlClaimMulti);
// its outcome (sqlCompleteApply reads the holds,
// sqlHoldsDelete deletes them), release (sqlHoldsEnd) or reap
// (sqlHoldsOrphaned) deletes the holds and frees their slots with its own.
//
// Every statement that asks whether a K = 1 key is held reads key_holds
// too (the K = 1 busy check, see sql.go). So a K = 1 key held as another
// key is held for one-key rows as for rows of several; over-admission of
// such a key is kept from committing by key_holds_one for two holds in
// key_holds, and by the key's advisory lock, which every claim and
// hand-off of the key holds while it reads the holds, between a hold there
// and one in instances. A K = 1 key in the key column (a row's first key
// is its first identity) stays under instances_key_one_posix.

// alsoLimits fills the Also of the window's rows of several keys with the
// limits their other keys run under, and cc.free with the free slots of
// their gates, the gate in their key column included (sqlKeyLimits).
func (s *Store) alsoLimits(ctx context.Context, q querier, cc *claimContext) error {
	var keys []string
	for _, c := range cc.candidates {
		m, ok := cc.multi[c.ID]
		if !ok {
			continue
		}
		if c.Gate != nil {
			keys = append(keys, c.Key)
		}
		for _, o := range m.others {
			keys = append(keys, o.Key)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	needs := make(map[string]admission.Need, len(keys))
	cc.free = map[string]int{}
	rows, err := q.Query(ctx, s.q(sqlKeyLimits), keys)
	if err != nil {
		return fmt.Errorf("limits of other keys: %w", err)
	}
	var k string
	var lc limitColumns
	var free *int32
	_, err = pgx.ForEachRow(rows, []any{&k, &lc.limit, &lc.shards, &lc.rLimit, &lc.rPeriod, &lc.rBurst, &lc.rPerKey, &free}, func() error {
		n := admission.Need{Key: k}
		n.Gate, n.Rate = lc.limits(k)
		needs[k] = n
		if free != nil {
			cc.free[k] = int(*free)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("limits of other keys: %w", err)
	}
	for i, c := range cc.candidates {
		m, ok := cc.multi[c.ID]
		if !ok {
			continue
		}
		for j, o := range m.others {
			cc.candidates[i].Also[j] = needs[o.Key]
		}
	}
	return nil
}

// limitColumns are a key's limit (its own or its name's: limit, shards)
// and its name's rate limit as the window statement and sqlKeyLimits
// return them; NULL: none.
type limitColumns struct {
	limit, shards  *int32
	rLimit, rBurst *int32
	rPeriod        *int64
	rPerKey        *bool
}

// limits returns key's limit (nil: K = 1) and rate limit (nil: none).
func (lc limitColumns) limits(key string) (*gate.Limit, *gate.RateLimit) {
	var l *gate.Limit
	var r *gate.RateLimit
	if lc.limit != nil {
		l = &gate.Limit{Name: gate.NameOf(key), Limit: int(*lc.limit), Shards: int(*lc.shards)}
	}
	if lc.rLimit != nil {
		r = &gate.RateLimit{Name: gate.NameOf(key), Limit: int(*lc.rLimit),
			Period: time.Duration(*lc.rPeriod) * time.Microsecond, Burst: int(*lc.rBurst), PerKey: *lc.rPerKey}
	}
	return l, r
}

// oneKey reports whether k, one of c's keys, runs under K = 1.
func oneKey(c admission.Candidate, k string) bool {
	if k == c.Key {
		return c.Gate == nil
	}
	for _, n := range c.Also {
		if n.Key == k {
			return n.Gate == nil
		}
	}
	return false
}

// keysText is how the statements that write a row's other keys take them
// (sqlInsert, sqlCompleteApply, sqlClaim, sqlHandOff, sqlBlockMulti: the
// other keys' text, see sql.go): each key and its intent joined by U+001E,
// the keys joined by U+001F ("" for none). Keys and intents hold no
// control character (gate.Parse refuses them). One text per row keeps the
// statements a join of the batch to the rows by id, with nothing to group.
func keysText(keys []store.KeyRef) string {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(0x1f)
		}
		b.WriteString(k.Key)
		b.WriteByte(0x1e)
		b.WriteString(string(k.Intent))
	}
	return b.String()
}

// keyRefsOf reads keysText's text back (nil for "").
func keyRefsOf(text string) []store.KeyRef {
	if text == "" {
		return nil
	}
	var out []store.KeyRef
	for e := range strings.SplitSeq(text, "\x1f") {
		k, intent, _ := strings.Cut(e, "\x1e")
		out = append(out, store.KeyRef{Key: k, Intent: gate.Intent(intent)})
	}
	return out
}

// historyKeys is how a history row keeps the keys of its step (the history
// table's key column): its Key, and its other keys after it, joined by
// U+001F, which no key holds (History splits them again).
func historyKeys(h *store.HistoryEntry) string {
	if len(h.Also) == 0 {
		return h.Key
	}
	return h.Key + "\x1f" + strings.Join(h.Also, "\x1f")
}

// multiClaim is what the update that makes a claim's or a hand-off's
// admitted rows executing (sqlClaim, sqlHandOff) and sqlClaimMulti write
// for its rows of several keys.
type multiClaim struct {
	// firsts, intents and extras are, at the index of each row whose key
	// column holds another key than its first (the key it last waited in
	// line for), its first key, that key's intent and its other keys' text
	// (see keysText); NULL for the other rows, nil when no row needs it.
	firsts, intents, extras []*string
	// The holds of the rows' other keys: one entry per (row, key), with
	// the shard it was admitted with.
	holdIDs, holdKeys []string
	holdShards        []int32
}

// claimMulti returns what the admitted rows that multi has write, the
// rows of several keys, and sets the shard of each row whose key column
// takes its first key to that key's shard in shards (admitted's order).
// Each row runs with its first key in its key column and its other keys in
// key order (store.NormalizeKeys); a row whose stored keys do not
// normalize, which no insert writes, gets nothing.
func claimMulti(multi map[string]multiRow, admitted []admission.Admitted, shards []int32) multiClaim {
	var mc multiClaim
	if len(multi) == 0 {
		return mc
	}
	for i, a := range admitted {
		m, ok := multi[a.ID]
		if !ok {
			continue
		}
		first, rest := m.key, slices.Clone(m.others)
		if err := store.NormalizeKeys(&first.Key, &first.Intent, &rest); err != nil {
			continue
		}
		shardOf := m.shards(a)
		if m.key != first || !slices.Equal(m.others, rest) {
			if mc.firsts == nil {
				mc.firsts, mc.intents, mc.extras = make([]*string, len(admitted)), make([]*string, len(admitted)), make([]*string, len(admitted))
			}
			in, text := string(first.Intent), keysText(rest)
			mc.firsts[i], mc.intents[i], mc.extras[i] = &first.Key, &in, &text
			shards[i] = int32(shardOf[first.Key])
		}
		for _, o := range rest {
			mc.holdIDs, mc.holdKeys = append(mc.holdIDs, a.ID), append(mc.holdKeys, o.Key)
			mc.holdShards = append(mc.holdShards, int32(shardOf[o.Key]))
		}
	}
	return mc
}

// queueHolds queues sqlClaimMulti for mc's holds, of rows that sqlClaim or
// sqlHandOff made executing for worker earlier in the transaction.
func (s *Store) queueHolds(b *pgx.Batch, mc multiClaim, worker string) {
	if len(mc.holdIDs) > 0 {
		b.Queue(s.q(sqlClaimMulti), uuidArg(mc.holdIDs), mc.holdKeys, mc.holdShards, worker)
	}
}

// queueBlockMulti queues sqlBlockMulti for the plan's blocked rows of
// several keys: each goes in the line of the key that refused it.
func (s *Store) queueBlockMulti(b *pgx.Batch, cc *claimContext, plan admission.Plan, now any, waited []string) {
	var ids, keys, intents, extras []string
	for _, id := range plan.Blocked {
		on, ok := plan.BlockedOn[id]
		m, multi := cc.multi[id]
		if !ok || !multi {
			continue
		}
		all := append([]store.KeyRef{m.key}, m.others...)
		i := slices.IndexFunc(all, func(k store.KeyRef) bool { return k.Key == on })
		if i < 0 {
			continue
		}
		ids, keys, intents = append(ids, id), append(keys, on), append(intents, string(all[i].Intent))
		rest := slices.Delete(all, i, i+1)
		slices.SortFunc(rest, func(a, b store.KeyRef) int { return strings.Compare(a.Key, b.Key) })
		extras = append(extras, keysText(rest))
	}
	if len(ids) == 0 {
		return
	}
	b.Queue(s.q(sqlBlockMulti), uuidArg(ids), keys, intents, extras, now, waited)
}

// holdsOf sets, on the claimed rows of several keys (those multi has), the
// shards they were admitted with: sqlClaim and sqlHandOff return a row's
// key column's shard only, and not its holds.
func holdsOf(claimed []store.Claimed, multi map[string]multiRow, admitted []admission.Admitted) {
	byID := make(map[string]admission.Admitted, len(admitted))
	for _, a := range admitted {
		if _, ok := multi[a.ID]; ok {
			byID[a.ID] = a
		}
	}
	for i := range claimed {
		a, ok := byID[claimed[i].ID]
		if !ok {
			continue
		}
		in := &claimed[i].Instance
		m := multi[a.ID]
		shardOf := m.shards(a)
		in.KeyShard = shardOf[in.Key]
		in.AlsoShards = make([]int, len(in.Also))
		for j, o := range in.Also {
			in.AlsoShards[j] = shardOf[o.Key]
		}
	}
}

// endedHolds reads the holds the committed outcomes' rows held
// (applied.holds, from sqlCompleteApply) as freed slots, every key freed
// the full way, and lists the rows that had any; the holds of a row that
// passed names (row -> successor) pass to its successor instead
// (sqlHoldsPass).
func endedHolds(outcomes []store.Outcome, done []applied, passed map[string]string) (freed []freedSlot, ids []string, err error) {
	for _, a := range done {
		id := outcomes[a.ord-1].ID
		if _, ok := passed[id]; a.holds == "" || ok {
			continue
		}
		ids = append(ids, id)
		hs, err := parseHolds(id, a.holds)
		if err != nil {
			return nil, nil, err
		}
		for _, h := range hs {
			freed = append(freed, freedSlot{key: h.Key, shard: h.Shard, waiters: true})
		}
	}
	return freed, ids, nil
}

// parseHolds reads the holds of row id as sqlCompleteApply returns them
// (key U+001F shard, joined by U+001E; "" for none).
func parseHolds(id, holds string) ([]admission.Hold, error) {
	if holds == "" {
		return nil, nil
	}
	var hs []admission.Hold
	for h := range strings.SplitSeq(holds, "\x1e") {
		k, sh, ok := strings.Cut(h, "\x1f")
		shard, err := strconv.Atoi(sh)
		if !ok || err != nil {
			return nil, fmt.Errorf("the holds of %s: %q", id, holds)
		}
		hs = append(hs, admission.Hold{Key: k, Shard: shard})
	}
	return hs, nil
}

// freedHolds reads sqlHoldsEnd's or sqlHoldsOrphaned's rows as freed
// slots: every key the holds held is freed the full way.
func freedHolds(rows pgx.Rows, freed *[]freedSlot) error {
	var f freedSlot
	_, err := pgx.ForEachRow(rows, []any{&f.key, &f.shard}, func() error {
		*freed = append(*freed, freedSlot{key: f.key, shard: f.shard, waiters: true})
		return nil
	})
	return err
}

// HoldsSeveralKeys reports that the store holds several concurrency keys
// per instance (store.SeveralKeys).
func (s *Store) HoldsSeveralKeys() bool { return true }

var _ store.SeveralKeys = (*Store)(nil)

// waitIn puts key k, one of the keys of in, in its key column, with its
// intent, and the key that was there among its other keys (in key order):
// the row then waits in k's line, as a claim that blocks it on k leaves it
// (sqlBlockMulti).
func waitIn(in *store.NewInstance, k string) {
	if in.Key == k {
		return
	}
	i := slices.IndexFunc(in.Also, func(r store.KeyRef) bool { return r.Key == k })
	if i < 0 {
		return
	}
	also := slices.Clone(in.Also)
	first := store.KeyRef{Key: in.Key, Intent: in.KeyIntent}
	in.Key, in.KeyIntent = also[i].Key, also[i].Intent
	also[i] = first
	slices.SortFunc(also, func(a, b store.KeyRef) int { return strings.Compare(a.Key, b.Key) })
	in.Also = also
}
