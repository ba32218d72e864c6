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
