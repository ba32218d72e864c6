package storetest

import (
	"errors"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

// pauseTests are the rules of a paused queue (PauseQueue, PausedQueues):
// no step of it starts, by a claim, a hand-off or a reservation, while
// everything else goes on and its rows wait.
var pauseTests = []test{
	{"pause/a paused queue is listed, once, and a resume lifts it", func(h *harness) {
		require.Empty(h.t, h.paused())
		h.pauseQueue("mail", true, true, at(0))
		h.pauseQueue("mail", true, false, at(time.Minute)) // paused already: changes nothing
		h.pauseQueue("", true, true, at(2*time.Minute))    // the default queue
		got := h.paused()
		require.Len(h.t, got, 2)
		require.Equal(h.t, store.DefaultQueue, got[0].Queue)
		near(h.t, at(2*time.Minute), got[0].PausedAt, "default")
		require.Equal(h.t, "mail", got[1].Queue)
		near(h.t, at(0), got[1].PausedAt, "a second pause keeps the first one's time")

		h.pauseQueue("mail", false, true, at(3*time.Minute))
		h.pauseQueue("mail", false, false, at(3*time.Minute)) // resumed already
		got = h.paused()
		require.Len(h.t, got, 1)
		require.Equal(h.t, store.DefaultQueue, got[0].Queue)

		_, err := h.s.PauseQueue(h.ctx, "bad\x00", true, at(0))
		require.True(h.t, errors.Is(err, store.ErrInvalid), "got %v", err)
		require.Len(h.t, h.paused(), 1)
	}},
	{"pause/no claim takes a row of a paused queue; other queues run, and a resume makes its rows claimable in order", func(h *harness) {
		ids := h.insert(inst(""), inst("acct:1"), inst(""))
		other := inst("")
		other.Queue = "other"
		h.insert(other)
		require.False(h.t, h.claimReq(store.ClaimRequest{Queue: "idle", Worker: "w", Limit: 1, Now: at(0)}).Paused)
		h.pauseQueue(queue, true, true, at(0))
		res := h.claimReq(store.ClaimRequest{Worker: "w", Limit: 10, Now: at(time.Second)})
		require.Empty(h.t, res.Claimed, "paused")
		require.True(h.t, res.Paused, "the claim says why")
		h.requireStatus(store.StatusReady, ids...)
		res = h.claimReq(store.ClaimRequest{Queue: "other", Worker: "w", Limit: 10, Now: at(time.Second)})
		require.Equal(h.t, []string{other.ID}, claimedIDs(res.Claimed), "a pause is per queue")
		require.False(h.t, res.Paused)
		h.pauseQueue("idle", true, true, at(time.Second))
		require.True(h.t, h.claimReq(store.ClaimRequest{Queue: "idle", Worker: "w", Limit: 1, Now: at(time.Second)}).Paused,
			"a paused queue without rows says so too")

		h.pauseQueue(queue, false, true, at(2*time.Second))
		res = h.claimReq(store.ClaimRequest{Worker: "w", Limit: 10, Now: at(3 * time.Second)})
		require.Equal(h.t, ids, claimedIDs(res.Claimed))
		require.False(h.t, res.Paused)
	}},
	{"pause/a paused queue's timers and signals make its rows ready, and they wait", func(h *harness) {
		sleeper := inst("")
		sleeper.RunAt = at(time.Minute)
		ids := h.insert(inst(""), inst(""), sleeper)
		cs := h.claim("w", 2, at(0))
		require.Equal(h.t, ids[:2], claimedIDs(cs))
		c1 := cs[0]
		timed := await(cs[1], "never", "late")
		timed.TimeoutAt = at(30 * time.Second)
		h.commit("w", at(time.Second), await(c1, "go", "after"), timed)
		h.pauseQueue(queue, true, true, at(2*time.Second))

		h.signal(ids[0], "go", `{}`, at(3*time.Second))
		n, err := h.s.FireTimers(h.ctx, at(time.Hour))
		require.NoError(h.t, err)
		require.Equal(h.t, 1, n, "the await's timeout fires")
		require.Empty(h.t, h.claim("w", 10, at(time.Hour)), "paused: the woken rows and the due sleeper wait")
		h.requireStatus(store.StatusReady, ids...)
		hl := h.health(at(time.Hour))
		require.Equal(h.t, int64(3), h.queueHealth(hl, queue).Ready, "health counts the rows waiting for the resume")
		pq := store.PausedQueues(hl.Queues, h.paused())
		require.Len(h.t, pq, 1)
		require.Equal(h.t, queue, pq[0].Queue)
		require.Equal(h.t, int64(3), pq[0].Ready)

		h.pauseQueue(queue, false, true, at(time.Hour))
		cs = h.claim("w", 10, at(time.Hour+time.Second))
		require.ElementsMatch(h.t, ids, claimedIDs(cs))
		for _, c := range cs {
			switch c.ID {
			case ids[0]:
				require.NotNil(h.t, c.Signal, "the signal that woke it")
				require.Equal(h.t, "after", c.Step)
			case ids[1]:
				require.True(h.t, c.TimedOut)
			}
		}
	}},
	{"pause/a step running when its queue is paused finishes; its slot is handed to no row of the queue", func(h *harness) {
		ids := h.insertKeyed("acct:1", 3)
		c := h.claimOne("w", at(time.Second))
		require.Equal(h.t, ids[0], c.ID)
		require.Empty(h.t, h.claim("w", 10, at(time.Second)))
		h.requireStatus(store.StatusBlocked, ids[1], ids[2])
		h.pauseQueue(queue, true, true, at(2*time.Second))

		o := contended([]store.Outcome{done(c)})[0]
		o.Ahead = 2
		res, running, reserved := h.completeHandOff(at(3*time.Second), store.HandOff{Room: map[string]int{queue: 5}, Reserve: true}, o)
		require.False(h.t, res[0].Stale, "the running step's outcome commits")
		require.Empty(h.t, running, "no hand-off into a paused queue")
		require.Empty(h.t, reserved, "no reservation either")
		h.requireStatus(store.StatusDone, ids[0])
		h.requireStatus(store.StatusReady, ids[1]) // the freed slot promotes the next row, which waits
		require.Empty(h.t, h.claim("w", 10, at(4*time.Second)))

		h.pauseQueue(queue, false, true, at(5*time.Second))
		require.Equal(h.t, ids[1], h.claimOne("w", at(6*time.Second)).ID)
	}},
	{"pause/a successor chain running when its queue is paused yields at its next flush", func(h *harness) {
		first, reserved, ids := h.chainStart("acct:1", 4, 1)
		require.Len(h.t, reserved, 1)
		h.pauseQueue(queue, true, true, at(3*time.Second))
		o := successor(done(first), reserved[0])
		o.Ahead = 2
		res, running, more := h.completeHandOff(at(4*time.Second), store.HandOff{Room: map[string]int{queue: 1}, Reserve: true}, o)
		require.False(h.t, res[0].Stale)
		require.Equal(h.t, []string{reserved[0].ID}, claimedIDs(running), "the successor may be running already: it takes the slot")
		require.True(h.t, res[0].Yield, "the chain stops: the worker gives back what it has not started")
		require.Empty(h.t, more, "nothing more is reserved")
		h.requireStatus(store.StatusBlocked, ids[2], ids[3])

		h.commit("w", at(5*time.Second), done(running[0]))
		require.Empty(h.t, h.claim("w", 10, at(6*time.Second)), "paused")
		h.pauseQueue(queue, false, true, at(7*time.Second))
		require.Equal(h.t, ids[2], h.claimOne("w", at(8*time.Second)).ID)
	}},
}

// pauseQueue pauses (or resumes) queue q at now and requires that it
// changed (or not) as want says.
func (h *harness) pauseQueue(q string, paused, changed bool, now time.Time) {
	h.t.Helper()
	got, err := h.s.PauseQueue(h.ctx, q, paused, now)
	require.NoError(h.t, err)
	require.Equal(h.t, changed, got, "pause %q %v: changed", q, paused)
}

// paused is PausedQueues.
func (h *harness) paused() []store.QueuePause {
	h.t.Helper()
	got, err := h.s.PausedQueues(h.ctx)
	require.NoError(h.t, err)
	return got
}
