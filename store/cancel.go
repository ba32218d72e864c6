package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// CancelTree cancels instance id and every one of its descendants (the
// children it spawned, theirs, and so on), each by the rules of
// Store.Cancel: a running step keeps its slot until it returns, and a
// child's cancel counts in its parent's join. It goes parent first, then
// its children, so that no child escapes: a canceled parent spawns no more
// (a Spawn outcome of a canceled step inserts nothing), and every child it
// spawned before is listed by Children once the parent's cancel committed.
// Children of a canceled parent that are canceled after it leave it
// canceled.
//
// It returns the ids it canceled or asked to cancel (the non-terminal ones,
// parents before their children). An instance already terminal is not an
// error, the root included: its descendants are still canceled, so that a
// tree whose parent was canceled alone can be cleaned up. A missing root is
// ErrNotFound; a descendant that ended or was deleted meanwhile is passed
// over.
func CancelTree(ctx context.Context, st Store, id string, now time.Time) ([]string, error) {
	root, err := st.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	var canceled []string
	seen := map[string]bool{}
	queue := []Instance{root}
	for len(queue) > 0 {
		in := queue[0]
		queue = queue[1:]
		if seen[in.ID] {
			continue
		}
		seen[in.ID] = true
		if !in.Status.Terminal() {
			err := st.Cancel(ctx, in.ID, now)
			switch {
			case err == nil:
				canceled = append(canceled, in.ID)
			case errors.Is(err, ErrTerminal), errors.Is(err, ErrNotFound) && in.ID != id:
				// It ended (or was deleted) since it was read: nothing to cancel.
			default:
				return canceled, fmt.Errorf("cancel %s of the tree of %s: %w", in.ID, id, err)
			}
		}
		kids, err := st.Children(ctx, in.ID)
		if err != nil {
			return canceled, fmt.Errorf("children of %s in the tree of %s: %w", in.ID, id, err)
		}
		queue = append(queue, kids...)
	}
	return canceled, nil
}
