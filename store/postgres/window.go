package postgres

import (
	"sync"

	"github.com/godurable/godurable/internal/admission"
)

// windows remembers, per queue, how many keyed rows the last claim of this
// store had to pass over: rows of its window that were not admitted
// (blocked, rescheduled, or left ready because another transaction held
// their key) before the last row it admitted, or anywhere in the window
// when it admitted fewer rows than its limit. The next claim of the queue
// reads that many keyed rows beyond its limit (see Claim): every row of the
// window is locked, a write, so a window far larger than what the claim can
// admit costs a write per row for nothing, while one too small admits fewer
// rows than it could. The first claim of a queue reads twice its limit.
type windows struct {
	mu    sync.Mutex
	extra map[string]int
}

// size is the keyed window of a claim of limit rows in queue: limit plus
// what the last claim passed over (at most limit more), within
// [minWindow, max(limit, maxWindow)].
func (w *windows) size(queue string, limit int) int {
	w.mu.Lock()
	extra, ok := w.extra[queue]
	w.mu.Unlock()
	if !ok {
		extra = limit
	}
	return min(max(limit+min(extra, limit), minWindow), max(limit, maxWindow))
}

// record notes what a claim of limit rows passed over in its window, and
// returns it (store.ClaimResult.PassedOver). admitted is in window order
// (admission.Decide walks the window once), so the two are walked together.
func (w *windows) record(queue string, limit int, window []admission.Candidate, admitted []admission.Admitted) int {
	passed, last := 0, 0 // keyed rows not admitted: in all, and before the last admitted row
	next := 0            // the next admitted row to meet in the window
	for _, c := range window {
		switch {
		case next < len(admitted) && admitted[next].ID == c.ID:
			next++
			last = passed
		case c.Key != "":
			passed++
		}
	}
	if len(admitted) >= limit {
		passed = last
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.extra == nil {
		w.extra = map[string]int{}
	}
	w.extra[queue] = passed
	return passed
}
