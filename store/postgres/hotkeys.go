package postgres

import (
	"sync"
	"time"
)

// recentKeys remembers, in this process, keys marked within the last
// hotFor. The store keeps two such sets (see Store):
//
// hot holds the keys recently found saturated: keys a claim of this store
// found full (their rows were blocked, or an optimistic claim left them for
// want of room), keys an insert of this store put blocked rows behind (see
// healInserted), and keys whose freed slots a hand-off recently gave to
// waiting rows. Only the slots of such keys are worth the reads of a
// hand-off (see handOff): a key with room has no blocked row to hand its
// slot to, and most keyed outcomes free keys of that kind. It is a hint,
// never a rule: a key wrongly taken for cold frees its slot the usual way
// (credit and promote), and one wrongly taken for hot costs one read that
// finds nothing and cools it. A gate key also cools when a claim that
// locked all its counters admits rows of it and leaves slots free
// (admission.Plan.Roomy), or a hand-off finds a free slot in its counters
// (admission.FreePlan.Roomy): a key filled for a moment stays hot otherwise as
// long as rows wait for it, and a hand-off holds the executor that ran
// each of its steps until its flush hands it a row (make bench's scenario
// 4, a gate of 1,000 over 20,000 rows and 200 executors, fell from about
// 13,000 to 3,000-5,000 steps/s in the runs where its key got hot and
// stayed so; what filled the gate, likely outcomes waiting for a slow
// flush, was inferred, not observed). Claims lock the counters of hot gate
// keys (see optimistic).
//
// The hint is not read from the table because the forms of "is a row of
// this key blocked?" tried in the apply statement were planned, as
// generic plans, to read every waiting row of the key (instances_key_round,
// filtering on status) or every blocked row of the table
// (instances_queue_status): with the EXISTS form, make bench's scenario 4
// (20,000 waiting rows of one key) fell from about 15,000 to 1,228
// steps/s.
//
// settled holds the gate keys whose counters a claim that locked them all
// recently found as their limit makes them (see optimistic).
type recentKeys struct {
	mu   sync.Mutex
	seen map[string]time.Time // key -> last marked (monotonic clock)
}

const (
	// hotFor is how long a key stays in a set after it was last marked.
	hotFor = 10 * time.Second
	// hotMax bounds the keys remembered; past it, the stale ones are
	// dropped, and if none is stale, the map starts over.
	hotMax = 50_000
)

// mark records keys as seen now.
func (h *recentKeys) mark(keys ...string) {
	if len(keys) == 0 {
		return
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen == nil {
		h.seen = map[string]time.Time{}
	}
	if len(h.seen)+len(keys) > hotMax {
		for k, at := range h.seen {
			if now.Sub(at) > hotFor {
				delete(h.seen, k)
			}
		}
		if len(h.seen)+len(keys) > hotMax {
			clear(h.seen)
		}
	}
	for _, k := range keys {
		h.seen[k] = now
	}
}

// cool forgets keys (hot: a hand-off found nothing waiting for them).
func (h *recentKeys) cool(keys ...string) {
	if len(keys) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		delete(h.seen, k)
	}
}

// has reports whether key was marked within hotFor and not forgotten since.
func (h *recentKeys) has(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.seen[key]
	return ok && time.Since(at) <= hotFor
}
