package durable

import (
	"encoding/json"
	"time"

	"github.com/godurable/godurable/store"
)

// Instance is what Get and Wait show of an instance: where it is in its
// workflow, its state and its outcome. The claim that runs it (worker,
// fence, lease, key shard) is the engine's business; operators' tools read
// it with Engine.Store().Get.
type Instance struct {
	ID       string
	Workflow string
	Version  int
	Queue    string
	Priority int
	Status   store.Status
	// Step is the step that runs next, or ran last for a terminal instance.
	Step string
	// State is the JSON of the workflow's state as last committed.
	State json.RawMessage
	// Attempt counts the runs of Step that failed and were retried.
	Attempt int
	// Key is the concurrency key of the next step ("" : none); with
	// several keys, the first of Keys.
	Key string
	// Keys are every concurrency key of the next step: Key first, then the
	// others in key order (nil: none).
	Keys []string
	// BlockedOn is, for a blocked instance, the key it waits for: the one
	// that had no room when it was blocked ("" otherwise).
	BlockedOn string
	// RunAt is when the instance is due to run Step (ready or scheduled).
	RunAt time.Time
	// AwaitSignal and TimeoutAt are the signal an awaiting instance waits
	// for and when its wait times out (zero: never).
	AwaitSignal string
	TimeoutAt   time.Time
	// Result is the JSON of a done instance's result.
	Result json.RawMessage
	// LastError is the last step error, or why the instance failed.
	LastError string
	// ParentID is the instance that spawned this one ("" : none).
	ParentID string
	// PendingChildren counts the children an instance awaiting its
	// children still waits for.
	PendingChildren int
	UniqueKey       string
	CreatedAt       time.Time
	UpdatedAt       time.Time
	// StartedAt is when the step that runs now was claimed (zero: none runs).
	StartedAt time.Time
	// CancelRequested is set while a canceled instance's step still runs.
	CancelRequested bool
}

func viewOf(in store.Instance) Instance {
	v := Instance{ID: in.ID, Workflow: in.Workflow, Version: in.Version, Queue: in.Queue, Priority: in.Priority,
		Status: in.Status, Step: in.Step, State: in.State, Attempt: in.Attempt, Key: in.Key, Keys: in.KeyList(), RunAt: in.RunAt,
		AwaitSignal: in.AwaitSignal, TimeoutAt: in.TimeoutAt, Result: in.Result, LastError: in.LastError,
		ParentID: in.ParentID, PendingChildren: in.PendingChildren, UniqueKey: in.UniqueKey,
		CreatedAt: in.CreatedAt, UpdatedAt: in.UpdatedAt, StartedAt: in.StartedAt, CancelRequested: in.CancelRequested}
	if in.Status == store.StatusBlocked {
		v.BlockedOn = in.BlockedOn
	}
	return v
}
