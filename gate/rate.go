package gate

import (
	"encoding/json"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"time"
)

// RateLimit is a flow cap on the keys named Name: a token bucket that holds
// at most Burst tokens and refills at Limit tokens per Period. Every step of
// such a key that is admitted takes one token; a step that finds the bucket
// empty waits for a token without taking anything else (no gate slot, no
// queue capacity). A concurrency limit is a stock cap (how many run at
// once); a rate limit caps how many start per period, however long they run.
//
// With PerKey each full key has its own bucket ("stripe:acme" and
// "stripe:globex" are limited separately); otherwise one bucket serves every
// key of the name.
//
// Bucket arithmetic is exact: a bucket holds credit in integer units, one
// token being Period in microseconds of credit, and gains Limit credits per
// elapsed microsecond. Over any window of length T no more than
// Burst + Limit × T / Period steps start.
type RateLimit struct {
	// Name is the key name the limit applies to (the part before ':').
	Name string `json:"name"`
	// Limit is the number of tokens added per Period. At least 1.
	Limit int `json:"limit"`
	// Period is the refill period (default one second). At least one
	// millisecond, a whole number of microseconds.
	Period time.Duration `json:"period"`
	// Burst is the most tokens the bucket holds (default Limit).
	Burst int `json:"burst,omitempty"`
	// PerKey gives every full key its own bucket.
	PerKey bool `json:"per_key,omitempty"`
}

// maxCredit bounds a bucket's capacity so that credit arithmetic never
// overflows an int64 (PostgreSQL bigint).
const maxCredit = 1 << 62

// Validate checks the limit and fills in defaults (Period one second, Burst Limit).
func (r *RateLimit) Validate() error {
	if err := ValidateName(r.Name); err != nil {
		return fmt.Errorf("rate limit: %w", err)
	}
	if r.Limit < 1 || r.Limit > 1<<31-1 {
		return fmt.Errorf("rate limit %q: limit must be between 1 and 2^31-1, got %d", r.Name, r.Limit)
	}
	if r.Period == 0 {
		r.Period = time.Second
	}
	if r.Period < time.Millisecond || r.Period%time.Microsecond != 0 {
		return fmt.Errorf("rate limit %q: period must be at least 1ms and a whole number of microseconds, got %s", r.Name, r.Period)
	}
	if r.Burst == 0 {
		r.Burst = r.Limit
	}
	if r.Burst < 1 {
		return fmt.Errorf("rate limit %q: burst must be at least 1, got %d", r.Name, r.Burst)
	}
	if int64(r.Burst) > maxCredit/r.TokenCredit() {
		return fmt.Errorf("rate limit %q: burst %d × period %s is too large", r.Name, r.Burst, r.Period)
	}
	return nil
}

// String describes the limit, e.g. "10 per 1s, burst 20, per key".
func (r RateLimit) String() string {
	s := fmt.Sprintf("%d per %s, burst %d", r.Limit, r.Period, r.Burst)
	if r.PerKey {
		s += ", per key"
	}
	return s
}

// rateLimitJSON is RateLimit with the period as a duration string.
type rateLimitJSON struct {
	Name   string          `json:"name"`
	Limit  int             `json:"limit"`
	Period json.RawMessage `json:"period,omitempty"`
	Burst  int             `json:"burst,omitempty"`
	PerKey bool            `json:"per_key,omitempty"`
}

// MarshalJSON writes the period as a Go duration string ("1s", "1m0s").
func (r RateLimit) MarshalJSON() ([]byte, error) {
	p, _ := json.Marshal(r.Period.String())
	return json.Marshal(rateLimitJSON{Name: r.Name, Limit: r.Limit, Period: p, Burst: r.Burst, PerKey: r.PerKey})
}

// UnmarshalJSON accepts the period as a duration string ("1s", "500ms") or
// as a number of nanoseconds.
func (r *RateLimit) UnmarshalJSON(b []byte) error {
	var j rateLimitJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*r = RateLimit{Name: j.Name, Limit: j.Limit, Burst: j.Burst, PerKey: j.PerKey}
	if len(j.Period) == 0 || string(j.Period) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(j.Period, &s); err == nil {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("rate limit %q: period: %w", j.Name, err)
		}
		r.Period = d
		return nil
	}
	var ns int64
	if err := json.Unmarshal(j.Period, &ns); err != nil {
		return fmt.Errorf("rate limit %q: period must be a duration string or nanoseconds", j.Name)
	}
	r.Period = time.Duration(ns)
	return nil
}

// TokenCredit is the credit one token costs: the period in microseconds.
func (r RateLimit) TokenCredit() int64 { return int64(r.Period / time.Microsecond) }

// Capacity is the credit of a full bucket: Burst tokens.
func (r RateLimit) Capacity() int64 { return int64(r.Burst) * r.TokenCredit() }

// BucketFor returns the id of the bucket that key draws from: the key
// itself when PerKey, else the name. Names contain no ':' and keys always
// do, so the two kinds of id never collide.
func (r RateLimit) BucketFor(key string) string {
	if r.PerKey {
		return key
	}
	return r.Name
}

// Bucket is the state of one token bucket: Credit (see RateLimit) as of At.
type Bucket struct {
	Credit int64
	At     time.Time
}

// Full is a full bucket at now: what a bucket that does not exist yet holds.
func (r RateLimit) Full(now time.Time) Bucket { return Bucket{Credit: r.Capacity(), At: now} }

// Refill returns b as of now: Limit credits per whole elapsed microsecond,
// up to Capacity. Time never runs backwards for a bucket: a now before b.At
// (engines whose clocks disagree) adds nothing and keeps At. A partial
// microsecond is carried (At advances by whole microseconds), so refilling
// often never loses credit.
func (r RateLimit) Refill(b Bucket, now time.Time) Bucket {
	capacity := r.Capacity()
	if b.Credit > capacity {
		b.Credit = capacity // the limit was lowered
	}
	if !now.After(b.At) {
		return b
	}
	elapsed := int64(now.Sub(b.At) / time.Microsecond)
	if b.Credit >= capacity || elapsed >= (capacity-b.Credit+int64(r.Limit)-1)/int64(r.Limit) {
		return Bucket{Credit: capacity, At: now}
	}
	return Bucket{Credit: b.Credit + elapsed*int64(r.Limit), At: b.At.Add(time.Duration(elapsed) * time.Microsecond)}
}

// Tokens is the number of whole tokens in b.
func (r RateLimit) Tokens(b Bucket) int64 { return b.Credit / r.TokenCredit() }

// IsFull reports whether b, refilled to now, is full: deleting it then
// loses nothing, since a missing bucket starts full.
func (r RateLimit) IsFull(b Bucket, now time.Time) bool {
	return r.Refill(b, now).Credit >= r.Capacity()
}

// Due returns when b (refilled as of b.At) holds n whole tokens if nothing
// else takes any: b.At when it already does.
func (r RateLimit) Due(b Bucket, n int) time.Time {
	need := int64(n)*r.TokenCredit() - b.Credit
	if need <= 0 {
		return b.At
	}
	micros := (need + int64(r.Limit) - 1) / int64(r.Limit)
	return b.At.Add(time.Duration(micros) * time.Microsecond)
}

// RateLimits is a validated set of rate limits indexed by name.
type RateLimits struct {
	byName map[string]RateLimit
}

// NewRateLimits validates rs and indexes them by name. Duplicate names are an error.
func NewRateLimits(rs []RateLimit) (RateLimits, error) {
	m := make(map[string]RateLimit, len(rs))
	for _, r := range rs {
		if err := r.Validate(); err != nil {
			return RateLimits{}, err
		}
		if _, dup := m[r.Name]; dup {
			return RateLimits{}, fmt.Errorf("rate limit %q configured twice", r.Name)
		}
		m[r.Name] = r
	}
	return RateLimits{byName: m}, nil
}

// Lookup returns the rate limit configured for a key name.
func (rs RateLimits) Lookup(name string) (RateLimit, bool) {
	r, ok := rs.byName[name]
	return r, ok
}

// All returns the rate limits sorted by name.
func (rs RateLimits) All() []RateLimit {
	out := make([]RateLimit, 0, len(rs.byName))
	for _, r := range rs.byName {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b RateLimit) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// RateChange is how one key name's rate limit differs between two configurations.
type RateChange struct {
	Name string `json:"name"`
	// Old and New are the limits before and after (valid when OldSet, NewSet).
	Old    RateLimit `json:"old"`
	New    RateLimit `json:"new"`
	OldSet bool      `json:"old_set"`
	NewSet bool      `json:"new_set"`
}

// DiffRates returns, sorted by name, the names whose rate limit was added,
// removed or changed between old and new.
func DiffRates(old, new RateLimits) []RateChange {
	names := map[string]struct{}{}
	for n := range old.byName {
		names[n] = struct{}{}
	}
	for n := range new.byName {
		names[n] = struct{}{}
	}
	var out []RateChange
	for n := range names {
		o, oset := old.Lookup(n)
		w, nset := new.Lookup(n)
		if oset != nset || o != w {
			out = append(out, RateChange{Name: n, Old: o, New: w, OldSet: oset, NewSet: nset})
		}
	}
	slices.SortFunc(out, func(a, b RateChange) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// LiveWarning describes a rate change that affects live instances.
func (c RateChange) LiveWarning(live int64) Warning {
	from, to := "no rate limit", "no rate limit"
	if c.OldSet {
		from = c.Old.String()
	}
	if c.NewSet {
		to = c.New.String()
	}
	return Warning{Kind: LiveKeysChanged, Name: c.Name, Live: live, Message: fmt.Sprintf(
		"rate limit change for key name %q from %s to %s affects %s live instance(s)", c.Name, from, to, LiveCount(live))}
}

// Rescale converts b, a bucket of limit from, into r's credit units keeping
// its number of tokens (fractions rounded down), at most r's capacity: what
// a bucket holds after its name's limit changed.
func (r RateLimit) Rescale(b Bucket, from RateLimit) Bucket {
	if b.Credit <= 0 || from.TokenCredit() <= 0 {
		return Bucket{Credit: max(b.Credit, 0), At: b.At}
	}
	capacity := r.Capacity()
	hi, lo := bits.Mul64(uint64(b.Credit), uint64(r.TokenCredit()))
	if hi >= uint64(from.TokenCredit()) {
		return Bucket{Credit: capacity, At: b.At}
	}
	q, _ := bits.Div64(hi, lo, uint64(from.TokenCredit()))
	if q > uint64(capacity) {
		q = uint64(capacity)
	}
	return Bucket{Credit: int64(q), At: b.At}
}
