package postgres

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
)

// Health reports queue and gate pressure at now (zero: the database clock)
// from one read-only snapshot. Every count reads a partial index of its
// status, so the terminal rows of the retention window (other than failed
// ones) are never read; per-key work is bounded by the executing rows and
// store.HealthScanLimit waiting rows (see store.Health). A queue policy's
// BlockedReady comes from the queue's Ready count (capped at
// store.BlockedReadyLimit), its failed rows are counted up to
// store.HealthScanLimit per queue; its SaturatedKeys from the queue's executing
// rows grouped by key, each key at its budget probed for one waiting row.
// Handed-back rows (their oldest per queue, their count per workflow
// version) are read from their own partial index.
func (s *Store) Health(ctx context.Context, now time.Time) (store.Health, error) {
	if err := s.check(); err != nil {
		return store.Health{}, err
	}
	h := store.Health{Queues: []store.QueueHealth{}, Gates: []store.GateHealth{}, Warnings: []gate.Warning{}, RateLimits: []store.RateHealth{},
		HandedBack: []store.HandBackHealth{}}
	queues := map[string]*store.QueueHealth{}
	qh := func(name string) *store.QueueHealth {
		q := queues[name]
		if q == nil {
			q = &store.QueueHealth{Queue: name}
			queues[name] = q
		}
		return q
	}
	oldest := map[string]time.Time{}
	var at time.Time
	var limits []gate.Limit
	blocked := map[string]int64{}
	type gateRow struct {
		active            int64
		highest, saturate int
	}
	gates := map[string]gateRow{}
	type intent struct{ name, intent string }
	var intents []intent
	var changes []gate.Warning // limit changes that altered live keys

	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(sqlHealthSerial)
		b.Queue(s.q(sqlHealthNow), tsArg(now)).QueryRow(func(row pgx.Row) error { return row.Scan(&at) })
		b.Queue(s.q(sqlHealthReady), tsArg(now)).Query(func(rows pgx.Rows) error {
			var (
				name       string
				all, later int64
				first      time.Time
			)
			_, err := pgx.ForEachRow(rows, []any{&name, &all, &later, &first}, func() error {
				q := qh(name)
				q.Ready += all - later
				q.Scheduled += later
				// The earliest run time is a due row's when any is due.
				if o, ok := oldest[name]; all > later && (!ok || first.Before(o)) {
					oldest[name] = first
				}
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlHealthHandedBackOldest)).Query(func(rows pgx.Rows) error {
			var (
				name  string
				since time.Time
			)
			_, err := pgx.ForEachRow(rows, []any{&name, &since}, func() error {
				qh(name)
				if o, ok := oldest[name]; !ok || since.Before(o) {
					oldest[name] = since
				}
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlHealthHandedBack), store.HealthScanLimit).Query(func(rows pgx.Rows) error {
			var hb store.HandBackHealth
			left := store.HealthScanLimit
			_, err := pgx.ForEachRow(rows, []any{&hb.Workflow, &hb.Version, &hb.Count}, func() error {
				if left == 0 { // the row past the bound
					h.HandedBackCapped = true
					return nil
				}
				if hb.Count > left {
					hb.Count, h.HandedBackCapped = left, true
				}
				left -= hb.Count
				h.HandedBack = append(h.HandedBack, hb)
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlHealthStatuses)).Query(func(rows pgx.Rows) error {
			var (
				name, status string
				n            int64
			)
			_, err := pgx.ForEachRow(rows, []any{&name, &status, &n}, func() error {
				q := qh(name)
				switch status {
				case "blocked":
					q.Blocked += n
				case "awaiting", "awaiting_children":
					q.Awaiting += n
				case "executing":
					q.Executing += n
					q.Active += n
				}
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlHealthFailed), store.HealthScanLimit).Query(func(rows pgx.Rows) error {
			var (
				name string
				n    int64
			)
			_, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error {
				q := qh(name)
				q.Failed, q.FailedCapped = min(n, store.HealthScanLimit), n > store.HealthScanLimit
				return nil
			})
			return err
		})
		// Names' limits only: Health reports gates by name and checks
		// names' intents, whatever per-key limits are stored.
		b.Queue(s.q(sqlLimitsOfNames)).Query(func(rows pgx.Rows) error {
			var l gate.Limit
			_, err := pgx.ForEachRow(rows, []any{&l.Name, &l.Limit, &l.Shards}, func() error {
				limits = append(limits, l)
				return nil
			})
			return err
		})
		b.Queue(sqlHealthSnapshot).Query(func(rows pgx.Rows) error {
			var openUS int64
			_, err := pgx.ForEachRow(rows, []any{&h.OldestSnapshot.Holder, &h.OldestSnapshot.Transactions, &openUS}, func() error {
				h.OldestSnapshot.Open = time.Duration(openUS) * time.Microsecond
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlHealthBlockedByName)).Query(func(rows pgx.Rows) error {
			var (
				name string
				n    int64
			)
			_, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error {
				blocked[name] = n
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlHealthGates)).Query(func(rows pgx.Rows) error {
			var (
				name string
				g    gateRow
			)
			_, err := pgx.ForEachRow(rows, []any{&name, &g.active, &g.highest, &g.saturate}, func() error {
				gates[name] = g
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlHealthPolicies)).Query(func(rows pgx.Rows) error {
			var (
				name              string
				maxActive, perKey int
			)
			_, err := pgx.ForEachRow(rows, []any{&name, &maxActive, &perKey}, func() error {
				q := qh(name)
				q.MaxActive, q.MaxActivePerKey = maxActive, perKey
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlHealthPolicyKeys), tsArg(now), store.HealthScanLimit).Query(func(rows pgx.Rows) error {
			var (
				name string
				n    int
			)
			_, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error {
				q := qh(name)
				q.SaturatedKeys, q.SaturatedKeysCapped = min(n, store.HealthScanLimit), n > store.HealthScanLimit
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlHealthRates), store.HealthScanLimit, tsArg(now)).Query(func(rows pgx.Rows) error {
			var (
				rate     gate.RateLimit
				periodUS int64
				n, empty int
			)
			_, err := pgx.ForEachRow(rows, []any{&rate.Name, &rate.Limit, &periodUS, &rate.Burst, &rate.PerKey, &n, &empty}, func() error {
				rate.Period = time.Duration(periodUS) * time.Microsecond
				h.RateLimits = append(h.RateLimits, store.RateHealth{Limit: rate, Buckets: min(n, store.HealthScanLimit),
					EmptyBuckets: min(empty, store.HealthScanLimit), BucketsCapped: n > store.HealthScanLimit})
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlHealthIntents), store.HealthScanLimit).Query(func(rows pgx.Rows) error {
			var in intent
			_, err := pgx.ForEachRow(rows, []any{&in.name, &in.intent}, func() error {
				intents = append(intents, in)
				return nil
			})
			return err
		})
		b.Queue(s.q(sqlHealthLimitChanges), tsArg(now), micros(store.LiveChangeFor)).Query(func(rows pgx.Rows) error {
			w := gate.Warning{Kind: gate.LiveKeysChanged}
			_, err := pgx.ForEachRow(rows, []any{&w.Name, &w.Message, &w.Live}, func() error {
				changes = append(changes, w)
				return nil
			})
			return err
		})
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return store.Health{}, fmt.Errorf("health: %w", err)
	}
	h.Warnings = append(h.Warnings, changes...)

	for name, q := range queues {
		if o, ok := oldest[name]; ok {
			q.OldestReady = max(0, at.Sub(o))
		}
		if q.MaxActive > 0 && q.Active >= int64(q.MaxActive) {
			// Ready is counted in full above; the bound is the contract's.
			q.BlockedReady = min(q.Ready, store.BlockedReadyLimit)
		}
		h.Queues = append(h.Queues, *q)
	}
	slices.SortFunc(h.Queues, func(a, b store.QueueHealth) int { return strings.Compare(a.Queue, b.Queue) })

	ls, err := gate.NewLimits(limits)
	if err != nil {
		return store.Health{}, fmt.Errorf("health: stored limits: %w", err)
	}
	for _, l := range ls.Gates() {
		g := gates[l.Name]
		h.Gates = append(h.Gates, store.GateHealth{
			Name: l.Name, Limit: l.Limit, Shards: l.Shards, Active: g.active, BlockedReady: blocked[l.Name],
			SaturatedKeys: min(g.saturate, store.HealthScanLimit), SaturatedKeysCapped: g.saturate > store.HealthScanLimit,
			HighestKeyActive: g.highest,
		})
	}
	h.BlockedBy = store.NameCounts(blocked)
	seen := map[string]bool{}
	for _, in := range intents {
		k, err := gate.New(in.name, "x", gate.Intent(in.intent))
		if err != nil {
			continue
		}
		if w, ok := ls.Check(k); ok && !seen[string(w.Kind)+"/"+w.Name] {
			seen[string(w.Kind)+"/"+w.Name] = true
			h.Warnings = append(h.Warnings, w)
		}
	}
	slices.SortFunc(h.Warnings, func(a, b gate.Warning) int {
		return cmp.Or(strings.Compare(string(a.Kind), string(b.Kind)), strings.Compare(a.Name, b.Name))
	})
	return h, nil
}
