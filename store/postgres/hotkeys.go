package postgres

import (
	"sync"
	"time"
)

// hotKeys remembers, in this process, the keys recently found saturated:
// keys a claim of this store found full (their rows were blocked), keys an
// insert of this store put blocked rows behind (see healInserted), and keys
// whose freed slots a hand-off recently gave to waiting rows. Only the
// slots of such keys are worth the reads of a hand-off (see handOff): a
// key with room has no blocked row to hand its slot to, and most keyed
// outcomes free keys of that kind. It is a hint, never a rule: a key
// wrongly taken for cold frees its slot the usual way (credit and
// promote), and one wrongly taken for hot costs one read that finds
// nothing and cools it.
//
// The hint is not read from the table because the forms of "is a row of
// this key blocked?" tried in the apply statement were planned, as
// generic plans, to read every waiting row of the key (instances_key_round,
// filtering on status) or every blocked row of the table
// (instances_queue_status): with the EXISTS form, make bench's scenario 4
// (20,000 waiting rows of one key) fell from about 15,000 to 1,228
// steps/s.
type hotKeys struct {
	mu   sync.Mutex
	seen map[string]time.Time // key -> last found saturated (monotonic clock)
}

const (
	// hotFor is how long a key stays hot after it was last found saturated.
	hotFor = 10 * time.Second
	// hotMax bounds the keys remembered; past it, the stale ones are
	// dropped, and if none is stale, the map starts over.
	hotMax = 50_000
)

// mark records keys as found saturated now.
func (h *hotKeys) mark(keys ...string) {
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

// cool forgets keys: a hand-off found nothing waiting for them.
func (h *hotKeys) cool(keys ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		delete(h.seen, k)
	}
}

// hot reports whether key was found saturated within hotFor.
func (h *hotKeys) hot(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.seen[key]
	return ok && time.Since(at) <= hotFor
}
