package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/godurable/godurable/store"
)

// MarkQueuesWorked records that an engine works queues at now (see
// store.Store).
func (s *Store) MarkQueuesWorked(ctx context.Context, queues []string, now time.Time) error {
	if err := s.check(); err != nil {
		return err
	}
	qs, err := store.NormalizeQueueMarks(queues)
	if err != nil {
		return err
	}
	if len(qs) == 0 {
		return nil
	}
	if _, err := s.pool.Exec(ctx, s.q(sqlMarkQueuesWorked), qs, tsArg(now)); err != nil {
		return fmt.Errorf("mark queues worked: %w", err)
	}
	return nil
}

// WorkedQueues returns every marked queue (see store.Store).
func (s *Store) WorkedQueues(ctx context.Context, now time.Time) ([]store.WorkedQueue, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, s.q(sqlWorkedQueues), tsArg(now))
	if err != nil {
		return nil, fmt.Errorf("worked queues: %w", err)
	}
	defer rows.Close()
	out := []store.WorkedQueue{}
	for rows.Next() {
		var w store.WorkedQueue
		var at time.Time
		if err := rows.Scan(&w.Queue, &w.LastWorked, &at); err != nil {
			return nil, fmt.Errorf("worked queues: %w", err)
		}
		w.Since = max(at.Sub(w.LastWorked), 0)
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("worked queues: %w", err)
	}
	return out, nil
}
