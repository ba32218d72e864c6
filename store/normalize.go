package store

import (
	"encoding/json"
	"errors"
	"fmt"
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
	if in.Key != "" || in.KeyIntent != "" {
		if _, err := gate.ParseWithIntent(in.Key, in.KeyIntent); err != nil {
			return fmt.Errorf("%w: instance %d: %w", ErrInvalid, i, err)
		}
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
