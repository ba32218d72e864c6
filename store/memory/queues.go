package memory

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/godurable/godurable/store"
)

// MarkQueuesWorked records that an engine works queues at now (see
// store.Store).
func (s *Store) MarkQueuesWorked(ctx context.Context, queues []string, now time.Time) error {
	qs, err := store.NormalizeQueueMarks(queues)
	if err != nil {
		return err
	}
	if err := s.lock(); err != nil {
		return err
	}
	defer s.unlock(nil)
	now = s.now(now)
	if s.worked == nil {
		s.worked = map[string]time.Time{}
	}
	for _, q := range qs {
		if last, ok := s.worked[q]; !ok || now.After(last) {
			s.worked[q] = now
		}
	}
	return nil
}

// WorkedQueues returns every marked queue (see store.Store).
func (s *Store) WorkedQueues(ctx context.Context, now time.Time) ([]store.WorkedQueue, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.unlock(nil)
	now = s.now(now)
	out := make([]store.WorkedQueue, 0, len(s.worked))
	for q, last := range s.worked {
		out = append(out, store.WorkedQueue{Queue: q, LastWorked: last, Since: max(now.Sub(last), 0)})
	}
	slices.SortFunc(out, func(a, b store.WorkedQueue) int { return strings.Compare(a.Queue, b.Queue) })
	return out, nil
}

// PauseQueue pauses or resumes a queue (see store.Store).
func (s *Store) PauseQueue(ctx context.Context, queue string, paused bool, now time.Time) (bool, error) {
	q, err := store.NormalizeQueueName(queue)
	if err != nil {
		return false, err
	}
	if err := s.lock(); err != nil {
		return false, err
	}
	n := &notes{}
	defer s.unlock(n)
	_, was := s.paused[q]
	switch {
	case paused && !was:
		s.paused[q] = s.now(now)
	case !paused && was:
		delete(s.paused, q)
	default:
		return false, nil
	}
	n.add(q) // engines claim: its rows run again, or they learn of the pause
	return true, nil
}

// PausedQueues returns the paused queues (see store.Store).
func (s *Store) PausedQueues(ctx context.Context) ([]store.QueuePause, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.unlock(nil)
	out := make([]store.QueuePause, 0, len(s.paused))
	for q, at := range s.paused {
		out = append(out, store.QueuePause{Queue: q, PausedAt: at})
	}
	slices.SortFunc(out, func(a, b store.QueuePause) int { return strings.Compare(a.Queue, b.Queue) })
	return out, nil
}

// pausedSet is the paused queues, for a hand-off (admission.FreeState.Paused).
func (s *Store) pausedSet() map[string]bool {
	if len(s.paused) == 0 {
		return nil
	}
	out := make(map[string]bool, len(s.paused))
	for q := range s.paused {
		out[q] = true
	}
	return out
}
