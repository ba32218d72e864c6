package memory

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// Get returns a copy of one instance.
func (s *Store) Get(ctx context.Context, id string) (store.Instance, error) {
	if err := s.lock(); err != nil {
		return store.Instance{}, err
	}
	defer s.unlock(nil)
	r := s.rows[id]
	if r == nil {
		return store.Instance{}, fmt.Errorf("get %s: %w", id, store.ErrNotFound)
	}
	return r.snapshot(), nil
}

// List returns the instances matching f, ordered by id (descending with
// f.Newest), at most f.Limit of them (0: no limit), among the first
// f.ScanLimit after f.AfterID (0: all): ListPage's Rows.
func (s *Store) List(ctx context.Context, f store.ListFilter) ([]store.Instance, error) {
	p, err := s.ListPage(ctx, f)
	return p.Rows, err
}

// ListPage is List with the position it stopped at (see store.Page).
func (s *Store) ListPage(ctx context.Context, f store.ListFilter) (store.Page, error) {
	if err := s.lock(); err != nil {
		return store.Page{}, err
	}
	defer s.unlock(nil)
	match := func(in *store.Instance) bool {
		return (f.Workflow == "" || in.Workflow == f.Workflow) &&
			(f.Status == "" || in.Status == f.Status) &&
			(f.Key == "" || in.Key == f.Key || slices.ContainsFunc(in.Also, func(k store.KeyRef) bool { return k.Key == f.Key })) &&
			(f.Queue == "" || in.Queue == f.Queue)
	}
	// seen are the rows after AfterID (only the matching ones when the
	// scan is not bounded), in the result order.
	var seen []*row
	for _, r := range s.rows {
		in := &r.inst
		if (!f.Newest && f.AfterID != "" && in.ID <= f.AfterID) ||
			(f.Newest && f.AfterID != "" && in.ID >= f.AfterID) ||
			(f.ScanLimit <= 0 && !match(in)) {
			continue
		}
		seen = append(seen, r)
	}
	if f.Newest {
		slices.SortFunc(seen, func(a, b *row) int { return strings.Compare(b.inst.ID, a.inst.ID) })
	} else {
		slices.SortFunc(seen, func(a, b *row) int { return strings.Compare(a.inst.ID, b.inst.ID) })
	}
	var p store.Page
	for i, r := range seen {
		if f.ScanLimit > 0 && i == f.ScanLimit {
			break
		}
		if !match(&r.inst) {
			continue
		}
		p.Rows = append(p.Rows, r.snapshot())
		if f.Limit > 0 && len(p.Rows) == f.Limit {
			p.Next = r.inst.ID
			return p, nil
		}
	}
	if f.ScanLimit > 0 && len(seen) >= f.ScanLimit {
		p.Next, p.ScanStopped = seen[f.ScanLimit-1].inst.ID, true
	}
	return p, nil
}

// Inbox returns the unconsumed signals of an instance, oldest first, at
// most limit (0: no limit).
func (s *Store) Inbox(ctx context.Context, id string, limit int) ([]store.Signal, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.unlock(nil)
	r := s.rows[id]
	if r == nil {
		return nil, nil
	}
	var out []store.Signal
	for _, sg := range r.inbox {
		if sg.consumed {
			continue
		}
		if limit > 0 && len(out) == limit {
			break
		}
		c := sg.sig
		c.Payload = cloneJSON(c.Payload)
		out = append(out, c)
	}
	return out, nil
}

// Children returns the children of parentID in creation order.
func (s *Store) Children(ctx context.Context, parentID string) ([]store.Instance, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.unlock(nil)
	kids := s.children[parentID]
	out := make([]store.Instance, len(kids))
	for i, r := range kids {
		out[i] = r.snapshot()
	}
	return out, nil
}

// History returns the recorded step runs of an instance, oldest first.
func (s *Store) History(ctx context.Context, id string) ([]store.HistoryEntry, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.unlock(nil)
	r := s.rows[id]
	if r == nil {
		return nil, fmt.Errorf("history %s: %w", id, store.ErrNotFound)
	}
	return slices.Clone(r.history), nil
}

// KeyInfo explains a key: its K, its executing holders (oldest claim
// first), its ready and blocked waiters and the next in admission order, and
// its free slots (for a K = 1 key, 1 minus its holders).
func (s *Store) KeyInfo(ctx context.Context, key string) (store.KeyInfo, error) {
	if _, err := gate.Parse(key); err != nil {
		return store.KeyInfo{}, fmt.Errorf("key info: %w", err)
	}
	if err := s.lock(); err != nil {
		return store.KeyInfo{}, err
	}
	defer s.unlock(nil)
	info := store.KeyInfo{Key: key, K: 1}
	lim, gated := s.limits.For(key)
	if gated {
		info.LimitName = lim.Name
		info.K, info.Shards = lim.Limit, lim.Shards
	}
	ks := s.keys[key]
	var holders, waiting []*row
	if ks != nil {
		for _, r := range ks.rows {
			if (r.inst.Status == store.StatusBlocked || r.inst.Status == store.StatusReady) && !r.inLineOf(key) {
				info.WaitingElsewhere++
				continue
			}
			switch r.inst.Status {
			case store.StatusExecuting:
				holders = append(holders, r)
			case store.StatusBlocked:
				info.Blocked++
				waiting = append(waiting, r)
			case store.StatusReady:
				waiting = append(waiting, r)
			}
		}
	}
	slices.SortFunc(holders, func(a, b *row) int {
		if c := a.inst.StartedAt.Compare(b.inst.StartedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
	for _, r := range holders {
		info.Holders = append(info.Holders, r.snapshot())
	}
	info.Waiting = len(waiting)
	if len(waiting) > 0 {
		first := slices.MinFunc(waiting, func(a, b *row) int {
			if pickLess(a, b) {
				return -1
			}
			return 1
		})
		in := first.snapshot()
		info.NextInLine = &in
		oldest := slices.MinFunc(waiting, func(a, b *row) int {
			if c := a.inst.RunAt.Compare(b.inst.RunAt); c != 0 {
				return c
			}
			return cmp.Compare(a.seq, b.seq)
		}).snapshot()
		info.OldestWaiting = &oldest
	}
	if rate, ok := s.rates.Lookup(gate.NameOf(key)); ok {
		info.RateLimit = &rate
		if b, ok := s.buckets[rate.BucketFor(key)]; ok {
			info.Bucket = &b
		}
	}
	switch {
	case !gated:
		info.Available = max(0, 1-len(holders))
	case ks == nil || ks.counters == nil:
		info.Available = max(0, lim.Limit-len(holders))
	default:
		info.Available = s.room(key, ks)
	}
	return info, nil
}
