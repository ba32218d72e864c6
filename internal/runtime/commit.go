// Committing outcomes, shared by the flushers and Tick: one batch through
// the store, split when the store refuses it, retried when its commit is
// unknown.

package runtime

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/godurable/godurable/store"
)

// commitHooks are what a caller of commitOutcomes does with its results.
type commitHooks struct {
	// handOff, when set, lets the store hand the freed slots to waiting
	// rows (see store.HandOffer): its Room is the executor slots this
	// caller holds, and commitOutcomes takes the rows handed off out of it.
	handOff *store.HandOff
	// handed receives the rows handed off, with the time until which their
	// leases are sure to hold by this engine's clock.
	handed func(cs []store.Claimed, validUntil time.Time)
	// committed receives each part of the batch the store committed, in
	// batch order, with its results.
	committed func(batch []store.Outcome, res []store.OutcomeResult)
	// abandoned receives an outcome the store refused even as a bare
	// failure: its claim is left to the reaper.
	abandoned func(o store.Outcome)
	// unreachable decides about any other error: true to try again (after
	// waiting as it sees fit), false to give up (commitOutcomes returns it).
	unreachable func(err error) bool
}

// commitOutcomes commits a batch of outcomes. A batch the store refuses for
// its data (see rejected) is split until the refused outcome is alone; that
// outcome then fails its instance with the store's reason, so that one bad
// value never holds back the outcomes of other instances. The live
// scheduler and Tick both commit through it.
func (e *Runtime) commitOutcomes(ctx context.Context, batch []store.Outcome, h commitHooks) error {
	retried := false // sent again after an error that left its commit unknown
	firstSent := time.Now()
	for {
		res, err := e.complete(ctx, batch, h)
		switch {
		case err == nil:
			if retried {
				e.passedEarlier(ctx, batch, e.landedEarlier(ctx, batch, res), firstSent, h)
			}
			h.committed(batch, res)
			return nil
		case rejected(err) && len(batch) > 1:
			mid := len(batch) / 2
			if err := e.commitOutcomes(ctx, batch[:mid], h); err != nil {
				return err
			}
			return e.commitOutcomes(ctx, batch[mid:], h)
		case rejected(err):
			o := batch[0]
			if o.Kind == store.OutcomeFailed && o.State == nil && o.Result == nil && len(o.Children) == 0 && !o.SetKey &&
				o.History == nil {
				// Even the bare failure was refused: give the claim up to the reaper.
				e.log.Error("outcome refused by the store; its lease will expire and the step will run again",
					"instance", o.ID, "err", err)
				h.abandoned(o)
				return nil
			}
			e.log.Error("outcome refused by the store; the instance fails with the reason", "instance", o.ID, "err", err)
			batch = []store.Outcome{e.refusedOutcome(o, err)}
		case !h.unreachable(err):
			return err
		default:
			retried = true
		}
	}
}

// landedEarlier looks, for each outcome of a batch sent again after an
// error that the store reports stale, for a sign that the earlier attempt
// committed it (its COMMIT reached the server, the answer did not: the
// server went down, the connection broke): its run in the instance's step
// history, or else, as the store keeps no history by default, the row as
// that outcome leaves it (see appliedBy). Found, the outcome is not stale
// (its claim was not reaped or cancelled) and is neither logged nor
// counted as such. An outcome whose signs cannot be read stays stale. It
// returns the outcomes found so, by their index in batch.
func (e *Runtime) landedEarlier(ctx context.Context, batch []store.Outcome, res []store.OutcomeResult) []int {
	var landed []int
	for i, r := range res {
		if !r.Stale {
			continue
		}
		if inHistory(ctx, e.st, batch[i]) {
			res[i].Stale = false
		} else if inst, err := e.st.Get(ctx, r.ID); err == nil && appliedBy(inst, batch[i]) {
			res[i].Stale = false
		} else {
			continue
		}
		e.log.Info("outcome committed before its flush failed: the retry found it applied", "instance", r.ID)
		landed = append(landed, i)
	}
	return landed
}

// passedEarlier hands on (h.handed) the successors to which the outcomes
// landed, committed by an earlier attempt of their flush (see
// landedEarlier), passed their slots: rows that this worker now holds,
// executing under the successor's fence. Without it, the flush that found
// those outcomes applied would take each successor for refused: a running
// one would be stopped, and its row, executing with nobody running it,
// would wait for its lease to end. Their leases began in that earlier
// commit, so they hold at least until the first attempt's send (sent) plus
// the lease. What else that commit handed this engine (hand-offs to rows
// no outcome named, reservations) never reached it: those rows wait for
// the reaper, the safe direction.
func (e *Runtime) passedEarlier(ctx context.Context, batch []store.Outcome, landed []int, sent time.Time, h commitHooks) {
	if h.handOff == nil || h.handed == nil {
		return
	}
	var passed []store.Claimed
	for _, i := range landed {
		next := batch[i].Successor
		if next.ID == "" {
			continue
		}
		inst, err := e.st.Get(ctx, next.ID)
		if err != nil || inst.Status != store.StatusExecuting || inst.Worker != e.cfg.WorkerID || inst.Fence != next.Fence {
			continue
		}
		passed = append(passed, store.Claimed{Instance: inst})
	}
	if len(passed) > 0 {
		h.handed(passed, sent.Add(e.cfg.Lease))
	}
}

// inHistory reports whether o's run is in its instance's step history.
func inHistory(ctx context.Context, st store.Store, o store.Outcome) bool {
	h := o.History
	if h == nil {
		return false
	}
	hist, err := st.History(ctx, o.ID)
	if err != nil {
		return false
	}
	for _, x := range hist {
		if d := x.StartedAt.Sub(h.StartedAt); x.Worker == h.Worker && x.Step == h.Step && x.Attempt == h.Attempt &&
			d > -time.Microsecond && d < time.Microsecond {
			return true
		}
	}
	return false
}

// appliedBy reports whether inst is as outcome o leaves it: no longer
// claimed, still carrying o's fence (only a claim changes it), at o's
// attempt and step, and, for an outcome that ends the instance, in its
// status. A claim taken back instead (reaped, reclaimed, released) keeps
// its step and status ready, at the same attempt or one more: it can pass
// only for an outcome that would have left the row the same way (a retry
// of the same step, due at once), where the difference is moot.
func appliedBy(inst store.Instance, o store.Outcome) bool {
	if inst.Worker != "" || inst.Fence != o.Fence || inst.Attempt != o.Attempt || (o.Step != "" && inst.Step != o.Step) {
		return false
	}
	switch o.Kind {
	case store.OutcomeDone:
		return inst.Status == store.StatusDone
	case store.OutcomeFailed:
		return inst.Status == store.StatusFailed
	}
	return inst.Status != store.StatusExecuting
}

// complete is one Complete of a batch, through the store's hand-off when
// h asks for one.
func (e *Runtime) complete(ctx context.Context, batch []store.Outcome, h commitHooks) ([]store.OutcomeResult, error) {
	ho, ok := e.st.(store.HandOffer)
	if !ok || h.handOff == nil {
		return e.st.Complete(ctx, e.cfg.WorkerID, batch, e.storeNow())
	}
	sent := time.Now()
	res, claimed, err := ho.CompleteHandOff(ctx, e.cfg.WorkerID, batch, e.storeNow(), *h.handOff)
	if err != nil || len(claimed) == 0 {
		return res, err
	}
	succ := map[store.ClaimRef]bool{} // named successors: their room is counted by the caller
	for _, o := range batch {
		succ[o.Successor] = true
	}
	for _, c := range claimed {
		if c.After == "" && !succ[refOf(c)] {
			h.handOff.Room[c.Queue]-- // a part of a split batch leaves less room to the next
		}
	}
	h.handed(claimed, sent.Add(e.cfg.Lease))
	return res, nil
}

// countStale counts and logs the outcomes the store discarded as stale.
func (e *Runtime) countStale(res []store.OutcomeResult) int {
	n := 0
	for _, r := range res {
		if r.Stale {
			n++
			e.staleOutcomes.Add(1)
			e.tel.stale.Add(context.Background(), 1)
			e.log.Warn("stale outcome discarded: the claim was reaped or cancelled", "instance", r.ID)
		}
	}
	return n
}

// rejected reports whether err says the store refused the data of a request
// (retrying it unchanged cannot succeed) rather than being unreachable:
// store.ErrInvalid, or an SQL error of class 22 (data exception) or 23
// (integrity constraint violation).
func rejected(err error) bool {
	if errors.Is(err, store.ErrInvalid) {
		return true
	}
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		c := se.SQLState()
		return strings.HasPrefix(c, "22") || strings.HasPrefix(c, "23")
	}
	return false
}

// refusedOutcome replaces an outcome the store refused by a bare failure of
// the instance (state, key and inbox left as they were).
func (e *Runtime) refusedOutcome(o store.Outcome, err error) store.Outcome {
	msg := CleanText("the store refused this step's outcome: "+err.Error(), e.cfg.MaxErrorLength)
	// The successor keeps its slot: it may be running in it already.
	f := store.Outcome{ID: o.ID, Fence: o.Fence, Kind: store.OutcomeFailed, Step: o.Step, Error: msg,
		Contended: o.Contended, Successor: o.Successor}
	if o.History != nil {
		h := *o.History
		h.Outcome, h.Error = "refused", msg
		f.History, f.Attempt = &h, h.Attempt
	}
	return f
}
