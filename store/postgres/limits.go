package postgres

import (
	"context"
	"fmt"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
)

// SyncLimits replaces the stored limits with limits and reports how they
// differ from the ones stored before (see store.Store). Limits omitted are
// removed. Existing counters of a changed name are resized in the same
// transaction, keeping the slots in use: a key never has more free slots
// than its new limit minus the rows its counters hold. Counters of a name
// that lost its limit are deleted (its keys run at K = 1 from the next
// claim on).
func (s *Store) SyncLimits(ctx context.Context, limits []gate.Limit) (store.LimitsResult, error) {
	if err := s.check(); err != nil {
		return store.LimitsResult{}, err
	}
	newLs, err := gate.NewLimits(limits)
	if err != nil {
		return store.LimitsResult{}, fmt.Errorf("sync limits: %w", err)
	}
	all := newLs.All()
	names := make([]string, len(all))
	values := make([]int32, len(all))
	shards := make([]int32, len(all))
	for i, l := range all {
		names[i], values[i], shards[i] = l.Name, int32(l.Limit), int32(l.Shards)
	}

	var res store.LimitsResult
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlLimitsLock, lockSalt(s.schema, saltLimits)); err != nil {
			return err
		}
		old, err := readLimits(ctx, tx, s.q(sqlLimitsAll))
		if err != nil {
			return err
		}
		oldLs, err := gate.NewLimits(old)
		if err != nil {
			return fmt.Errorf("stored limits: %w", err)
		}
		if _, err := tx.Exec(ctx, s.q(sqlLimitsReplace), names, values, shards); err != nil {
			return err
		}
		res.Changes = gate.Diff(oldLs, newLs)
		if len(res.Changes) == 0 {
			return nil
		}
		changed := make([]string, len(res.Changes))
		for i, c := range res.Changes {
			changed[i] = c.Name
		}
		return s.resizeCounters(ctx, tx, newLs, changed, &res)
	})
	if err != nil {
		return store.LimitsResult{}, fmt.Errorf("sync limits: %w", err)
	}
	return res, nil
}

// resizeCounters re-shapes the counters of keys whose name changed and counts
// the live instances of those names.
func (s *Store) resizeCounters(ctx context.Context, tx pgx.Tx, newLs gate.Limits, changed []string, res *store.LimitsResult) error {
	type counter struct{ capacity, available int }
	counters := map[string]map[int]counter{}
	res.Live = map[string]int64{}
	b := &pgx.Batch{}
	b.Queue(s.q(sqlSlotsOfNames), changed).Query(func(rows pgx.Rows) error {
		var k string
		var sh int
		var c counter
		_, err := pgx.ForEachRow(rows, []any{&k, &sh, &c.capacity, &c.available}, func() error {
			if counters[k] == nil {
				counters[k] = map[int]counter{}
			}
			counters[k][sh] = c
			return nil
		})
		return err
	})
	b.Queue(s.q(sqlLiveByName), changed).Query(func(rows pgx.Rows) error {
		var name string
		var n int64
		_, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { res.Live[name] = n; return nil })
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}

	var (
		setKeys                   []string
		setShards, setCaps, setAv []int32
		drop                      []string
	)
	for k, byShard := range counters {
		l, limited := newLs.Lookup(gate.NameOf(k))
		if !limited {
			drop = append(drop, k)
			continue
		}
		used := map[int]int{}
		var existing []int
		for sh, c := range byShard {
			existing = append(existing, sh)
			if u := c.capacity - c.available; u > 0 {
				used[sh] = u
			}
		}
		target := resizeShards(l.ShardCapacities(), used, existing)
		for sh, t := range target {
			setKeys, setShards = append(setKeys, k), append(setShards, int32(sh))
			setCaps, setAv = append(setCaps, int32(t.capacity)), append(setAv, int32(t.available))
		}
	}
	b = &pgx.Batch{}
	if len(setKeys) > 0 {
		b.Queue(s.q(sqlSlotsInsert), setKeys, setShards, setCaps, setAv)
	}
	if len(drop) > 0 {
		b.Queue(s.q(sqlSlotsDelete), drop)
	}
	if b.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, b).Close()
}

// Limits returns the stored limits sorted by name.
func (s *Store) Limits(ctx context.Context) ([]gate.Limit, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	ls, err := readLimits(ctx, s.pool, s.q(sqlLimitsAll))
	if err != nil {
		return nil, fmt.Errorf("limits: %w", err)
	}
	return ls, nil
}

func readLimits(ctx context.Context, q querier, stmt string) ([]gate.Limit, error) {
	rows, err := q.Query(ctx, stmt)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (gate.Limit, error) {
		var l gate.Limit
		return l, r.Scan(&l.Name, &l.Limit, &l.Shards)
	})
}
