package postgres

import (
	"slices"
	"strings"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// statusScheduled is the stored status of a ready row whose run_at is in
// the future. It is reported as store.StatusReady.
const statusScheduled = "scheduled"

// publicStatus maps a stored status to the contract's.
func publicStatus(s string) store.Status {
	if s == statusScheduled {
		return store.StatusReady
	}
	return store.Status(s)
}

// storedStatuses maps contract statuses to stored ones (ready includes scheduled).
func storedStatuses(ss []store.Status) []string {
	out := make([]string, 0, len(ss)+1)
	for _, s := range ss {
		out = append(out, string(s))
		if s == store.StatusReady {
			out = append(out, statusScheduled)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// uniqueScope is the stored form of a unique key's occupied statuses.
func uniqueScope(ss []store.Status) []string {
	if len(ss) == 0 {
		ss = store.DefaultUniqueStatuses
	}
	return storedStatuses(ss)
}

func joinScope(scope []string) string { return strings.Join(scope, ",") }

func gateIntent(s string) gate.Intent { return gate.Intent(s) }
