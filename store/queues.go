package store

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// QueueWorkedWithin is how recently an engine must have recorded working a
// queue (Store.MarkQueuesWorked) for the queue to count as worked. Engines
// record their queues every few seconds while they run, so a queue without
// a record this recent has no running engine claiming from it.
const QueueWorkedWithin = time.Minute

// WorkedQueue is the record of engines working one queue.
type WorkedQueue struct {
	Queue string `json:"queue"`
	// LastWorked is the latest time an engine recorded claiming from the
	// queue (on the clock of the store, or the time the engine passed).
	LastWorked time.Time `json:"last_worked"`
	// Since is how long before the WorkedQueues call's now LastWorked was
	// (never negative).
	Since time.Duration `json:"since_ns"`
}

// UnworkedQueue is a queue with rows waiting for a worker that no engine
// has recorded working within QueueWorkedWithin: a queue nobody works. Its
// rows wait until an engine with the queue in its Config.Queues runs.
type UnworkedQueue struct {
	Queue string `json:"queue"`
	// Ready, Scheduled and Blocked are the queue's waiting rows (see
	// QueueHealth).
	Ready     int64 `json:"ready"`
	Scheduled int64 `json:"scheduled"`
	Blocked   int64 `json:"blocked"`
	// OldestReady is how long its oldest ready row has been eligible (see
	// QueueHealth.OldestReady).
	OldestReady time.Duration `json:"oldest_ready_ns"`
	// LastWorked is when an engine last recorded working the queue (nil:
	// never, as far as the store knows).
	LastWorked *time.Time `json:"last_worked"`
}

// UnworkedQueues returns the queues of qs with rows waiting for a worker
// (ready, scheduled or blocked) that worked does not show as worked within
// QueueWorkedWithin, sorted by queue. Rows parked on a signal, a timer or
// children do not make a queue unworked: they wait for something else.
func UnworkedQueues(qs []QueueHealth, worked []WorkedQueue) []UnworkedQueue {
	byQueue := make(map[string]WorkedQueue, len(worked))
	for _, w := range worked {
		byQueue[w.Queue] = w
	}
	out := []UnworkedQueue{}
	for _, q := range qs {
		if q.Ready+q.Scheduled+q.Blocked == 0 {
			continue
		}
		w, ok := byQueue[q.Queue]
		if ok && w.Since <= QueueWorkedWithin {
			continue
		}
		u := UnworkedQueue{Queue: q.Queue, Ready: q.Ready, Scheduled: q.Scheduled, Blocked: q.Blocked, OldestReady: q.OldestReady}
		if ok {
			last := w.LastWorked
			u.LastWorked = &last
		}
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b UnworkedQueue) int { return strings.Compare(a.Queue, b.Queue) })
	return out
}

// NormalizeQueueMarks checks the queue names of a MarkQueuesWorked call and
// returns them sorted and without duplicates, the order in which a backend
// writes them, so that concurrent marks of the same queues cannot
// deadlock. An empty name is DefaultQueue, as in a claim; a name with a NUL
// byte, which no store keeps, is ErrInvalid.
func NormalizeQueueMarks(queues []string) ([]string, error) {
	out := slices.Clone(queues)
	for i, q := range out {
		if q == "" {
			out[i] = DefaultQueue
		}
		if strings.ContainsRune(q, 0) {
			return nil, fmt.Errorf("%w: mark queues worked: queue name %q has a NUL byte", ErrInvalid, q)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// QueuePause is a paused queue (Store.PauseQueue).
type QueuePause struct {
	Queue string `json:"queue"`
	// PausedAt is when the queue was paused (the pause call's now).
	PausedAt time.Time `json:"paused_at"`
}

// PausedQueue is a paused queue with the rows that wait for its resume.
type PausedQueue struct {
	Queue    string    `json:"queue"`
	PausedAt time.Time `json:"paused_at"`
	// Ready, Scheduled and Blocked are the queue's waiting rows, and
	// Executing the steps that were running when it was paused and have
	// not ended yet (see QueueHealth).
	Ready     int64 `json:"ready"`
	Scheduled int64 `json:"scheduled"`
	Blocked   int64 `json:"blocked"`
	Executing int64 `json:"executing"`
	// OldestReady is how long its oldest ready row has been eligible.
	OldestReady time.Duration `json:"oldest_ready_ns"`
}

// PausedQueues returns every queue of paused with its waiting rows from
// qs (none when qs does not list it), sorted by queue.
func PausedQueues(qs []QueueHealth, paused []QueuePause) []PausedQueue {
	byQueue := make(map[string]QueueHealth, len(qs))
	for _, q := range qs {
		byQueue[q.Queue] = q
	}
	out := make([]PausedQueue, 0, len(paused))
	for _, p := range paused {
		q := byQueue[p.Queue]
		out = append(out, PausedQueue{Queue: p.Queue, PausedAt: p.PausedAt, Ready: q.Ready, Scheduled: q.Scheduled,
			Blocked: q.Blocked, Executing: q.Executing, OldestReady: q.OldestReady})
	}
	slices.SortFunc(out, func(a, b PausedQueue) int { return strings.Compare(a.Queue, b.Queue) })
	return out
}

// NormalizeQueueName checks the queue name of a PauseQueue call and
// returns it: an empty name is DefaultQueue, as in a claim; a name with a
// NUL byte, which no store keeps, is ErrInvalid.
func NormalizeQueueName(queue string) (string, error) {
	if queue == "" {
		return DefaultQueue, nil
	}
	if strings.ContainsRune(queue, 0) {
		return "", fmt.Errorf("%w: pause queue: queue name %q has a NUL byte", ErrInvalid, queue)
	}
	return queue, nil
}
