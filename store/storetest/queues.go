package storetest

import (
	"errors"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// queueTests are the rules of the record of which queues engines work
// (MarkQueuesWorked, WorkedQueues), which lets Health name a queue nobody
// works.
var queueTests = []test{
	{"queues/a store nobody marked reports no worked queue", func(h *harness) {
		got, err := h.s.WorkedQueues(h.ctx, base)
		require.NoError(h.t, err)
		require.Empty(h.t, got)
	}},
	{"queues/a mark records each queue once, sorted, aged from now", func(h *harness) {
		require.NoError(h.t, h.s.MarkQueuesWorked(h.ctx, []string{"mail", "default", "mail"}, at(0)))
		got := h.worked(at(5 * time.Second))
		require.Len(h.t, got, 2)
		require.Equal(h.t, []string{"default", "mail"}, []string{got[0].Queue, got[1].Queue})
		for _, w := range got {
			near(h.t, at(0), w.LastWorked, w.Queue)
			require.Equal(h.t, 5*time.Second, w.Since, w.Queue)
		}
	}},
	{"queues/a later mark moves a queue's time, an earlier one never does", func(h *harness) {
		require.NoError(h.t, h.s.MarkQueuesWorked(h.ctx, []string{"a", "b"}, at(0)))
		require.NoError(h.t, h.s.MarkQueuesWorked(h.ctx, []string{"b"}, at(time.Minute)))
		// Another engine whose time lags: it works the queues too, but
		// cannot make them look idle for longer than they are.
		require.NoError(h.t, h.s.MarkQueuesWorked(h.ctx, []string{"a", "b"}, at(-time.Hour)))
		got := h.worked(at(2 * time.Minute))
		require.Len(h.t, got, 2)
		near(h.t, at(0), got[0].LastWorked, "a")
		require.Equal(h.t, 2*time.Minute, got[0].Since)
		near(h.t, at(time.Minute), got[1].LastWorked, "b")
		require.Equal(h.t, time.Minute, got[1].Since)
	}},
	{"queues/a mark in the future of now reads as just worked", func(h *harness) {
		require.NoError(h.t, h.s.MarkQueuesWorked(h.ctx, []string{"a"}, at(time.Minute)))
		got := h.worked(at(0))
		require.Len(h.t, got, 1)
		require.Zero(h.t, got[0].Since)
	}},
	{"queues/an empty name is the default queue, a NUL byte is invalid", func(h *harness) {
		require.NoError(h.t, h.s.MarkQueuesWorked(h.ctx, []string{""}, at(0)))
		got := h.worked(at(0))
		require.Len(h.t, got, 1)
		require.Equal(h.t, store.DefaultQueue, got[0].Queue)
		err := h.s.MarkQueuesWorked(h.ctx, []string{"ok", "bad\x00"}, at(0))
		require.True(h.t, errors.Is(err, store.ErrInvalid), "got %v", err)
		require.Len(h.t, h.worked(at(0)), 1, "nothing of a refused mark is recorded")
	}},
	{"queues/a zero time is the store's clock", func(h *harness) {
		require.NoError(h.t, h.s.MarkQueuesWorked(h.ctx, []string{"a"}, time.Time{}))
		got := h.worked(time.Time{})
		require.Len(h.t, got, 1)
		require.WithinDuration(h.t, time.Now(), got[0].LastWorked, time.Minute)
		require.Less(h.t, got[0].Since, time.Minute)
	}},
	{"queues/health's waiting queues without a recent mark are the unworked ones", func(h *harness) {
		ni := inst("")
		ni.Queue = "mail"
		h.insert(ni, inst(""))
		require.NoError(h.t, h.s.MarkQueuesWorked(h.ctx, []string{queue}, at(0)))
		now := at(time.Minute)
		hl, err := h.s.Health(h.ctx, now)
		require.NoError(h.t, err)
		un := store.UnworkedQueues(hl.Queues, h.worked(now))
		require.Len(h.t, un, 1, "%+v", un)
		require.Equal(h.t, "mail", un[0].Queue)
		require.Equal(h.t, int64(1), un[0].Ready)
		require.Equal(h.t, time.Minute, un[0].OldestReady)
		require.Nil(h.t, un[0].LastWorked, "never marked")

		later := at(time.Minute + store.QueueWorkedWithin + time.Second)
		hl, err = h.s.Health(h.ctx, later)
		require.NoError(h.t, err)
		un = store.UnworkedQueues(hl.Queues, h.worked(later))
		require.Len(h.t, un, 2, "a queue whose last mark is too old is unworked too: %+v", un)
		require.Equal(h.t, queue, un[1].Queue)
		require.NotNil(h.t, un[1].LastWorked)
		near(h.t, at(0), *un[1].LastWorked, "last worked")
	}},
}

// worked is WorkedQueues at now.
func (h *harness) worked(now time.Time) []store.WorkedQueue {
	h.t.Helper()
	got, err := h.s.WorkedQueues(h.ctx, now)
	require.NoError(h.t, err)
	return got
}
