package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/godurable/godurable/gate"
)

// Defaults every backend applies, so that a request means the same thing
// whichever store receives it.
const (
	// DefaultQueue is the queue of an instance inserted, or a claim made,
	// with an empty queue.
	DefaultQueue = "default"
	// DefaultLease is the lease of a claim or heartbeat that names none.
	DefaultLease = 30 * time.Second
)

// ErrNotRetryable is returned by Retry for an instance that is neither
// failed nor canceled.
var ErrNotRetryable = errors.New("instance is not failed or canceled")

// NewInstanceID returns a new instance id: a time-ordered UUID (version 7),
// so that ids sort in creation order (ListFilter.Newest reads the primary
// key backwards) and inserts append to the right edge of its index.
func NewInstanceID() string { return uuid.Must(uuid.NewV7()).String() }

// NormalizeNewInstance validates the i-th instance of an insert and fills
// its defaults (NewInstanceID when ID is empty, DefaultQueue). Every error
// wraps ErrInvalid: the same request can never succeed.
func NormalizeNewInstance(i int, in *NewInstance) error {
	if in.ID == "" {
		in.ID = NewInstanceID()
	} else if _, err := uuid.Parse(in.ID); err != nil {
		return fmt.Errorf("%w: instance %d: id %q is not a UUID", ErrInvalid, i, in.ID)
	}
	if in.Workflow == "" || in.Step == "" {
		return fmt.Errorf("%w: instance %d: workflow name and step are required (got workflow %q, step %q)", ErrInvalid, i, in.Workflow, in.Step)
	}
	if in.Queue == "" {
		in.Queue = DefaultQueue
	}
	if err := NormalizeKeys(&in.Key, &in.KeyIntent, &in.Also); err != nil {
		return fmt.Errorf("%w: instance %d: %w", ErrInvalid, i, err)
	}
	if len(in.State) > 0 && !json.Valid(in.State) {
		return fmt.Errorf("%w: instance %d: state is not valid JSON", ErrInvalid, i)
	}
	if err := normalizeDebounce(i, in); err != nil {
		return err
	}
	if !validConflict(in.OnConflict) {
		return fmt.Errorf("%w: instance %d: unknown OnConflict %q", ErrInvalid, i, in.OnConflict)
	}
	if in.OnConflict != ConflictSkip && in.UniqueKey == "" {
		return fmt.Errorf("%w: instance %d: OnConflict %q needs a unique key", ErrInvalid, i, in.OnConflict)
	}
	if in.ParentID != "" {
		if _, err := uuid.Parse(in.ParentID); err != nil {
			return fmt.Errorf("%w: instance %d: parent id %q is not a UUID", ErrInvalid, i, in.ParentID)
		}
	}
	return nil
}

// NormalizeKeys validates an instance's keys (key with its intent, and
// also) and puts them in their one order: key is the first in key order
// of those declared identities or of no intent, else the first gate, and
// also holds the others in key order (nil for one key or none), whatever
// order they came in. An instance holds at most MaxKeys keys, none twice
// and none empty; also without key is refused.
func NormalizeKeys(key *string, intent *gate.Intent, also *[]KeyRef) error {
	if *key == "" && *intent == "" && len(*also) == 0 {
		return nil
	}
	if *key == "" && len(*also) > 0 {
		return fmt.Errorf("other keys without a key")
	}
	if len(*also) == 0 {
		*also = nil
		_, err := gate.ParseWithIntent(*key, *intent)
		return err
	}
	keys := append([]KeyRef{{Key: *key, Intent: *intent}}, *also...)
	if len(keys) > MaxKeys {
		return fmt.Errorf("%d concurrency keys, at most %d", len(keys), MaxKeys)
	}
	for _, k := range keys {
		if k.Key == "" {
			return fmt.Errorf("an empty key among %d", len(keys))
		}
		if _, err := gate.ParseWithIntent(k.Key, k.Intent); err != nil {
			return err
		}
	}
	slices.SortFunc(keys, func(a, b KeyRef) int { return strings.Compare(a.Key, b.Key) })
	for i := 1; i < len(keys); i++ {
		if keys[i].Key == keys[i-1].Key {
			return fmt.Errorf("key %q given twice", keys[i].Key)
		}
	}
	first := slices.IndexFunc(keys, func(k KeyRef) bool { return k.Intent != gate.GateIntent })
	if first < 0 {
		first = 0
	}
	*key, *intent = keys[first].Key, keys[first].Intent
	*also = slices.Delete(keys, first, first+1)
	return nil
}

// NormalizeOutcomeKeys validates the keys an outcome sets (Outcome.SetKey)
// and puts them in NormalizeKeys' order. An empty Key without Also
// releases every key, whatever KeyIntent says.
func NormalizeOutcomeKeys(o *Outcome) error {
	switch {
	case !o.SetKey && len(o.Also) > 0:
		return fmt.Errorf("other keys without SetKey")
	case !o.SetKey:
		return nil
	case o.Key == "" && len(o.Also) == 0:
		o.KeyIntent = ""
		return nil
	}
	return NormalizeKeys(&o.Key, &o.KeyIntent, &o.Also)
}

// NormalizeClaim validates a claim request and fills its defaults
// (DefaultQueue, DefaultLease). It reports false when the request asks for
// nothing (Limit ≤ 0).
func NormalizeClaim(req *ClaimRequest) (bool, error) {
	if req.Limit <= 0 {
		return false, nil
	}
	if req.Worker == "" {
		return false, fmt.Errorf("%w: claim: empty worker", ErrInvalid)
	}
	if req.Queue == "" {
		req.Queue = DefaultQueue
	}
	if req.Lease <= 0 {
		req.Lease = DefaultLease
	}
	req.Reserve = max(req.Reserve, 0)
	return true, nil
}

// FirstGate returns the gate key an instance of several keys (key, also, in
// NormalizeKeys' order) waits for first when its gates are full: its key
// when that is a gate, else the first of also that is one; isGate says
// which keys are gates (their names or keys have a limit). "" when it has
// none, or has one key only.
func FirstGate(key string, also []KeyRef, isGate func(string) bool) string {
	if len(also) == 0 {
		return ""
	}
	if isGate(key) {
		return key
	}
	for _, k := range also {
		if isGate(k.Key) {
			return k.Key
		}
	}
	return ""
}
