package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Signal stores a signal and wakes the instance if it awaits that name (see
// store.Store). Both statements travel in one round trip and commit
// together. The first locks the instance row (FOR KEY SHARE, which
// conflicts with the FOR UPDATE of a park), so a concurrent Complete that
// parks the instance either commits before it (and the second statement
// sees the parked row and wakes it) or waits for it (and its inbox re-check
// sees the stored signal): the lost wake-up cannot happen.
func (s *Store) Signal(ctx context.Context, req store.SignalRequest) (store.SignalResult, error) {
	if err := s.check(); err != nil {
		return store.SignalResult{}, err
	}
	if _, err := uuid.Parse(req.InstanceID); err != nil {
		return store.SignalResult{}, fmt.Errorf("signal %s: %w", req.InstanceID, store.ErrNotFound)
	}
	if req.Name == "" {
		return store.SignalResult{}, fmt.Errorf("signal: %w: empty name", store.ErrInvalid)
	}
	if len(req.Payload) > 0 && !json.Valid(req.Payload) {
		return store.SignalResult{}, fmt.Errorf("signal: %w: payload is not valid JSON", store.ErrInvalid)
	}
	var (
		found, stored bool
		status        string
		woke          int64
	)
	b := &pgx.Batch{} // no explicit transaction: a batch runs in one implicit transaction
	b.Queue(s.q(sqlSignalStore), req.InstanceID, req.Name, jsonArg(req.Payload), req.DedupKey, tsArg(req.Now)).
		Query(func(rows pgx.Rows) error {
			for rows.Next() {
				found = true
				if err := rows.Scan(&status, &stored); err != nil {
					return err
				}
			}
			return rows.Err()
		})
	var wokeQueues []string
	b.Queue(s.q(sqlSignalWake), req.InstanceID, tsArg(req.Now)).Query(func(rows pgx.Rows) error {
		var q string
		var n int64
		_, err := pgx.ForEachRow(rows, []any{&q, &n}, func() error {
			woke += n
			wokeQueues = append(wokeQueues, q)
			return nil
		})
		return err
	})
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return store.SignalResult{}, fmt.Errorf("signal %s: %w", req.InstanceID, refused(err))
	}
	s.wakeAfterCommit(wokeQueues) // not in the signal's transaction: see wakeSender
	switch {
	case !found:
		return store.SignalResult{}, fmt.Errorf("signal %s: %w", req.InstanceID, store.ErrNotFound)
	case store.Status(status).Terminal():
		return store.SignalResult{}, fmt.Errorf("signal %s: %w (%s)", req.InstanceID, store.ErrTerminal, status)
	}
	return store.SignalResult{Duplicate: !stored, Woke: woke > 0}, nil
}
