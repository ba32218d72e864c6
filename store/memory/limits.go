package memory

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// This file holds the desired-state syncs: key limits and rate limits per
// namespace, and queue policies per namespace.

// SyncLimits stores the concurrency limits of store.DefaultNamespace, its
// rate limits unchanged (see store.Store).
func (s *Store) SyncLimits(ctx context.Context, limits []gate.Limit) (store.LimitsResult, error) {
	if limits == nil {
		limits = []gate.Limit{}
	}
	return s.syncKeyLimits(store.DefaultNamespace, limits, nil, store.SyncOptions{})
}

// SyncKeyLimits makes the limits namespace owns equal to want (see
// store.Store). Counters of keys whose limit changed are resized at once
// from the executing rows (so a lowered limit never over-admits), blocked
// rows of keys that gained room are promoted, and the buckets of a name
// whose rate limit changed keep their tokens (dropped when the limit or
// its scope went away).
func (s *Store) SyncKeyLimits(ctx context.Context, namespace string, want store.KeyLimits, o store.SyncOptions) (store.LimitsResult, error) {
	return s.syncKeyLimits(namespace, want.Limits, want.RateLimits, o)
}

// syncKeyLimits syncs namespace's limits unless limits is nil, and its
// rate limits unless rates is nil.
func (s *Store) syncKeyLimits(namespace string, limits []gate.Limit, rates []gate.RateLimit, o store.SyncOptions) (store.LimitsResult, error) {
	wantLs, wantRs, err := store.ValidateKeyLimits(namespace, limits, rates)
	if err != nil {
		return store.LimitsResult{}, err
	}
	if err := s.lock(); err != nil {
		return store.LimitsResult{}, err
	}
	n := &notes{}
	defer s.unlock(n)
	for _, l := range wantLs.All() {
		if owner, ok := s.limitOwner[l.Name]; ok && owner != namespace {
			return store.LimitsResult{}, fmt.Errorf("sync limits: limit %q: %w %q", l.Name, store.ErrNamespaceConflict, owner)
		}
	}
	for _, name := range o.RemoveLimits {
		if owner, ok := s.limitOwner[name]; ok && owner != namespace {
			return store.LimitsResult{}, fmt.Errorf("sync limits: limit %q: %w %q", name, store.ErrNamespaceConflict, owner)
		}
	}
	for _, r := range wantRs.All() {
		if owner, ok := s.rateOwner[r.Name]; ok && owner != namespace {
			return store.LimitsResult{}, fmt.Errorf("sync limits: rate limit %q: %w %q", r.Name, store.ErrNamespaceConflict, owner)
		}
	}

	next := s.limits
	if limits != nil {
		nextLs := desired(s.limits.All(), wantLs.All(), s.limitOwner, namespace, o.KeepOmitted, func(l gate.Limit) string { return l.Name })
		nextLs = slices.DeleteFunc(nextLs, func(l gate.Limit) bool { return slices.Contains(o.RemoveLimits, l.Name) })
		if next, err = gate.NewLimits(nextLs); err == nil {
			err = next.Validate()
		}
		if err != nil {
			return store.LimitsResult{}, fmt.Errorf("sync limits: %w", err)
		}
	}
	nextRates := s.rates
	if rates != nil {
		nextRs := desired(s.rates.All(), wantRs.All(), s.rateOwner, namespace, o.KeepOmitted, func(r gate.RateLimit) string { return r.Name })
		if nextRates, err = gate.NewRateLimits(nextRs); err != nil {
			return store.LimitsResult{}, fmt.Errorf("sync limits: %w", err)
		}
	}

	res := store.LimitsResult{Changes: gate.Diff(s.limits, next), RateChanges: gate.DiffRates(s.rates, nextRates), Live: map[string]int64{}}
	changed := map[string]bool{}
	for _, c := range res.Changes {
		changed[c.Name] = true
		res.Live[c.Name] = 0
	}
	for _, c := range res.RateChanges {
		res.Live[c.Name] = 0
	}
	keys := s.sortedKeys()
	for _, k := range keys {
		if _, ok := res.Live[gate.NameOf(k)]; ok {
			res.Live[gate.NameOf(k)] += int64(len(s.keys[k].rows))
		}
		if _, ok := res.Live[k]; ok { // a per-key limit's change
			res.Live[k] += int64(len(s.keys[k].rows))
		}
	}
	for n, live := range res.Live {
		res.Live[n] = min(live, gate.LiveCountCap)
	}
	if o.DryRun {
		return res, nil
	}

	s.limits, s.rates = next, nextRates
	for _, w := range store.LiveChangeWarnings(res) {
		s.liveChanges[w.Name] = liveChange{w: w, at: s.clock()}
	}
	if limits != nil {
		claimOwnership(s.limitOwner, namespace, wantLs.All(), next.All(), func(l gate.Limit) string { return l.Name })
	}
	if rates != nil {
		claimOwnership(s.rateOwner, namespace, wantRs.All(), nextRates.All(), func(r gate.RateLimit) string { return r.Name })
	}
	for _, c := range res.RateChanges {
		s.adjustBuckets(c)
	}
	for _, k := range keys {
		ks := s.keys[k]
		if !changed[gate.NameOf(k)] && !changed[k] || ks == nil {
			continue
		}
		if ks.counters != nil {
			if lim, ok := s.limits.For(k); ok {
				s.repairCounters(ks, lim)
			} else {
				ks.counters = nil
			}
		}
		s.promoteFree(k, s.clock(), n)
	}
	return res, nil
}

// desired is the stored set after namespace syncs want: entries of other
// namespaces stay, the namespace's omitted entries go (unless keep), and
// want is added or replaces.
func desired[T any](current, want []T, owner map[string]string, namespace string, keep bool, name func(T) string) []T {
	wanted := map[string]bool{}
	for _, w := range want {
		wanted[name(w)] = true
	}
	var out []T
	for _, c := range current {
		n := name(c)
		if wanted[n] {
			continue
		}
		if owner[n] == namespace && !keep {
			continue
		}
		out = append(out, c)
	}
	return append(out, want...)
}

// claimOwnership records namespace as the owner of want and forgets owners
// of entries no longer stored.
func claimOwnership[T any](owner map[string]string, namespace string, want, stored []T, name func(T) string) {
	for _, w := range want {
		owner[name(w)] = namespace
	}
	keep := map[string]bool{}
	for _, st := range stored {
		keep[name(st)] = true
	}
	for n := range owner {
		if !keep[n] {
			delete(owner, n)
		}
	}
}

// adjustBuckets applies a rate limit change to the name's buckets: they
// keep their tokens under a changed limit, and are dropped when the name
// lost its rate limit or changed scope (a bucket per name versus per key).
func (s *Store) adjustBuckets(c gate.RateChange) {
	for id, b := range s.buckets {
		if gate.NameOf(id) != c.Name {
			continue
		}
		if !c.OldSet || !c.NewSet || c.Old.PerKey != c.New.PerKey {
			delete(s.buckets, id)
			continue
		}
		s.buckets[id] = c.New.Rescale(b, c.Old)
	}
}

// Limits returns the stored limits, sorted by name.
func (s *Store) Limits(ctx context.Context) ([]gate.Limit, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.unlock(nil)
	return s.limits.All(), nil
}

// NameLimits returns the stored limits of key names, no per-key limit,
// sorted by name (see store.NameLimitsReader).
func (s *Store) NameLimits(ctx context.Context) ([]gate.Limit, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.unlock(nil)
	return s.limits.Gates(), nil
}

// RateLimits returns the stored rate limits, sorted by name.
func (s *Store) RateLimits(ctx context.Context) ([]gate.RateLimit, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.unlock(nil)
	return s.rates.All(), nil
}

// SyncConcurrencyPolicies makes the queue policies namespace owns equal to
// defs (see store.Store). Blocked rows of the queues whose policy changed
// are promoted where their key has room, so that a raised per-key budget
// admits them at the next claim.
func (s *Store) SyncConcurrencyPolicies(ctx context.Context, namespace string, defs []store.ConcurrencyPolicy, o store.SyncOptions) ([]store.ConcurrencyPolicy, error) {
	if err := store.ValidatePolicies(namespace, defs); err != nil {
		return nil, fmt.Errorf("sync concurrency policies: %w", err)
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	n := &notes{}
	defer s.unlock(n)
	wanted := map[string]bool{}
	for _, d := range defs {
		if p, ok := s.policies[d.Queue]; ok && p.Namespace != namespace {
			return nil, fmt.Errorf("sync concurrency policies: queue %q: %w %q", d.Queue, store.ErrNamespaceConflict, p.Namespace)
		}
		wanted[d.Queue] = true
	}
	if o.DryRun {
		var out []store.ConcurrencyPolicy
		for _, p := range s.policiesWhere(func(p store.ConcurrencyPolicy) bool { return p.Namespace == namespace }) {
			if wanted[p.Queue] || o.KeepOmitted {
				out = append(out, p)
			}
		}
		for _, d := range defs {
			out = slices.DeleteFunc(out, func(p store.ConcurrencyPolicy) bool { return p.Queue == d.Queue })
			d.Namespace = namespace
			out = append(out, d)
		}
		slices.SortFunc(out, func(a, b store.ConcurrencyPolicy) int { return strings.Compare(a.Queue, b.Queue) })
		if out == nil {
			out = []store.ConcurrencyPolicy{}
		}
		return out, nil
	}
	changed := map[string]bool{}
	for q, p := range s.policies {
		if p.Namespace == namespace && !wanted[q] && !o.KeepOmitted {
			delete(s.policies, q)
			changed[q] = true
		}
	}
	for _, d := range defs {
		d.Namespace = namespace
		if s.policies[d.Queue] != d {
			changed[d.Queue] = true
		}
		s.policies[d.Queue] = d
	}
	if len(changed) > 0 {
		now := s.clock()
		for _, k := range s.sortedKeys() {
			ks := s.keys[k]
			if slices.ContainsFunc(ks.blocked.rows, func(r *row) bool { return changed[r.inst.Queue] }) {
				s.promoteFree(k, now, n)
			}
		}
		for q := range changed {
			n.add(q)
		}
	}
	return s.policiesWhere(func(p store.ConcurrencyPolicy) bool { return p.Namespace == namespace }), nil
}

// ListConcurrencyPolicies returns every stored policy, sorted by queue.
func (s *Store) ListConcurrencyPolicies(ctx context.Context) ([]store.ConcurrencyPolicy, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.unlock(nil)
	return s.policiesWhere(func(store.ConcurrencyPolicy) bool { return true }), nil
}

func (s *Store) policiesWhere(keep func(store.ConcurrencyPolicy) bool) []store.ConcurrencyPolicy {
	out := []store.ConcurrencyPolicy{}
	for _, p := range s.policies {
		if keep(p) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b store.ConcurrencyPolicy) int { return strings.Compare(a.Queue, b.Queue) })
	return out
}
