package memory

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// Health reports queue and gate pressure at now (zero: the store's clock).
// The memory store walks its rows under its lock: its cost grows with the
// rows it holds, which is fine for the tests and demos it serves. Its
// numbers are those the PostgreSQL backend reports for the same state,
// except that it looks for warnings among every waiting row, not only the
// first store.HealthScanLimit.
func (s *Store) Health(ctx context.Context, now time.Time) (store.Health, error) {
	if err := s.lock(); err != nil {
		return store.Health{}, err
	}
	defer s.unlock(nil)
	now = s.now(now)
	h := store.Health{Queues: []store.QueueHealth{}, Gates: []store.GateHealth{}, Warnings: []gate.Warning{}}
	blockedBy := map[string]int64{}

	queues := map[string]*store.QueueHealth{}
	oldest := map[string]time.Time{}
	qh := func(name string) *store.QueueHealth {
		q := queues[name]
		if q == nil {
			q = &store.QueueHealth{Queue: name}
			queues[name] = q
		}
		return q
	}
	gates := map[string]*store.GateHealth{}
	for _, l := range s.limits.Gates() {
		gates[l.Name] = &store.GateHealth{Name: l.Name, Limit: l.Limit, Shards: l.Shards}
	}
	handedBack := map[store.HandBackHealth]int{} // by workflow and version
	warnings := map[string]gate.Warning{}
	warn := func(r *row) {
		k, err := gate.ParseWithIntent(r.inst.Key, r.inst.KeyIntent)
		if err != nil {
			return
		}
		if w, ok := s.limits.Check(k); ok {
			warnings[string(w.Kind)+"/"+w.Name] = w
		}
	}
	for _, r := range s.rows {
		in := &r.inst
		switch in.Status {
		case store.StatusReady:
			q := qh(in.Queue)
			// A handed-back row ages from when it first became ready, due
			// again or not (a hand-back only postpones it).
			since, aged := in.RunAt, !in.RunAt.After(now)
			if !in.ReadySince.IsZero() {
				since, aged = in.ReadySince, true
				handedBack[store.HandBackHealth{Workflow: in.Workflow, Version: in.Version}]++
			}
			if o, ok := oldest[in.Queue]; aged && (!ok || since.Before(o)) {
				oldest[in.Queue] = since
			}
			if in.RunAt.After(now) {
				q.Scheduled++
				continue
			}
			q.Ready++
		case store.StatusBlocked:
			qh(in.Queue).Blocked++
			on := gate.NameOf(r.waitsOn()) // the key it is blocked on
			if on != "" {
				blockedBy[on]++
			}
			if g := gates[on]; g != nil {
				g.BlockedReady++
			}
		case store.StatusExecuting:
			q := qh(in.Queue)
			q.Executing++
			q.Active++
		case store.StatusAwaiting, store.StatusChildren:
			qh(in.Queue).Awaiting++
		case store.StatusFailed:
			// Counted up to HealthScanLimit, as PostgreSQL counts them.
			if q := qh(in.Queue); q.Failed < store.HealthScanLimit {
				q.Failed++
			} else {
				q.FailedCapped = true
			}
		}
		if in.Key == "" {
			continue
		}
		switch in.Status {
		case store.StatusExecuting, store.StatusReady, store.StatusBlocked:
			warn(r)
		}
	}
	for name, p := range s.policies {
		q := qh(name)
		q.MaxActive, q.MaxActivePerKey = p.MaxActive, p.MaxActivePerKey
		if q.Active >= int64(p.MaxActive) {
			q.BlockedReady = min(q.Ready, store.BlockedReadyLimit)
		}
		if p.MaxActivePerKey > 0 {
			s.saturatedPolicyKeys(name, p.MaxActivePerKey, now, q)
		}
	}
	for name, q := range queues {
		if o, ok := oldest[name]; ok {
			q.OldestReady = max(0, now.Sub(o))
		}
		h.Queues = append(h.Queues, *q)
	}
	slices.SortFunc(h.Queues, func(a, b store.QueueHealth) int { return strings.Compare(a.Queue, b.Queue) })
	h.HandedBack, h.HandedBackCapped = countHandedBack(handedBack)

	for k, ks := range s.keys {
		g := gates[gate.NameOf(k)]
		if g == nil || ks.executing == 0 {
			continue
		}
		g.Active += int64(ks.executing)
		g.HighestKeyActive = max(g.HighestKeyActive, ks.executing)
		if s.room(k, ks) == 0 {
			if g.SaturatedKeys < store.HealthScanLimit {
				g.SaturatedKeys++
			} else {
				g.SaturatedKeysCapped = true
			}
		}
	}
	for _, l := range s.limits.Gates() {
		h.Gates = append(h.Gates, *gates[l.Name])
	}
	for _, w := range warnings {
		h.Warnings = append(h.Warnings, w)
	}
	for _, c := range s.liveChanges {
		if now.Sub(c.at) < store.LiveChangeFor {
			h.Warnings = append(h.Warnings, c.w)
		}
	}
	h.RateLimits = []store.RateHealth{}
	for _, rate := range s.rates.All() {
		rh := store.RateHealth{Limit: rate}
		for id, b := range s.buckets {
			if gate.NameOf(id) != rate.Name || rate.PerKey != strings.Contains(id, ":") {
				continue
			}
			if rh.Buckets == store.HealthScanLimit {
				rh.BucketsCapped = true
				break
			}
			rh.Buckets++
			if rate.Tokens(rate.Refill(b, now)) < 1 {
				rh.EmptyBuckets++
			}
		}
		h.RateLimits = append(h.RateLimits, rh)
	}
	slices.SortFunc(h.Warnings, func(a, b gate.Warning) int {
		return cmp.Or(strings.Compare(string(a.Kind), string(b.Kind)), strings.Compare(a.Name, b.Name))
	})
	h.BlockedBy = store.NameCounts(blockedBy)
	return h, nil
}

// saturatedPolicyKeys counts, into q, the keys of queue name with at least
// perKey executing rows there and a row of that queue waiting for them
// (blocked, or ready and due at now), up to store.HealthScanLimit.
func (s *Store) saturatedPolicyKeys(name string, perKey int, now time.Time, q *store.QueueHealth) {
	qs := s.queues[name]
	if qs == nil {
		return
	}
	for k, n := range qs.keyExec {
		if n < perKey || !s.waitsIn(k, name, now) {
			continue
		}
		if q.SaturatedKeys < store.HealthScanLimit {
			q.SaturatedKeys++
		} else {
			q.SaturatedKeysCapped = true
		}
	}
}

// waitsIn reports whether key k has a row in queue name that is blocked,
// or ready and due at now.
func (s *Store) waitsIn(k, name string, now time.Time) bool {
	ks := s.keys[k]
	if ks == nil {
		return false
	}
	for _, r := range ks.rows {
		in := &r.inst
		if in.Queue != name {
			continue
		}
		if in.Status == store.StatusBlocked || (in.Status == store.StatusReady && !in.RunAt.After(now)) {
			return true
		}
	}
	return false
}

// countHandedBack lists the handed-back rows per workflow version, sorted,
// counting at most store.HealthScanLimit rows in that order as the
// PostgreSQL backend does: the result's counts and whether it is capped.
func countHandedBack(by map[store.HandBackHealth]int) ([]store.HandBackHealth, bool) {
	out := []store.HandBackHealth{}
	for k := range by {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b store.HandBackHealth) int {
		return cmp.Or(strings.Compare(a.Workflow, b.Workflow), cmp.Compare(a.Version, b.Version))
	})
	left := store.HealthScanLimit
	for i := range out {
		n := by[out[i]]
		if n > left {
			out[i].Count = left
			return out[:i+1], true
		}
		out[i].Count, left = n, left-n
	}
	return out, false
}
