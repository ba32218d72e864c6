package store

import (
	"context"
	"time"
)

// HealthScanLimit bounds the per-key work of a Health call: saturated keys
// are counted up to this many (SaturatedKeysCapped tells when the limit was
// reached), so Health costs the same with 10 keys or 10 million.
const HealthScanLimit = 1000

// Health is a bounded-cost snapshot of the pressure in a store.
type Health struct {
	// Queues, sorted by name: every queue with live rows or a policy.
	Queues []QueueHealth `json:"queues"`
	// Gates, sorted by name: every configured limit.
	Gates []GateHealth `json:"gates"`
}

// QueueHealth is the state of one queue.
type QueueHealth struct {
	Queue string `json:"queue"`
	// Ready rows are eligible now; Scheduled rows are ready with a future
	// run time (retries, sleeps, delayed inserts).
	Ready     int64 `json:"ready"`
	Scheduled int64 `json:"scheduled"`
	// Blocked rows are ready but wait for a slot of their key.
	Blocked   int64 `json:"blocked"`
	Executing int64 `json:"executing"`
	// Awaiting counts rows parked on a signal or on children.
	Awaiting int64 `json:"awaiting"`
	Failed   int64 `json:"failed"`
	// OldestReady is how long the oldest eligible ready row has waited.
	OldestReady time.Duration `json:"oldest_ready_ns"`
	// MaxActive is the queue's fleet-wide limit (0: none); Active is the
	// number of executing rows it counts.
	MaxActive int   `json:"max_active"`
	Active    int64 `json:"active"`
}

// GateHealth is the state of one configured key limit.
type GateHealth struct {
	Name   string `json:"name"`
	Limit  int    `json:"limit"`
	Shards int    `json:"shards"`
	// Active is the number of executing rows holding keys of this name.
	Active int64 `json:"active"`
	// BlockedReady is the number of rows waiting for a slot of such a key.
	BlockedReady int64 `json:"blocked_ready"`
	// SaturatedKeys counts keys of this name with every slot taken, up to
	// HealthScanLimit (SaturatedKeysCapped is then true).
	SaturatedKeys       int  `json:"saturated_keys"`
	SaturatedKeysCapped bool `json:"saturated_keys_capped"`
	// HighestKeyActive is the most executing rows any one key of this name has.
	HighestKeyActive int `json:"highest_key_active"`
}

// HealthReporter is implemented by stores that can report Health.
type HealthReporter interface {
	// Health reports queue and gate pressure at now (zero: the store's clock).
	Health(ctx context.Context, now time.Time) (Health, error)
}
