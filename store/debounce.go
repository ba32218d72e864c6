package store

import (
	"fmt"
	"time"
)

// Debounce makes an insert run once after a burst of inserts with the same
// Key (NewInstance.Debounce): while an instance of the key is pending
// (ready, scheduled or blocked, never claimed), an insert replaces its
// state and moves its start to now + Period, but never past its first
// insert (CreatedAt) + MaxWait; once it has started, the next insert
// starts a new pending instance. Decided atomically with the insert (on
// PostgreSQL under the key's advisory lock), so that concurrent inserts
// from many processes leave one pending instance per key.
type Debounce struct {
	// Key names the burst. An instance shows it as its UniqueKey,
	// DebounceUniqueKey(Key).
	Key string
	// Period is the quiet time after the last insert before the instance
	// starts (> 0).
	Period time.Duration
	// MaxWait bounds how long after its first insert a pending instance
	// may be pushed back (0: no bound).
	MaxWait time.Duration
}

// DebounceUniqueKey is the unique key a debounced instance of key holds.
func DebounceUniqueKey(key string) string { return "debounce:" + key }

// debounceScope is the unique scope of a debounced instance: pending only
// (a started one also needs Fence 0 to count: see Debounce).
var debounceScope = []Status{StatusReady, StatusBlocked}

// FirstDelay is how long after its first insert a debounced instance
// starts when no other insert comes: Period, or MaxWait when shorter.
func (d Debounce) FirstDelay() time.Duration {
	if d.MaxWait > 0 && d.MaxWait < d.Period {
		return d.MaxWait
	}
	return d.Period
}

// RunAt is when a pending debounced instance first inserted at created
// starts after an insert at now (see Debounce).
func (d Debounce) RunAt(created, now time.Time) time.Time {
	at := now.Add(d.Period)
	if d.MaxWait > 0 && at.After(created.Add(d.MaxWait)) {
		at = created.Add(d.MaxWait)
	}
	return at
}

// normalizeDebounce checks the debounce of the i-th instance of an insert
// and gives it the unique key and scope that carry it.
func normalizeDebounce(i int, in *NewInstance) error {
	d := in.Debounce
	if d.Key == "" {
		if d.Period != 0 || d.MaxWait != 0 {
			return fmt.Errorf("%w: instance %d: a debounce needs a key", ErrInvalid, i)
		}
		return nil
	}
	switch {
	case d.Period <= 0 || d.MaxWait < 0:
		return fmt.Errorf("%w: instance %d: debounce %q: the period must be positive and the max wait not negative", ErrInvalid, i, d.Key)
	case in.UniqueKey != "" && in.UniqueKey != DebounceUniqueKey(d.Key), in.OnConflict != ConflictSkip:
		return fmt.Errorf("%w: instance %d: debounce %q: a debounced insert has no unique key or OnConflict of its own", ErrInvalid, i, d.Key)
	}
	in.UniqueKey, in.UniqueStatuses = DebounceUniqueKey(d.Key), debounceScope
	if in.RunAt.IsZero() && in.Delay == 0 {
		in.Delay = d.FirstDelay()
	}
	return nil
}
