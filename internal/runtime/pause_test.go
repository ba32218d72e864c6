package runtime

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
)

// pauseStore answers PausedQueues with queue "q" paused or not, or with
// an error, and counts the reads.
type pauseStore struct {
	store.Store
	paused, failing atomic.Bool
	reads           atomic.Int64
}

func (p *pauseStore) PausedQueues(context.Context) ([]store.QueuePause, error) {
	p.reads.Add(1)
	if p.failing.Load() {
		return nil, errors.New("connection refused")
	}
	if p.paused.Load() {
		return []store.QueuePause{{Queue: "q", PausedAt: time.Now()}}, nil
	}
	return nil, nil
}

// TestKnowPaused pins what an executor knows of its queue's pause before
// it starts a row (knowPaused): a claim's answer counts from when the
// claim was sent, not from when it returned; an answer half a poll
// interval old is read again, once for all the executors asking at that
// moment; and while the store cannot be read, one read is tried per half
// interval.
func TestKnowPaused(t *testing.T) {
	const poll = 200 * time.Millisecond
	ps := &pauseStore{Store: memory.New(memory.Options{})}
	rt := New(Config{Store: ps, Clock: wallClock{}, WorkerID: "test", Queues: map[string]int{"q": 10},
		PollInterval: poll, Lease: time.Minute}, &testHost{})
	s := newScheduler(rt)
	q := s.queues["q"]

	// A claim sent 150 ms ago, before the pause committed, that answered
	// "not paused" just now: its answer is already too old.
	q.notePaused(false, time.Now().Add(-150*time.Millisecond))
	ps.paused.Store(true)
	s.knowPaused(q)
	require.True(t, q.paused.Load(), "the answer of a claim sent half an interval ago is read again")
	require.EqualValues(t, 1, ps.reads.Load())

	// A fresh answer is not read again, and an older one arriving late
	// does not replace it.
	q.notePaused(false, time.Now().Add(-time.Second))
	s.knowPaused(q)
	require.True(t, q.paused.Load(), "a claim sent before the last read does not overwrite it")
	require.EqualValues(t, 1, ps.reads.Load())

	// Executors asking at once share one read.
	q.pausedRead.Store(time.Now().Add(-poll).UnixNano()) // the last read is an interval old
	ps.paused.Store(false)
	done := make(chan struct{})
	for range 8 {
		go func() { s.knowPaused(q); done <- struct{}{} }()
	}
	for range 8 {
		<-done
	}
	require.False(t, q.paused.Load(), "the resume is read")
	require.EqualValues(t, 2, ps.reads.Load(), "one read for the eight executors")

	// A store that cannot be read: one try per half interval, and what q
	// knew stands.
	q.pausedRead.Store(time.Now().Add(-poll).UnixNano())
	ps.failing.Store(true)
	for range 5 {
		s.knowPaused(q)
	}
	require.EqualValues(t, 3, ps.reads.Load(), "one failed read, then no more within half an interval")
	require.False(t, q.paused.Load())
}
