package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
)

// SyncConcurrencyPolicies makes the queue policies namespace owns equal to
// defs in one transaction, serialized with every other policy sync by an
// advisory lock (see store.Store). Queues whose policy changed are
// notified, and their blocked rows whose key has room are promoted, so
// that a raised per-key budget admits them at the next claim.
func (s *Store) SyncConcurrencyPolicies(ctx context.Context, namespace string, defs []store.ConcurrencyPolicy, o store.SyncOptions) ([]store.ConcurrencyPolicy, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if err := store.ValidatePolicies(namespace, defs); err != nil {
		return nil, fmt.Errorf("sync concurrency policies: %w", err)
	}
	n := len(defs)
	queues, maxes, perKey := make([]string, n), make([]int32, n), make([]int32, n)
	for i, d := range defs {
		queues[i], maxes[i], perKey[i] = d.Queue, int32(d.MaxActive), int32(d.MaxActivePerKey)
	}
	var changed []string
	var out []store.ConcurrencyPolicy
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlLimitsLock, lockSalt(s.schema, saltPolicies)); err != nil {
			return err
		}
		before, err := readPolicies(ctx, tx, s.q(sqlPoliciesAll))
		if err != nil {
			return err
		}
		for _, d := range defs {
			if i := slices.IndexFunc(before, func(p store.ConcurrencyPolicy) bool { return p.Queue == d.Queue }); i >= 0 && before[i].Namespace != namespace {
				return fmt.Errorf("queue %q: %w %q", d.Queue, store.ErrNamespaceConflict, before[i].Namespace)
			}
		}
		b := &pgx.Batch{}
		b.Queue(s.q(sqlPoliciesSync), namespace, queues, maxes, perKey, o.KeepOmitted)
		b.Queue(s.q(sqlPoliciesAll)).Query(func(rows pgx.Rows) error {
			all, err := pgx.CollectRows(rows, scanPolicy)
			if err != nil {
				return err
			}
			changed = changedQueues(before, all)
			for _, p := range all {
				if p.Namespace == namespace {
					out = append(out, p)
				}
			}
			return nil
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if o.DryRun {
			return errDryRun
		}
		if len(changed) > 0 {
			_, err := tx.Exec(ctx, s.q(sqlNotifyQueues), changed, s.channel)
			return err
		}
		return nil
	})
	if errors.Is(err, errDryRun) {
		if out == nil {
			out = []store.ConcurrencyPolicy{}
		}
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sync concurrency policies: %w", err)
	}
	if len(changed) > 0 {
		if err := s.promoteBlockedIn(ctx, changed, time.Time{}); err != nil {
			return nil, fmt.Errorf("sync concurrency policies: promote: %w", err)
		}
	}
	if out == nil {
		out = []store.ConcurrencyPolicy{}
	}
	return out, nil
}

// changedQueues lists the queues whose policy differs between two sorted lists.
func changedQueues(before, after []store.ConcurrencyPolicy) []string {
	seen := map[string]store.ConcurrencyPolicy{}
	for _, p := range before {
		seen[p.Queue] = p
	}
	var out []string
	for _, p := range after {
		if old, ok := seen[p.Queue]; !ok || old != p {
			out = append(out, p.Queue)
		}
		delete(seen, p.Queue)
	}
	for q := range seen {
		out = append(out, q)
	}
	slices.Sort(out)
	return out
}

// promoteBlockedIn makes ready the blocked rows of the given queues whose
// key has room: up to one per K = 1 key with no executing row (under the
// key's advisory lock), up to the free slots of a gate key. A row promoted
// that still does not fit is blocked again by the next claim. The keys are
// read reconcileKeyChunk at a time, each page's in a transaction of its
// own, so that no transaction holds more than reconcileKeyChunk advisory
// locks (see the reconciler's reconcileKeys).
func (s *Store) promoteBlockedIn(ctx context.Context, queues []string, now time.Time) error {
	for after := ""; ; {
		rows, err := s.pool.Query(ctx, s.q(sqlBlockedKeysIn), queues, after, reconcileKeyChunk)
		if err != nil {
			return err
		}
		var keys, one, gated []string
		var k string
		var isGate, inQueues bool
		if _, err := pgx.ForEachRow(rows, []any{&k, &isGate, &inQueues}, func() error {
			keys = append(keys, k)
			switch {
			case !inQueues:
			case isGate:
				gated = append(gated, k)
			default:
				one = append(one, k)
			}
			return nil
		}); err != nil {
			return err
		}
		if len(one)+len(gated) > 0 {
			slices.Sort(one) // the lock order (see sql.go)
			if err := s.inTx(ctx, func(tx pgx.Tx) error {
				b := &pgx.Batch{}
				if len(one) > 0 {
					b.Queue(s.q(sqlKeyLock), one, s.keySalt)
					b.Queue(s.q(sqlPromoteIfRoom), one, 1, tsArg(now), s.channel, false)
				}
				if len(gated) > 0 {
					b.Queue(s.q(sqlPromoteIfRoom), gated, maxWindow, tsArg(now), s.channel, false)
				}
				return tx.SendBatch(ctx, b).Close()
			}); err != nil {
				return err
			}
		}
		if len(keys) < reconcileKeyChunk {
			return nil
		}
		after = keys[len(keys)-1]
	}
}

// ListConcurrencyPolicies returns every stored policy, sorted by queue.
func (s *Store) ListConcurrencyPolicies(ctx context.Context) ([]store.ConcurrencyPolicy, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	out, err := readPolicies(ctx, s.pool, s.q(sqlPoliciesAll))
	if err != nil {
		return nil, fmt.Errorf("list concurrency policies: %w", err)
	}
	return out, nil
}

func readPolicies(ctx context.Context, q querier, stmt string) ([]store.ConcurrencyPolicy, error) {
	rows, err := q.Query(ctx, stmt)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, scanPolicy)
	if out == nil {
		out = []store.ConcurrencyPolicy{}
	}
	return out, err
}

func scanPolicy(r pgx.CollectableRow) (store.ConcurrencyPolicy, error) {
	var p store.ConcurrencyPolicy
	return p, r.Scan(&p.Queue, &p.Namespace, &p.MaxActive, &p.MaxActivePerKey)
}
