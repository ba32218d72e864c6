// Package gate holds concurrency keys and their limits as pure logic: key
// parsing and validation, matching a key to its configured limit by name,
// shard splitting and sizing, and the prefix-capture analysis that warns when
// a limit silently changes the meaning of a key.
//
// A key is "name:id". The name is the text before the first ':'. A key whose
// name has no configured Limit has K = 1 (strict mutual exclusion per key); a
// key whose name has a Limit is a gate of size Limit.Limit per key, unless
// the key has a Limit of its own (a per-key limit, see Limits.For).
package gate

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// MaxKeyLength is the longest key, in bytes, that Parse and New accept.
const MaxKeyLength = 255

// ErrInvalidKey is wrapped by every key validation error.
var ErrInvalidKey = errors.New("invalid concurrency key")

// Intent says what a key is meant to be. It drives the prefix-capture
// warnings; admission itself only looks at the configured limits.
type Intent string

const (
	// Unspecified is a key created without a declared intent (Parse, Key).
	Unspecified Intent = ""
	// IdentityIntent marks a key that names an entity whose steps must never
	// overlap (account, order): it is expected to run at K = 1.
	IdentityIntent Intent = "identity"
	// GateIntent marks a key that caps in-flight work against a resource
	// (stripe, openai): it is expected to have a configured limit.
	GateIntent Intent = "gate"
)

// ConcurrencyKey is a parsed, validated concurrency key. The zero value is
// "no key": it never serializes anything. Key, Identity and Gate return an
// invalid key, not a panic, for a bad name or id (an id is often user
// data): its Err says why, and the engine refuses it where it is used (an
// insert, a transition, a schedule) with an error that wraps
// ErrInvalidKey.
type ConcurrencyKey struct {
	name   string
	id     string
	intent Intent
	err    error
}

// Key returns the key name:id with no declared intent. For an invalid name
// or id it returns an invalid key (see Err); New returns the error at once.
func Key(name, id string) ConcurrencyKey { return orInvalid(New(name, id, Unspecified)) }

// Identity returns the key name:id declared as an identity (K = 1
// expected), or an invalid key (see Err).
func Identity(name, id string) ConcurrencyKey { return orInvalid(New(name, id, IdentityIntent)) }

// Gate returns the key name:id declared as a gate (a configured limit
// expected), or an invalid key (see Err).
func Gate(name, id string) ConcurrencyKey { return orInvalid(New(name, id, GateIntent)) }

func orInvalid(k ConcurrencyKey, err error) ConcurrencyKey {
	if err != nil {
		return ConcurrencyKey{err: err}
	}
	return k
}

// Err is nil for a valid key and for the zero key; for a key that Key,
// Identity or Gate could not make, it is the reason, wrapping
// ErrInvalidKey.
func (k ConcurrencyKey) Err() error { return k.err }

// New validates name and id and returns the key. The name must be non-empty
// and contain no ':'; the id must be non-empty; neither may contain control
// characters or invalid UTF-8, and the whole key is at most MaxKeyLength bytes.
func New(name, id string, intent Intent) (ConcurrencyKey, error) {
	if err := ValidateName(name); err != nil {
		return ConcurrencyKey{}, err
	}
	if id == "" {
		return ConcurrencyKey{}, fmt.Errorf("%w: empty id for name %q", ErrInvalidKey, name)
	}
	if err := checkText(id); err != nil {
		return ConcurrencyKey{}, fmt.Errorf("%w: id: %v", ErrInvalidKey, err)
	}
	if len(name)+1+len(id) > MaxKeyLength {
		return ConcurrencyKey{}, fmt.Errorf("%w: longer than %d bytes", ErrInvalidKey, MaxKeyLength)
	}
	switch intent {
	case Unspecified, IdentityIntent, GateIntent:
	default:
		return ConcurrencyKey{}, fmt.Errorf("%w: unknown intent %q", ErrInvalidKey, intent)
	}
	return ConcurrencyKey{name: name, id: id, intent: intent}, nil
}

// ValidateName reports whether name can be a key name or a limit name.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalidKey)
	}
	if strings.Contains(name, ":") {
		return fmt.Errorf("%w: name %q contains ':'", ErrInvalidKey, name)
	}
	if err := checkText(name); err != nil {
		return fmt.Errorf("%w: name: %v", ErrInvalidKey, err)
	}
	if len(name) > MaxKeyLength-2 {
		return fmt.Errorf("%w: name longer than %d bytes", ErrInvalidKey, MaxKeyLength-2)
	}
	return nil
}

func checkText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("control character %U", r)
		}
	}
	return nil
}

// Parse parses "name:id" (the id may itself contain ':'). The empty string
// parses to the zero key (no key).
func Parse(s string) (ConcurrencyKey, error) {
	return ParseWithIntent(s, Unspecified)
}

// ParseWithIntent is Parse with a declared intent.
func ParseWithIntent(s string, intent Intent) (ConcurrencyKey, error) {
	if s == "" {
		return ConcurrencyKey{}, nil
	}
	name, id, ok := strings.Cut(s, ":")
	if !ok {
		return ConcurrencyKey{}, fmt.Errorf("%w: %q has no ':' (want name:id)", ErrInvalidKey, truncate(s))
	}
	return New(name, id, intent)
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// IsZero reports whether k is the zero key (no key). An invalid key is
// not zero.
func (k ConcurrencyKey) IsZero() bool { return k.name == "" && k.err == nil }

// Name is the part before the first ':'; limits match on it.
func (k ConcurrencyKey) Name() string { return k.name }

// ID is the part after the first ':'.
func (k ConcurrencyKey) ID() string { return k.id }

// Intent is the declared intent of the key.
func (k ConcurrencyKey) Intent() Intent { return k.intent }

// String is "name:id", "" for the zero key, and ":" for an invalid key,
// which no store accepts.
func (k ConcurrencyKey) String() string {
	if k.IsZero() {
		return ""
	}
	return k.name + ":" + k.id
}

// NameOf returns the name part of a key string ("" for "").
func NameOf(key string) string {
	name, _, _ := strings.Cut(key, ":")
	return name
}

// ErrPerKeyWithoutGate is wrapped by the error for a per-key limit whose
// key name has no limit of its own: such a name is K = 1 for every key (its
// keys' exclusion is a unique index, not counters), so one of its keys
// cannot be given a different K. Configure the name's limit first.
var ErrPerKeyWithoutGate = errors.New("per-key limit on a key name without a limit")

// Limit configures a gate: every key named Name may have at most Limit
// instances executing at once. Shards splits each key's slot counter into
// that many rows so that completions do not serialize on one row lock.
//
// A Limit whose Name is a full key ("stripe:acct_big") is a per-key limit:
// it sets K and the shards of that one key, over its name's limit, which
// the other keys of the name keep. It is valid only while its name has a
// limit (see Limits.Validate).
type Limit struct {
	// Name is the key name the limit applies to (the part before ':'), or
	// a full key "name:id" for a per-key limit.
	Name string `json:"name"`
	// Limit is K, the most instances of one key executing at once. At least 1.
	Limit int `json:"limit"`
	// Shards is the number of counter rows per key (default 1). At most Limit.
	Shards int `json:"shards,omitempty"`
}

// Validate checks the limit and fills in defaults (Shards = 1). Name must
// be a valid key name or, for a per-key limit, a valid key.
func (l *Limit) Validate() error {
	if l.PerKey() {
		if _, err := Parse(l.Name); err != nil {
			return fmt.Errorf("limit: %w", err)
		}
	} else if err := ValidateName(l.Name); err != nil {
		return fmt.Errorf("limit: %w", err)
	}
	if l.Limit < 1 {
		return fmt.Errorf("limit %q: limit must be at least 1, got %d", l.Name, l.Limit)
	}
	if l.Shards == 0 {
		l.Shards = 1
	}
	if l.Shards < 1 || l.Shards > l.Limit {
		return fmt.Errorf("limit %q: shards must be between 1 and limit (%d), got %d", l.Name, l.Limit, l.Shards)
	}
	return nil
}

// PerKey reports whether l is a per-key limit: its Name is a full key.
func (l Limit) PerKey() bool { return strings.Contains(l.Name, ":") }

// ShardCapacities splits a limit across its shards: the capacities sum to
// Limit and differ by at most one.
func (l Limit) ShardCapacities() []int {
	shards := l.Shards
	if shards < 1 {
		shards = 1
	}
	out := make([]int, shards)
	for i := range out {
		out[i] = l.Limit / shards
		if i < l.Limit%shards {
			out[i]++
		}
	}
	return out
}

// ShardsFor is the sizing rule for a gate's shards:
// shards ≥ limit × commitLatency / stepDuration, at least 1 and at most limit.
// For example limit 1000, 1 ms commits and 100 ms steps need 10 shards.
func ShardsFor(limit int, commitLatency, stepDuration time.Duration) int {
	if limit < 1 {
		return 1
	}
	if stepDuration <= 0 {
		return limit
	}
	n := int(math.Ceil(float64(limit) * float64(commitLatency) / float64(stepDuration)))
	return max(1, min(n, limit))
}

// Limits is a validated set of limits indexed by name (a key name, or a
// full key for a per-key limit).
type Limits struct {
	byName map[string]Limit
}

// NewLimits validates each of ls and indexes them by name. Duplicate names
// are an error. A per-key limit whose name has no limit in ls is not: a
// namespace may own a key's limit while another owns its name's; the set a
// store keeps must pass Validate.
func NewLimits(ls []Limit) (Limits, error) {
	m := make(map[string]Limit, len(ls))
	for _, l := range ls {
		if err := l.Validate(); err != nil {
			return Limits{}, err
		}
		if _, dup := m[l.Name]; dup {
			return Limits{}, fmt.Errorf("limit %q configured twice", l.Name)
		}
		m[l.Name] = l
	}
	return Limits{byName: m}, nil
}

// Validate reports a per-key limit whose key name has no limit in ls,
// wrapping ErrPerKeyWithoutGate: every set of limits a store keeps passes
// it, so that a K = 1 name stays K = 1 for all its keys.
func (ls Limits) Validate() error {
	for _, l := range ls.All() {
		if !l.PerKey() {
			continue
		}
		if _, ok := ls.byName[NameOf(l.Name)]; !ok {
			return fmt.Errorf("limit %q: %w: add a limit for %q first, or remove this one", l.Name, ErrPerKeyWithoutGate, NameOf(l.Name))
		}
	}
	return nil
}

// Lookup returns the limit stored under exactly name (a key name, or a
// full key for a per-key limit). To find the limit a key runs under, use
// For.
func (ls Limits) Lookup(name string) (Limit, bool) {
	l, ok := ls.byName[name]
	return l, ok
}

// For returns the limit a key runs under: the key's own limit if it has
// one, else its name's, else none (K = 1). This is the one statement of
// the rule; the PostgreSQL store's SQL form is its key-limit lookup (see
// store/postgres/sql.go). A key
// with a limit of its own always has a name limit too (see Validate), so
// whether a key is a gate depends on its name alone. For of a bare key
// name is that name's limit.
func (ls Limits) For(key string) (Limit, bool) {
	if l, ok := ls.byName[key]; ok {
		return l, true
	}
	l, ok := ls.byName[NameOf(key)]
	return l, ok
}

// K returns the concurrency of the key string: its own limit, else its
// name's limit, else 1 (see For).
func (ls Limits) K(key string) int {
	if l, ok := ls.For(key); ok {
		return l.Limit
	}
	return 1
}

// Gates returns the limits of key names, without the per-key ones, sorted
// by name: what health and metrics report per gate (they name key names,
// never a key's id).
func (ls Limits) Gates() []Limit {
	out := ls.All()
	return slices.DeleteFunc(out, Limit.PerKey)
}

// All returns the limits sorted by name.
func (ls Limits) All() []Limit {
	out := make([]Limit, 0, len(ls.byName))
	for _, l := range ls.byName {
		out = append(out, l)
	}
	sortLimits(out)
	return out
}
