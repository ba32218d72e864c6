package store

import (
	"errors"
	"fmt"
)

// Conflict is what an insert does when its unique key is occupied
// (NewInstance.OnConflict): another instance holds the key in one of the
// insert's UniqueStatuses.
type Conflict string

const (
	// ConflictSkip inserts nothing and reports the holder
	// (InsertResult.Duplicate). The default.
	ConflictSkip Conflict = ""
	// ConflictCancelOlder cancels the holder by the rules of Store.Cancel
	// and inserts the new instance (InsertResult.Canceled names the
	// holder). A holder whose step is running keeps its concurrency key's
	// slot until the step returns (its cancel is requested), but no longer
	// holds the unique key: the new instance waits for the slot, not for
	// the key. A holder that is terminal (a scope with terminal statuses)
	// cannot be canceled: the insert fails with a *ConflictError wrapping
	// ErrTerminal.
	ConflictCancelOlder Conflict = "cancel_older"
	// ConflictReplace replaces the state of a holder that has not started
	// (ready, scheduled or blocked, and never claimed) with the new
	// instance's, and inserts nothing (InsertResult.Replaced; its ID is the
	// holder's). A holder that has started (executing, awaiting a signal,
	// a timer or children, or ready again after a step ran) or ended fails
	// the insert with a *ConflictError wrapping ErrStarted.
	ConflictReplace Conflict = "replace"
)

// ErrStarted: ConflictReplace met a holder of the unique key that has
// started, whose state its steps own.
var ErrStarted = errors.New("unique key held by an instance that has started")

// ConflictError is the failure of an insert whose unique key is held by an
// instance that its OnConflict cannot act on. It wraps ErrStarted
// (ConflictReplace) or ErrTerminal (ConflictCancelOlder); nothing of the
// insert's batch was applied.
type ConflictError struct {
	// UniqueKey is the key, Holder the instance holding it and Status the
	// holder's status.
	UniqueKey string
	Holder    string
	Status    Status
	// OnConflict is the insert's.
	OnConflict Conflict
	err        error
}

// NewConflictError returns the ConflictError of a holder that onConflict
// cannot act on: ErrStarted for ConflictReplace, ErrTerminal otherwise.
func NewConflictError(uniqueKey, holder string, status Status, onConflict Conflict) *ConflictError {
	err := ErrTerminal
	if onConflict == ConflictReplace {
		err = ErrStarted
	}
	return &ConflictError{UniqueKey: uniqueKey, Holder: holder, Status: status, OnConflict: onConflict, err: err}
}

// Error names the key, the holder and its status.
func (e *ConflictError) Error() string {
	return fmt.Sprintf("unique key %q: %s holder %s: %v", e.UniqueKey, e.Status, e.Holder, e.err)
}

// Unwrap returns ErrStarted or ErrTerminal.
func (e *ConflictError) Unwrap() error { return e.err }

// validConflict reports whether c is a Conflict the stores know.
func validConflict(c Conflict) bool {
	return c == ConflictSkip || c == ConflictCancelOlder || c == ConflictReplace
}

// CheckBatchConflicts refuses (ErrInvalid) a batch in which a unique key
// with an OnConflict other than ConflictSkip, or a debounce key, appears
// more than once: which of its rows would cancel or replace which is not
// worth a rule. Both
// stores call it before anything of the batch is applied.
func CheckBatchConflicts(instances []NewInstance) error {
	acting := map[string]bool{}
	count := map[string]int{}
	for _, in := range instances {
		k := in.UniqueKey
		if in.Debounce.Key != "" {
			k = DebounceUniqueKey(in.Debounce.Key)
		}
		if k == "" {
			continue
		}
		count[k]++
		acting[k] = acting[k] || in.OnConflict != ConflictSkip || in.Debounce.Key != ""
		if count[k] > 1 && acting[k] {
			return fmt.Errorf("%w: unique key %q appears more than once in a batch with an OnConflict that cancels or replaces, or a debounce", ErrInvalid, k)
		}
	}
	return nil
}
