package main

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/godurable/godurable/gate"
)

// recorder is what the benchmark's step bodies write to, in memory: when
// each counted instance was inserted and when its first step started, how
// many counted instances finished their last step, and how many steps of
// each key ran at once. It belongs to the harness, not to the SDK.
type recorder struct {
	base     time.Time
	insertAt []atomic.Int64 // ns since base; 0: not recorded
	startAt  []atomic.Int64 // ns since base of the first step start; 0: not started
	finished atomic.Int64
	steps    atomic.Int64
	running  atomic.Int32   // step bodies of the "work" workflow running now
	cur      []atomic.Int32 // per key index: steps running now
	max      []atomic.Int32 // per key index: most steps seen running at once
	// byKey counts the steps of rows of several keys under each key they
	// hold (key string -> *keyCount); rows of one key use cur and max.
	byKey sync.Map
}

// keyCount is one key's steps running now and the most seen at once.
type keyCount struct{ cur, max atomic.Int32 }

func newRecorder(n, keys int) *recorder {
	return &recorder{base: time.Now(), insertAt: make([]atomic.Int64, n), startAt: make([]atomic.Int64, n),
		cur: make([]atomic.Int32, keys), max: make([]atomic.Int32, keys)}
}

func (r *recorder) since() int64 { return int64(time.Since(r.base)) + 1 }

// inserted records the insert time of instances [from, to).
func (r *recorder) inserted(from, to int, at time.Time) {
	ns := int64(at.Sub(r.base)) + 1
	for i := from; i < to && i < len(r.insertAt); i++ {
		r.insertAt[i].Store(ns)
	}
}

// started records the first start of instance i (later starts are retries
// or later steps and do not count).
func (r *recorder) started(i int) {
	r.steps.Add(1)
	if i >= 0 && i < len(r.startAt) {
		r.startAt[i].CompareAndSwap(0, r.since())
	}
}

// enter and leave bracket the body of a keyed step.
func (r *recorder) enter(k int) {
	if k < 0 || k >= len(r.cur) {
		return
	}
	n := r.cur[k].Add(1)
	for {
		m := r.max[k].Load()
		if n <= m || r.max[k].CompareAndSwap(m, n) {
			return
		}
	}
}

func (r *recorder) leave(k int) {
	if k >= 0 && k < len(r.cur) {
		r.cur[k].Add(-1)
	}
}

// enterKeys and leaveKeys bracket the body of a step of several keys:
// keys are every key it holds (steps.Context.Keys).
func (r *recorder) enterKeys(keys []string) {
	for _, k := range keys {
		v, ok := r.byKey.Load(k)
		if !ok {
			v, _ = r.byKey.LoadOrStore(k, new(keyCount))
		}
		c := v.(*keyCount)
		n := c.cur.Add(1)
		for {
			m := c.max.Load()
			if n <= m || c.max.CompareAndSwap(m, n) {
				break
			}
		}
	}
}

func (r *recorder) leaveKeys(keys []string) {
	for _, k := range keys {
		if v, ok := r.byKey.Load(k); ok {
			v.(*keyCount).cur.Add(-1)
		}
	}
}

// maxPerName is, per key name, the most steps one key of that name ran
// at once, counted by enterKeys.
func (r *recorder) maxPerName() map[string]int {
	out := map[string]int{}
	r.byKey.Range(func(k, v any) bool {
		name := gate.NameOf(k.(string))
		out[name] = max(out[name], int(v.(*keyCount).max.Load()))
		return true
	})
	return out
}

// maxPerKey is the most steps any one key ran at once.
func (r *recorder) maxPerKey() int {
	m := int32(0)
	for i := range r.max {
		m = max(m, r.max[i].Load())
	}
	return int(m)
}

// latencies returns start − max(insert, floor) of every started instance
// among [0, n), sorted. floor is the time the engines started (burn-down: the
// rows were inserted before, and the wait before the engines ran is not the
// engine's); zero for none.
func (r *recorder) latencies(n int, floor time.Time) []time.Duration {
	fl := int64(0)
	if !floor.IsZero() {
		fl = int64(floor.Sub(r.base)) + 1
	}
	out := make([]time.Duration, 0, n)
	for i := 0; i < n && i < len(r.startAt); i++ {
		s, in := r.startAt[i].Load(), r.insertAt[i].Load()
		if s == 0 || in == 0 {
			continue
		}
		out = append(out, time.Duration(s-max(in, fl)))
	}
	slices.Sort(out)
	return out
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

// timelineEvery is how often a timeline samples the steps running.
const timelineEvery = 5 * time.Millisecond

// sampleRunning records r.running every timelineEvery until stop is
// closed, and then sends what it recorded.
func (r *recorder) sampleRunning(stop <-chan struct{}, out chan<- []int32) {
	var samples []int32
	t := time.NewTicker(timelineEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			out <- samples
			return
		case <-t.C:
			samples = append(samples, r.running.Load())
		}
	}
}

// timeline averages samples taken every timelineEvery over intervals of
// every (at least one sample each), rounded to whole steps.
func timeline(samples []int32, every time.Duration) []int {
	per := max(1, int(every/timelineEvery))
	var out []int
	for i := 0; i < len(samples); i += per {
		j := min(i+per, len(samples))
		sum := 0
		for _, v := range samples[i:j] {
			sum += int(v)
		}
		out = append(out, (2*sum+(j-i))/(2*(j-i)))
	}
	return out
}
