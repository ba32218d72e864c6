package durabletest

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/godurable/godurable/store"
)

// CrashDuring makes the next run of a step named step (in any workflow, of
// any instance) crash: the step's body runs to its end, side effects and
// all, but its outcome is lost, as when the process dies before committing
// it. Call it n times to crash the next n runs of the step.
//
// A crash is found the way production finds one: by lease expiry on the
// fake clock. The row stays executing, holding its key, until its lease
// (Options.Lease, default 30s) has passed. A microsecond later (when every
// store agrees the lease has expired) the reaper takes the claim back: the
// row is ready again with its attempt grown by one (steps.Context.Attempt()
// is 1 on the re-run of a first run), and the reconciler repairs its gate's
// counters. Advance and RunUntilDone move the clock there; RunUntilIdle,
// which never moves the clock, leaves the row executing. The crashed run
// leaves no History entry (history commits with the outcome); the re-run's
// entry shows its attempt.
//
// A crash asked for that never happens (no run of the step was claimed
// before the test ended, a misspelt step) fails the test at its end.
func (e *Env) CrashDuring(step string) {
	e.crash.mu.Lock()
	defer e.crash.mu.Unlock()
	if len(e.crash.pending) == 0 { // the first call: check at the end of the test
		e.t.Cleanup(e.checkCrashes)
	}
	e.crash.pending[step]++
}

// checkCrashes fails the test for every crash asked for that did not happen.
func (e *Env) checkCrashes() {
	e.crash.mu.Lock()
	defer e.crash.mu.Unlock()
	steps := make([]string, 0, len(e.crash.pending))
	for step, n := range e.crash.pending {
		if n > 0 {
			steps = append(steps, step)
		}
	}
	sort.Strings(steps)
	for _, step := range steps {
		e.t.Errorf("durabletest: CrashDuring(%q): %d crash(es) never happened: no run of the step was claimed", step, e.crash.pending[step])
	}
}

// Crashes is the number of step runs crashed so far.
func (e *Env) Crashes() int {
	e.crash.mu.Lock()
	defer e.crash.mu.Unlock()
	return e.crash.crashes
}

// reapDelay is how long after a crashed claim's lease end the Env runs the
// reaper: the first instant at which every store agrees that the lease has
// expired (PostgreSQL keeps microseconds and reaps leases that ended before
// now, not at now).
const reapDelay = time.Microsecond

// crashStore is the store as the Env's engine sees it: it loses the outcome
// of claims chosen to crash by CrashDuring, and reports it stale (nothing
// of it commits), which is what a claim that outlives its worker amounts to.
type crashStore struct {
	store.Store

	mu      sync.Mutex
	pending map[string]int               // step name -> runs still to crash
	doomed  map[store.ClaimRef]lostClaim // claims to crash
	lost    []lostClaim                  // crashed claims not yet reaped, by reap time
	crashes int
}

// lostClaim is a crashed claim: it holds its keys until it is reaped.
type lostClaim struct {
	keys   []string
	reapAt time.Time
}

func newCrashStore(st store.Store) *crashStore {
	return &crashStore{Store: st, pending: map[string]int{}, doomed: map[store.ClaimRef]lostClaim{}}
}

// Claim picks, among the rows it claims, those whose step is due to crash.
func (c *crashStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	res, err := c.Store.Claim(ctx, req)
	if err != nil {
		return res, err
	}
	res.Claimed, err = c.doom(ctx, res.Claimed, req.Worker, req.Now, req.Now.Add(req.Lease))
	return res, err
}

// doom picks, among rows a claim or a hand-off gave the worker, those
// whose step is due to crash, and gives back the successors reserved for
// them: the worker dies when the crashed step ends, before it could start
// the next one in its slot. It returns the rows the worker keeps.
func (c *crashStore) doom(ctx context.Context, rows []store.Claimed, worker string, now, leaseEnd time.Time) ([]store.Claimed, error) {
	c.mu.Lock()
	doomedIDs := map[string]bool{}
	var back []store.ClaimRef
	kept := rows[:0:0]
	for _, cl := range rows {
		ref := store.ClaimRef{ID: cl.ID, Fence: cl.Fence}
		if cl.After != "" && doomedIDs[cl.After] {
			back = append(back, ref)
			continue
		}
		kept = append(kept, cl)
		if c.pending[cl.Step] > 0 {
			c.pending[cl.Step]--
			end := cl.LeaseExpiresAt
			if end.IsZero() {
				end = leaseEnd
			}
			c.doomed[ref] = lostClaim{keys: cl.KeyList(), reapAt: end.Add(reapDelay)}
			doomedIDs[cl.ID] = true
		}
	}
	c.mu.Unlock()
	if len(back) > 0 {
		if err := c.Store.Release(ctx, worker, back, now); err != nil {
			return nil, err
		}
	}
	return kept, nil
}

// Complete drops the outcomes of crashed claims and commits the rest.
func (c *crashStore) Complete(ctx context.Context, worker string, outcomes []store.Outcome, now time.Time) ([]store.OutcomeResult, error) {
	res, _, err := c.complete(ctx, outcomes, func(keep []store.Outcome) ([]store.OutcomeResult, []store.Claimed, error) {
		r, err := c.Store.Complete(ctx, worker, keep, now)
		return r, nil, err
	})
	return res, err
}

// CompleteHandOff is Complete through the store's hand-off: among the rows
// handed to the worker, it picks those whose step is due to crash.
func (c *crashStore) CompleteHandOff(ctx context.Context, worker string, outcomes []store.Outcome, now time.Time, h store.HandOff) ([]store.OutcomeResult, []store.Claimed, error) {
	ho, ok := c.Store.(store.HandOffer)
	if !ok {
		res, err := c.Complete(ctx, worker, outcomes, now)
		return res, nil, err
	}
	res, claimed, err := c.complete(ctx, outcomes, func(keep []store.Outcome) ([]store.OutcomeResult, []store.Claimed, error) {
		return ho.CompleteHandOff(ctx, worker, keep, now, h)
	})
	if err != nil || len(claimed) == 0 {
		return res, claimed, err
	}
	lease := h.Lease
	if lease == 0 {
		lease = store.DefaultLease
	}
	// The outcomes' successors come first: they ran in this round, picked
	// to crash or not when they were reserved.
	named := map[store.ClaimRef]bool{}
	for _, o := range outcomes {
		named[o.Successor] = true
	}
	n := 0
	for n < len(claimed) && named[store.ClaimRef{ID: claimed[n].ID, Fence: claimed[n].Fence}] {
		n++
	}
	rest, err := c.doom(ctx, claimed[n:], worker, now, now.Add(lease))
	return res, append(claimed[:n:n], rest...), err
}

// complete drops the outcomes of crashed claims, commits the rest by
// commit, and reports the dropped ones stale.
func (c *crashStore) complete(ctx context.Context, outcomes []store.Outcome,
	commit func([]store.Outcome) ([]store.OutcomeResult, []store.Claimed, error)) ([]store.OutcomeResult, []store.Claimed, error) {
	c.mu.Lock()
	keep := make([]store.Outcome, 0, len(outcomes))
	lost := map[string]bool{}
	for _, o := range outcomes {
		ref := store.ClaimRef{ID: o.ID, Fence: o.Fence}
		if l, crash := c.doomed[ref]; crash {
			delete(c.doomed, ref)
			lost[o.ID] = true
			c.crashes++
			c.lost = append(c.lost, l)
			continue
		}
		keep = append(keep, o)
	}
	sort.SliceStable(c.lost, func(i, j int) bool { return c.lost[i].reapAt.Before(c.lost[j].reapAt) })
	c.mu.Unlock()
	var committed []store.OutcomeResult
	var claimed []store.Claimed
	if len(keep) > 0 {
		var err error
		if committed, claimed, err = commit(keep); err != nil {
			return nil, nil, err
		}
	}
	byID := make(map[string]store.OutcomeResult, len(committed))
	for _, r := range committed {
		byID[r.ID] = r
	}
	out := make([]store.OutcomeResult, len(outcomes))
	for i, o := range outcomes {
		if lost[o.ID] {
			out[i] = store.OutcomeResult{ID: o.ID, Stale: true}
		} else {
			out[i] = byID[o.ID]
		}
	}
	return out, claimed, nil
}

// nextExpiry is when the earliest crashed claim not yet reaped is due to be
// reaped (zero: none).
func (c *crashStore) nextExpiry() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.lost) == 0 {
		return time.Time{}
	}
	return c.lost[0].reapAt
}

// held counts, per key, the crashed claims that still hold it.
func (c *crashStore) held() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, l := range c.lost {
		for _, k := range l.keys {
			out[k]++
		}
	}
	return out
}

// reapDue runs the reaper and the gate reconciler, as a live engine's
// maintenance would, once the lease of a crashed claim has passed.
func (c *crashStore) reapDue(ctx context.Context, now time.Time) error {
	c.mu.Lock()
	n := 0
	for n < len(c.lost) && !c.lost[n].reapAt.After(now) {
		n++
	}
	c.lost = c.lost[n:]
	c.mu.Unlock()
	if n == 0 {
		return nil
	}
	if _, err := c.Store.Reap(ctx, now); err != nil {
		return err
	}
	_, err := c.Store.Reconcile(ctx, 0, now)
	return err
}
