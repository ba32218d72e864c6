package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// PauseQueue pauses or resumes a queue (see store.Store), and notifies
// the queue.
func (s *Store) PauseQueue(ctx context.Context, queue string, paused bool, now time.Time) (bool, error) {
	if err := s.check(); err != nil {
		return false, err
	}
	q, err := store.NormalizeQueueName(queue)
	if err != nil {
		return false, err
	}
	var tag pgconn.CommandTag
	if paused {
		tag, err = s.pool.Exec(ctx, s.q(sqlPauseQueue), q, tsArg(now))
	} else {
		tag, err = s.pool.Exec(ctx, s.q(sqlResumeQueue), q)
	}
	if err != nil {
		return false, fmt.Errorf("pause queue %q: %w", q, err)
	}
	changed := tag.RowsAffected() > 0
	if changed {
		// Idle engines claim at once: a resumed queue's backlog runs, and
		// a paused one's claims tell them to start none of its rows they
		// hold (store.ClaimResult.Paused).
		s.wakeAfterCommit([]string{q})
	}
	return changed, nil
}

// PausedQueues returns the paused queues (see store.Store).
func (s *Store) PausedQueues(ctx context.Context) ([]store.QueuePause, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, s.q(sqlPausedQueues))
	if err != nil {
		return nil, fmt.Errorf("paused queues: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.QueuePause, error) {
		var p store.QueuePause
		err := row.Scan(&p.Queue, &p.PausedAt)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("paused queues: %w", err)
	}
	slices.SortFunc(out, func(a, b store.QueuePause) int { return strings.Compare(a.Queue, b.Queue) }) // byte order, whatever the database's collation
	return out, nil
}
