package memory

import "container/heap"

// rowHeap is an indexed binary heap of rows: every row remembers its
// position, so a row can leave the heap (cancel, wake, timeout) in O(log n)
// without a scan. A row is in at most one pick heap (a queue's ready heap of
// one priority, its scheduled heap, or a key's blocked heap) and at most one
// timer heap at a time; timer selects which of the row's two positions this
// heap maintains.
type rowHeap struct {
	rows  []*row
	less  func(a, b *row) bool
	timer bool
	// sched marks a queue's heap of ready rows whose run_at is in the future.
	sched bool
}

func newPickHeap() *rowHeap  { return &rowHeap{less: pickLess} }
func newReadyHeap() *rowHeap { return &rowHeap{less: roundLess} }
func newSchedHeap() *rowHeap { return &rowHeap{less: schedLess, sched: true} }
func newTimerHeap() *rowHeap { return &rowHeap{less: timerLess, timer: true} }

// pickLess is a key's admission order: priority (lower first), then run_at,
// then insertion.
func pickLess(a, b *row) bool {
	if a.inst.Priority != b.inst.Priority {
		return a.inst.Priority < b.inst.Priority
	}
	if !a.inst.RunAt.Equal(b.inst.RunAt) {
		return a.inst.RunAt.Before(b.inst.RunAt)
	}
	return a.seq < b.seq
}

// roundLess is the claim order within one priority of a queue: round (keys
// take turns), then run_at, then insertion.
func roundLess(a, b *row) bool {
	if a.round != b.round {
		return a.round < b.round
	}
	if !a.inst.RunAt.Equal(b.inst.RunAt) {
		return a.inst.RunAt.Before(b.inst.RunAt)
	}
	return a.seq < b.seq
}

// schedLess orders rows waiting for their run time: run_at, then insertion.
func schedLess(a, b *row) bool {
	if !a.inst.RunAt.Equal(b.inst.RunAt) {
		return a.inst.RunAt.Before(b.inst.RunAt)
	}
	return a.seq < b.seq
}

// timerLess orders awaits by timeout, then insertion.
func timerLess(a, b *row) bool {
	if !a.inst.TimeoutAt.Equal(b.inst.TimeoutAt) {
		return a.inst.TimeoutAt.Before(b.inst.TimeoutAt)
	}
	return a.seq < b.seq
}

func (h *rowHeap) Len() int           { return len(h.rows) }
func (h *rowHeap) Less(i, j int) bool { return h.less(h.rows[i], h.rows[j]) }
func (h *rowHeap) Swap(i, j int) {
	h.rows[i], h.rows[j] = h.rows[j], h.rows[i]
	h.setIndex(h.rows[i], i)
	h.setIndex(h.rows[j], j)
}

func (h *rowHeap) setIndex(r *row, i int) {
	if h.timer {
		r.timerIdx = i
	} else {
		r.pickIdx = i
	}
}

// Push and Pop implement heap.Interface; use add, remove and popMin.
func (h *rowHeap) Push(x any) {
	r := x.(*row)
	h.setIndex(r, len(h.rows))
	h.rows = append(h.rows, r)
}

func (h *rowHeap) Pop() any {
	n := len(h.rows) - 1
	r := h.rows[n]
	h.rows[n] = nil
	h.rows = h.rows[:n]
	h.setIndex(r, -1)
	return r
}

func (h *rowHeap) add(r *row) {
	if h.timer {
		r.timerHeap = h
	} else {
		r.pickHeap = h
	}
	heap.Push(h, r)
}

func (h *rowHeap) min() *row {
	if len(h.rows) == 0 {
		return nil
	}
	return h.rows[0]
}

func (h *rowHeap) popMin() *row {
	r := heap.Pop(h).(*row)
	h.detach(r)
	return r
}

func (h *rowHeap) remove(r *row) {
	if h.timer {
		heap.Remove(h, r.timerIdx)
	} else {
		heap.Remove(h, r.pickIdx)
	}
	h.detach(r)
}

func (h *rowHeap) detach(r *row) {
	if h.timer {
		r.timerHeap, r.timerIdx = nil, -1
	} else {
		r.pickHeap, r.pickIdx = nil, -1
	}
}
