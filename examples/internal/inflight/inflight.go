// Package inflight measures, in process, how many step bodies run at once
// per concurrency key. The examples wrap every step body with Enter so that
// what they print is measured, not asserted: if the engine ever admitted two
// steps of a K = 1 key at once, the recorder would see 2.
package inflight

import (
	"sort"
	"sync"
)

// NoKey is the name under which steps that run without a concurrency key
// are recorded.
const NoKey = "(no key)"

// Recorder counts running step bodies per key and remembers the most that
// ever ran at once. It is safe for concurrent use. The zero value is ready.
type Recorder struct {
	mu      sync.Mutex
	running map[string]int
	max     map[string]int
	entered map[string]int
	steps   map[string]int
	total   int
	peak    int
}

// Enter records that a step body named step started under key ("" for no
// key) and returns the function that records its end. Call it as
// defer rec.Enter(ctx.Key(), ctx.Step())().
func (r *Recorder) Enter(key, step string) (leave func()) {
	if key == "" {
		key = NoKey
	}
	r.mu.Lock()
	if r.running == nil {
		r.running, r.max, r.entered, r.steps = map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	}
	r.running[key]++
	r.entered[key]++
	r.steps[step]++
	r.max[key] = max(r.max[key], r.running[key])
	r.total++
	r.peak = max(r.peak, r.total)
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			r.running[key]--
			r.total--
			r.mu.Unlock()
		})
	}
}

// Max is the most step bodies that ever ran at once under key.
func (r *Recorder) Max(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.max[key]
}

// Entered is how many step bodies ran under key in all.
func (r *Recorder) Entered(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.entered[key]
}

// Steps is how many times the step named step ran in all, under any key.
func (r *Recorder) Steps(step string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.steps[step]
}

// TotalSteps is how many step bodies ran in all.
func (r *Recorder) TotalSteps() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.steps {
		n += c
	}
	return n
}

// Peak is the most step bodies that ever ran at once over all keys.
func (r *Recorder) Peak() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.peak
}

// Keys returns every key seen, sorted, with NoKey last.
func (r *Recorder) Keys() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.max))
	for k := range r.max {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if (out[i] == NoKey) != (out[j] == NoKey) {
			return out[j] == NoKey
		}
		return out[i] < out[j]
	})
	return out
}
