package gate

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ErrPrefixCapture is wrapped by the errors strict mode returns for a
// prefix-capture warning.
var ErrPrefixCapture = errors.New("concurrency key prefix capture")

// WarningKind names one kind of prefix-capture warning.
type WarningKind string

const (
	// IdentityCaptured: a key declared as an identity has a name with a
	// configured limit, so its instances may run K at a time, not one.
	IdentityCaptured WarningKind = "identity_captured"
	// GateWithoutLimit: a key declared as a gate has no configured limit for
	// its name, so it silently runs at K = 1.
	GateWithoutLimit WarningKind = "gate_without_limit"
	// LiveKeysChanged: a configuration change alters the K of keys that live
	// (non-terminal) instances hold.
	LiveKeysChanged WarningKind = "live_keys_changed"
)

// Warning is one prefix-capture finding. It names the key name, never a key's id.
type Warning struct {
	Kind    WarningKind `json:"kind"`
	Name    string      `json:"name"`
	Message string      `json:"message"`
	// Live is the number of live instances affected (LiveKeysChanged
	// only), counted up to LiveCountCap: a count of LiveCountCap means at
	// least that many.
	Live int64 `json:"live,omitempty"`
}

// LiveCountCap is how far a limit change counts the live instances of each
// name or key it changes (Warning.Live, store.LimitsResult.Live). The count
// reads the instances one by one, and a busy name has millions: it stops
// here, so that a change (and an engine's Start that makes one) does not
// wait for them all.
const LiveCountCap = 10_000

// LiveCount is n, a count of live instances up to LiveCountCap, as the
// warnings print it: "at least 10000" when it reached the cap.
func LiveCount(n int64) string {
	if n >= LiveCountCap {
		return fmt.Sprintf("at least %d", int64(LiveCountCap))
	}
	return strconv.FormatInt(n, 10)
}

// Error turns the warning into an error wrapping ErrPrefixCapture.
func (w Warning) Error() error { return fmt.Errorf("%w: %s", ErrPrefixCapture, w.Message) }

// Check returns the warning for key under limits, if any.
func (ls Limits) Check(k ConcurrencyKey) (Warning, bool) {
	if k.IsZero() {
		return Warning{}, false
	}
	l, limited := ls.Lookup(k.Name())
	switch {
	case k.Intent() == IdentityIntent && limited:
		return Warning{Kind: IdentityCaptured, Name: k.Name(), Message: fmt.Sprintf(
			"key name %q is declared as an identity but a limit of %d captures it: its instances may overlap %d at a time; rename the limit or the key",
			k.Name(), l.Limit, l.Limit)}, true
	case k.Intent() == GateIntent && !limited:
		return Warning{Kind: GateWithoutLimit, Name: k.Name(), Message: fmt.Sprintf(
			"key name %q is declared as a gate but has no configured limit: it runs at K = 1; add a limit for %q",
			k.Name(), k.Name())}, true
	}
	return Warning{}, false
}

// Change is how one key name's K differs between two configurations, or,
// for a per-key limit (Name is a full key), how that key's K does: OldK
// and NewK are then the key's K under each (its own limit, else its
// name's, else 1), and OldSet and NewSet say whether the key had a limit
// of its own.
type Change struct {
	Name   string `json:"name"`
	OldK   int    `json:"old_k"`
	NewK   int    `json:"new_k"`
	OldSet bool   `json:"old_set"`
	NewSet bool   `json:"new_set"`
}

// Diff returns, sorted by name, the names and per-key limits whose K or
// shard count differs between old and new (a name without a limit has
// K = 1; a key without a limit of its own has its name's K).
func Diff(old, new Limits) []Change {
	names := map[string]struct{}{}
	for n := range old.byName {
		names[n] = struct{}{}
	}
	for n := range new.byName {
		names[n] = struct{}{}
	}
	var out []Change
	for n := range names {
		_, oset := old.Lookup(n)
		_, nset := new.Lookup(n)
		o, _ := old.For(n)
		w, _ := new.For(n)
		ok, nk := old.K(n), new.K(n)
		if ok != nk || oset != nset || o.Shards != w.Shards {
			out = append(out, Change{Name: n, OldK: ok, NewK: nk, OldSet: oset, NewSet: nset})
		}
	}
	slices.SortFunc(out, func(a, b Change) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// LiveWarning describes a change that affects live instances.
func (c Change) LiveWarning(live int64) Warning {
	what := "key name"
	if strings.Contains(c.Name, ":") {
		what = "key"
	}
	return Warning{Kind: LiveKeysChanged, Name: c.Name, Live: live, Message: fmt.Sprintf(
		"limit change for %s %q alters K from %d to %d for %s live instance(s)", what, c.Name, c.OldK, c.NewK, LiveCount(live))}
}

func sortLimits(ls []Limit) {
	slices.SortFunc(ls, func(a, b Limit) int { return strings.Compare(a.Name, b.Name) })
}
