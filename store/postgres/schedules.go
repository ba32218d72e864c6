package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/periodic"
	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
)

// SyncSchedules makes the schedules namespace owns equal to want in one
// transaction, serialized with every other schedule sync by an advisory
// lock (see store.Store).
func (s *Store) SyncSchedules(ctx context.Context, namespace string, want []store.Schedule, o store.SyncOptions) ([]store.Schedule, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	defs, err := store.ValidateSchedules(namespace, want)
	if err != nil {
		return nil, fmt.Errorf("sync schedules: %w", err)
	}
	var out []store.Schedule
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlLimitsLock, lockSalt(s.schema, saltSchedules)); err != nil {
			return err
		}
		before, err := readSchedules(ctx, tx, s.q(sqlSchedulesAll))
		if err != nil {
			return err
		}
		names := make([]string, len(defs))
		b := &pgx.Batch{}
		for i, d := range defs {
			names[i] = d.Name
			j := slices.IndexFunc(before, func(x store.Schedule) bool { return x.Name == d.Name })
			if j >= 0 && before[j].Namespace != namespace {
				return fmt.Errorf("schedule %q: %w %q", d.Name, store.ErrNamespaceConflict, before[j].Namespace)
			}
			if j >= 0 && before[j].Definition().SameDefinition(d) {
				continue
			}
			statuses := make([]string, len(d.UniqueStatuses))
			for k, st := range d.UniqueStatuses {
				statuses[k] = string(st)
			}
			b.Queue(s.q(sqlScheduleUpsert), pgx.NamedArgs{
				"name": d.Name, "namespace": namespace, "workflow": d.Workflow, "cron": d.Cron,
				"time_zone": d.TimeZone, "queue": d.Queue, "priority": d.Priority, "key": d.Key,
				"key_intent": string(d.KeyIntent), "also_keys": keysText(d.Also), "unique_statuses": statuses, "overlap": string(d.Overlap),
				"catch_up": string(d.CatchUp), "grace_us": d.Grace.Microseconds(), "now": s.clockNow(),
			})
		}
		if !o.KeepOmitted {
			b.Queue(s.q(sqlSchedulesDeleteOmitted), namespace, names)
		}
		b.Queue(s.q(sqlSchedulesAll)).Query(func(rows pgx.Rows) error {
			all, err := pgx.CollectRows(rows, scanSchedule)
			for _, sc := range all {
				if sc.Namespace == namespace {
					out = append(out, sc)
				}
			}
			return err
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if o.DryRun {
			return errDryRun
		}
		return nil
	})
	if err != nil && !errors.Is(err, errDryRun) {
		return nil, fmt.Errorf("sync schedules: %w", err)
	}
	if out == nil {
		out = []store.Schedule{}
	}
	return out, nil
}

// ListSchedules returns every stored schedule, sorted by name.
func (s *Store) ListSchedules(ctx context.Context) ([]store.Schedule, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	out, err := readSchedules(ctx, s.pool, s.q(sqlSchedulesAll))
	if err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	return out, nil
}

// PauseSchedule pauses or resumes a schedule (see store.Store).
func (s *Store) PauseSchedule(ctx context.Context, name string, paused bool, now time.Time) (store.Schedule, error) {
	if err := s.check(); err != nil {
		return store.Schedule{}, err
	}
	rows, err := s.pool.Query(ctx, s.q(sqlSchedulePause), name, paused, tsArg(now))
	if err != nil {
		return store.Schedule{}, fmt.Errorf("pause schedule %q: %w", name, err)
	}
	sc, err := pgx.CollectExactlyOneRow(rows, scanSchedule)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Schedule{}, fmt.Errorf("pause schedule %q: %w", name, store.ErrScheduleNotFound)
	}
	if err != nil {
		return store.Schedule{}, fmt.Errorf("pause schedule %q: %w", name, err)
	}
	return sc, nil
}

// FireSchedule records a tick and inserts its instance through the normal
// insert path, in one transaction that holds the schedule's row lock, so
// that of several engines firing one tick exactly one records it. Like
// Insert, it inserts a due instance of a busy K = 1 key (or of one at its
// cap of ready rows) blocked and heals the key after the commit
// (healInserted).
func (s *Store) FireSchedule(ctx context.Context, req store.FireRequest) (store.FireResult, error) {
	if err := s.check(); err != nil {
		return store.FireResult{}, err
	}
	var plan *insertPlan
	if req.Instance != nil {
		p, err := prepareInsert([]store.NewInstance{*req.Instance})
		if err != nil {
			return store.FireResult{}, fmt.Errorf("fire schedule %q: %w", req.Name, err)
		}
		plan = p
	}
	var res store.FireResult
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		res = store.FireResult{}
		rows, err := tx.Query(ctx, s.q(sqlScheduleLock), req.Name)
		if err != nil {
			return err
		}
		sc, err := pgx.CollectExactlyOneRow(rows, scanSchedule)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrScheduleNotFound
		}
		if err != nil {
			return err
		}
		if !sc.Accepts(req) {
			res.Stale, res.Schedule = true, sc
			return nil
		}
		if plan != nil && req.SkipIfRunning && sc.LastInstance != "" {
			if err := tx.QueryRow(ctx, s.q(sqlInstanceRunning), sc.LastInstance).Scan(&res.SkippedRunning); err != nil {
				return err
			}
		}
		var inserted any
		if plan != nil && !res.SkippedRunning {
			plan.block, plan.atGates, plan.wakeAfter = true, true, true
			if plan.unique {
				err = s.insertUnique(ctx, tx, plan)
			} else if err = s.blockAtGates(ctx, tx, plan); err == nil {
				err = s.runInsert(ctx, tx, plan)
			}
			if err != nil {
				return err
			}
			res.Inserted, res.Duplicate = plan.results[0].ID, plan.results[0].Duplicate
			inserted = res.Inserted
		}
		rows, err = tx.Query(ctx, s.q(sqlScheduleRecord), req.Name, req.Tick, inserted, tsArg(req.Now))
		if err != nil {
			return err
		}
		res.Schedule, err = pgx.CollectExactlyOneRow(rows, scanSchedule)
		return err
	})
	if err != nil {
		return store.FireResult{}, fmt.Errorf("fire schedule %q: %w", req.Name, err)
	}
	s.afterInsert(ctx, plan)
	return res, nil
}

func readSchedules(ctx context.Context, q querier, stmt string) ([]store.Schedule, error) {
	rows, err := q.Query(ctx, stmt)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, scanSchedule)
	if out == nil {
		out = []store.Schedule{}
	}
	return out, err
}

func scanSchedule(r pgx.CollectableRow) (store.Schedule, error) {
	var sc store.Schedule
	var intent, overlap, catchUp, also string
	var statuses []string
	var graceUS int64
	var lastTick, lastFired *time.Time
	err := r.Scan(&sc.Name, &sc.Namespace, &sc.Workflow, &sc.Cron, &sc.TimeZone, &sc.Queue, &sc.Priority, &sc.Key,
		&intent, &statuses, &overlap, &catchUp, &graceUS, &sc.Paused, &sc.Anchor, &lastTick, &sc.LastInstance,
		&lastFired, &sc.Epoch, &also)
	sc.Also = keyRefsOf(also)
	sc.KeyIntent, sc.Overlap, sc.CatchUp = gate.Intent(intent), periodic.Overlap(overlap), periodic.CatchUp(catchUp)
	sc.Grace = time.Duration(graceUS) * time.Microsecond
	for _, st := range statuses {
		sc.UniqueStatuses = append(sc.UniqueStatuses, store.Status(st))
	}
	sc.Anchor = sc.Anchor.UTC()
	sc.LastTick, sc.LastFiredAt = fromPtr(lastTick).UTC(), fromPtr(lastFired).UTC()
	return sc, err
}
