package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
)

var _ store.HealthReporter = (*Store)(nil)

// Health reports queue and gate pressure at now (zero: the database clock).
// Queue counts cover every row that is not done or canceled; gate figures
// come from executing rows, blocked rows and counters, and saturated keys
// are counted up to store.HealthScanLimit per gate. All of it is read in one
// round trip; its cost grows with live (and failed) rows, not with history.
func (s *Store) Health(ctx context.Context, now time.Time) (store.Health, error) {
	if err := s.check(); err != nil {
		return store.Health{}, err
	}
	var h store.Health
	saturated := map[string]int{}
	b := &pgx.Batch{}
	b.Queue(s.q(sqlHealthQueues), tsArg(now)).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var q store.QueueHealth
			var oldest *time.Time
			var at time.Time
			if err := rows.Scan(&q.Queue, &q.Ready, &q.Scheduled, &q.Blocked, &q.Executing, &q.Awaiting,
				&q.Failed, &oldest, &at); err != nil {
				return err
			}
			if oldest != nil && at.After(*oldest) {
				q.OldestReady = at.Sub(*oldest)
			}
			q.Active = q.Executing
			h.Queues = append(h.Queues, q)
		}
		return rows.Err()
	})
	b.Queue(s.q(sqlLimitsAll)).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var g store.GateHealth
			if err := rows.Scan(&g.Name, &g.Limit, &g.Shards); err != nil {
				return err
			}
			h.Gates = append(h.Gates, g)
		}
		return rows.Err()
	})
	gateRows := map[string][3]int64{}
	b.Queue(s.q(sqlHealthGateRows)).Query(func(rows pgx.Rows) error {
		var name string
		var active, highest, blocked int64
		_, err := pgx.ForEachRow(rows, []any{&name, &active, &highest, &blocked}, func() error {
			gateRows[name] = [3]int64{active, highest, blocked}
			return nil
		})
		return err
	})
	b.Queue(s.q(sqlHealthSaturated), store.HealthScanLimit).Query(func(rows pgx.Rows) error {
		var name string
		var n int
		_, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { saturated[name] = n; return nil })
		return err
	})
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return store.Health{}, fmt.Errorf("health: %w", err)
	}
	for i := range h.Gates {
		g := &h.Gates[i]
		r := gateRows[g.Name]
		g.Active, g.HighestKeyActive, g.BlockedReady = r[0], int(r[1]), r[2]
		g.SaturatedKeys = saturated[g.Name]
		if g.SaturatedKeys > store.HealthScanLimit {
			g.SaturatedKeys, g.SaturatedKeysCapped = store.HealthScanLimit, true
		}
	}
	return h, nil
}
