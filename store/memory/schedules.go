package memory

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"time"

	"github.com/godurable/godurable/store"
)

// SyncSchedules makes the schedules namespace owns equal to want (see store.Store).
func (s *Store) SyncSchedules(ctx context.Context, namespace string, want []store.Schedule, o store.SyncOptions) ([]store.Schedule, error) {
	defs, err := store.ValidateSchedules(namespace, want)
	if err != nil {
		return nil, fmt.Errorf("sync schedules: %w", err)
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.unlock(nil)
	wanted := map[string]bool{}
	for _, d := range defs {
		if old, ok := s.schedules[d.Name]; ok && old.Namespace != namespace {
			return nil, fmt.Errorf("sync schedules: schedule %q: %w %q", d.Name, store.ErrNamespaceConflict, old.Namespace)
		}
		wanted[d.Name] = true
	}
	next := map[string]store.Schedule{}
	for name, sc := range s.schedules {
		if sc.Namespace == namespace && !wanted[name] && !o.KeepOmitted {
			continue
		}
		next[name] = sc
	}
	now := s.clock()
	for _, d := range defs {
		d.Namespace = namespace
		if old, ok := next[d.Name]; ok {
			if old.Definition().SameDefinition(d) {
				continue
			}
			d.Paused, d.Anchor, d.LastTick, d.LastInstance, d.LastFiredAt, d.Epoch =
				old.Paused, old.Anchor, old.LastTick, old.LastInstance, old.LastFiredAt, old.Epoch+1
		} else {
			d.Anchor, d.Epoch = now.UTC(), 1
		}
		next[d.Name] = d
	}
	if !o.DryRun {
		s.schedules = next
	}
	return schedulesWhere(next, func(sc store.Schedule) bool { return sc.Namespace == namespace }), nil
}

// ListSchedules returns every stored schedule, sorted by name.
func (s *Store) ListSchedules(ctx context.Context) ([]store.Schedule, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.unlock(nil)
	return schedulesWhere(s.schedules, func(store.Schedule) bool { return true }), nil
}

// PauseSchedule pauses or resumes a schedule (see store.Store).
func (s *Store) PauseSchedule(ctx context.Context, name string, paused bool, now time.Time) (store.Schedule, error) {
	if err := s.lock(); err != nil {
		return store.Schedule{}, err
	}
	defer s.unlock(nil)
	sc, ok := s.schedules[name]
	if !ok {
		return store.Schedule{}, fmt.Errorf("pause schedule %q: %w", name, store.ErrScheduleNotFound)
	}
	if sc.Paused != paused {
		sc.Paused = paused
		sc.Epoch++
		if !paused {
			sc.Anchor = s.now(now).UTC()
		}
		s.schedules[name] = sc
	}
	return cloneSchedule(sc), nil
}

// FireSchedule records a tick and inserts its instance (see store.Store).
func (s *Store) FireSchedule(ctx context.Context, req store.FireRequest) (store.FireResult, error) {
	if err := s.lock(); err != nil {
		return store.FireResult{}, err
	}
	n := &notes{}
	defer s.unlock(n)
	sc, ok := s.schedules[req.Name]
	if !ok {
		return store.FireResult{}, fmt.Errorf("fire schedule %q: %w", req.Name, store.ErrScheduleNotFound)
	}
	if !sc.Accepts(req) {
		return store.FireResult{Stale: true, Schedule: cloneSchedule(sc)}, nil
	}
	now := s.now(req.Now)
	var res store.FireResult
	if req.Instance != nil && req.SkipIfRunning && sc.LastInstance != "" {
		if r, ok := s.rows[sc.LastInstance]; ok && !r.inst.Status.Terminal() {
			res.SkippedRunning = true
		}
	}
	if req.Instance != nil && !res.SkippedRunning {
		ins, err := s.checkNew([]store.NewInstance{*req.Instance}, nil)
		if err != nil {
			return store.FireResult{}, fmt.Errorf("fire schedule %q: %w", req.Name, err)
		}
		out := s.insert(ins, nil, now, n)
		res.Inserted, res.Duplicate = out[0].ID, out[0].Duplicate
		sc.LastInstance, sc.LastFiredAt = out[0].ID, now
	}
	sc.LastTick = req.Tick.UTC()
	sc.Epoch++
	s.schedules[req.Name] = sc
	res.Schedule = cloneSchedule(sc)
	return res, nil
}

func schedulesWhere(m map[string]store.Schedule, keep func(store.Schedule) bool) []store.Schedule {
	out := []store.Schedule{}
	for _, sc := range m {
		if keep(sc) {
			out = append(out, cloneSchedule(sc))
		}
	}
	slices.SortFunc(out, func(a, b store.Schedule) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func cloneSchedule(sc store.Schedule) store.Schedule {
	sc.UniqueStatuses = slices.Clone(sc.UniqueStatuses)
	return sc
}
