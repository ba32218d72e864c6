package main

import (
	"encoding/json"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/godurable/godurable/internal/explain"
	"github.com/godurable/godurable/store"
)

// table writes aligned columns; call flush when done.
func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// age is a duration for people (see explain.Age).
func age(d time.Duration) string { return explain.Age(d) }

// when is a time with how far it is from now (see explain.When).
func when(t, now time.Time) string { return explain.When(t, now) }

// orDash is s, or "-" when empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// instanceView is the JSON form of an instance in `ls -json` and
// `show -json`: every field of store.Instance, in snake_case. Times that
// do not apply are null.
type instanceView struct {
	ID        string          `json:"id"`
	Workflow  string          `json:"workflow"`
	Version   int             `json:"version"`
	Queue     string          `json:"queue"`
	Priority  int             `json:"priority"`
	Status    store.Status    `json:"status"`
	Step      string          `json:"step"`
	State     json.RawMessage `json:"state"`
	Attempt   int             `json:"attempt"`
	Key       string          `json:"key"`
	KeyIntent string          `json:"key_intent"`
	// Keys are every concurrency key of the instance, Key first, then its
	// other keys in key order ([] for none); BlockedOn is, for a blocked
	// row, the key it waits for ("" otherwise).
	Keys            []string        `json:"keys"`
	BlockedOn       string          `json:"blocked_on"`
	RunAt           *time.Time      `json:"run_at"`
	AwaitSignal     string          `json:"await_signal"`
	TimeoutAt       *time.Time      `json:"timeout_at"`
	Worker          string          `json:"worker"`
	LeaseExpiresAt  *time.Time      `json:"lease_expires_at"`
	StartedAt       *time.Time      `json:"started_at"`
	Result          json.RawMessage `json:"result"`
	LastError       string          `json:"last_error"`
	ParentID        string          `json:"parent_id"`
	PendingChildren int             `json:"pending_children"`
	UniqueKey       string          `json:"unique_key"`
	CreatedAt       *time.Time      `json:"created_at"`
	UpdatedAt       *time.Time      `json:"updated_at"`
	// ReadySince is set on a row workers handed back (they do not know its
	// workflow version or step): when it first became ready.
	ReadySince *time.Time `json:"ready_since"`
}

func viewOf(in store.Instance) instanceView {
	ts := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		t = t.UTC()
		return &t
	}
	raw := func(m json.RawMessage) json.RawMessage {
		if len(m) == 0 {
			return json.RawMessage("null")
		}
		return m
	}
	return instanceView{ID: in.ID, Workflow: in.Workflow, Version: in.Version, Queue: in.Queue, Priority: in.Priority,
		Status: in.Status, Step: in.Step, State: raw(in.State), Attempt: in.Attempt, Key: in.Key,
		KeyIntent: string(in.KeyIntent), Keys: keysOf(in), BlockedOn: in.BlockedOn, RunAt: ts(in.RunAt), AwaitSignal: in.AwaitSignal, TimeoutAt: ts(in.TimeoutAt),
		Worker: in.Worker, LeaseExpiresAt: ts(in.LeaseExpiresAt), StartedAt: ts(in.StartedAt), Result: raw(in.Result),
		LastError: in.LastError, ParentID: in.ParentID, PendingChildren: in.PendingChildren, UniqueKey: in.UniqueKey,
		CreatedAt: ts(in.CreatedAt), UpdatedAt: ts(in.UpdatedAt), ReadySince: ts(in.ReadySince)}
}

// keysOf is every key of in, Key first ([] for none).
func keysOf(in store.Instance) []string {
	if keys := in.KeyList(); keys != nil {
		return keys
	}
	return []string{}
}

// keyColumn is keys (a KeyList) for a table column: "-" for none, else
// every key, comma-separated, the first key first.
func keyColumn(keys []string) string {
	return orDash(strings.Join(keys, ","))
}

// blockedOnText is, for a blocked row of several keys, the key it waits
// for, and "-" for any other row (a blocked row of one key waits for its
// key).
func blockedOnText(in store.Instance) string {
	if in.Status != store.StatusBlocked || len(in.Also) == 0 {
		return "-"
	}
	return orDash(in.BlockedOn)
}

// historyView is the JSON form of one recorded step run.
type historyView struct {
	Step       string     `json:"step"`
	Attempt    int        `json:"attempt"`
	Key        string     `json:"key"`
	Also       []string   `json:"also"` // the step's other keys, when it held several
	Worker     string     `json:"worker"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	Outcome    string     `json:"outcome"`
	Error      string     `json:"error"`
}
