package runtime

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/godurable/godurable/store"
)

// Round is what one Tick did (durable.TickReport shows it to a user).
type Round struct {
	// Claimed are the rows that ran in this round each in a slot of its
	// own: first those the previous round's commit handed to this worker
	// (a slot its outcome freed, given straight to the key's next row),
	// then those claimed, in claim order, across queues (sorted by queue
	// name). They all held their slots at once.
	Claimed []store.Claimed
	// Chained are the rows that ran after a row of Claimed, in its slot:
	// each was reserved as that row's successor (store.Claimed.After), and
	// that row's outcome passed the slot to it.
	Chained []store.Claimed
	// Outcomes are the committed outcomes, in the order the steps ran (an
	// outcome the store refused for its data is replaced by the failure it
	// became; one refused even so is left out, its claim left to the
	// reaper).
	Outcomes []store.Outcome
	// Stale counts outcomes that did not commit.
	Stale int
	// Fired counts await timeouts that fired before the claim.
	Fired int
	// Scheduled counts instances started by due schedule ticks before the claim.
	Scheduled int
	// NextDue is the earliest future time a row becomes eligible, an
	// await times out or a schedule ticks, over all queues (zero: none known).
	NextDue time.Time
}

// Tick runs one synchronous scheduling round without goroutines, through
// the same slot protocol as the live scheduler. It fires due schedule
// ticks and due timers, then runs the rows the previous round's commit
// handed to this worker and claims, per queue, up to its executor count
// less those. It runs the steps one after another: each row, then the
// successor reserved for it in the same slot. It commits all their
// outcomes as one batch, through the store's hand-off when it has one
// (store.HandOffer): a freed slot goes to the key's next row in turn,
// with a successor reserved for it (HandOff.Reserve), and those rows run
// first in the next round. The rows of one round held their slots at the
// same time, as if they ran in parallel. The caller makes sure that no
// scheduler runs.
//
// Its claims ask for no successors (store.ClaimRequest.Reserve), which
// the live scheduler asks for only when its steps are slow enough: what a
// claim may reserve depends on how many rows a store reads past its
// limit, which is the store's business, while a hand-off's successor is
// the key's next row on every store.
func (e *Runtime) Tick(ctx context.Context) (Round, error) {
	var rep Round
	round := e.fireSchedules(ctx)
	if err := errors.Join(round.StoreErr, round.Errs); err != nil {
		return rep, fmt.Errorf("durable: tick: %w", err)
	}
	rep.Scheduled, rep.NextDue = round.Started, round.Next
	fired, err := e.st.FireTimers(ctx, e.storeNow())
	if err != nil {
		return rep, fmt.Errorf("durable: tick: %w", err)
	}
	rep.Fired = fired
	rows := e.tick.take()
	inUse := map[string]int{}
	for _, c := range rows {
		if c.After == "" {
			inUse[c.Queue]++
		}
	}
	queues := make([]string, 0, len(e.cfg.Queues))
	for q := range e.cfg.Queues {
		queues = append(queues, q)
	}
	sort.Strings(queues)
	workflows := e.workflowVersions()
	for _, q := range queues {
		room := e.cfg.Queues[q] - inUse[q]
		if room <= 0 {
			continue
		}
		res, err := e.st.Claim(ctx, e.claimRequest(q, room, workflows))
		if err != nil {
			return rep, fmt.Errorf("durable: tick: claim %s: %w", q, err)
		}
		rows = append(rows, res.Claimed...)
		if !res.NextDue.IsZero() && (rep.NextDue.IsZero() || res.NextDue.Before(rep.NextDue)) {
			rep.NextDue = res.NextDue
		}
	}
	succ := map[string]store.Claimed{} // reservations, by the row they follow
	for _, c := range rows {
		if c.After != "" {
			succ[c.After] = c
		} else {
			rep.Claimed = append(rep.Claimed, c)
		}
	}
	_, handsOff := e.st.(store.HandOffer)
	var outs []store.Outcome
	for _, c := range rep.Claimed {
		o := e.execute(ctx, c)
		// A keyed step's slot is offered to the key's next row whatever
		// the claim's hint said, so that every store is asked the same.
		o.Contended = handsOff && c.Key != ""
		next, chained := succ[c.ID]
		if !o.Contended || !chained {
			if o.Contended {
				o.Ahead = 1 // a successor for the row its slot goes to
			}
			outs = append(outs, o)
			continue
		}
		delete(succ, c.ID)
		o.Successor = refOf(next)
		so := e.execute(ctx, next)
		so.Contended, so.Ahead = true, 1
		outs = append(outs, o, so)
		rep.Chained = append(rep.Chained, next)
	}
	var back []store.ClaimRef // reservations whose predecessor did not run here
	for _, c := range succ {
		back = append(back, refOf(c))
	}
	if len(back) > 0 {
		if err := e.st.Release(ctx, e.cfg.WorkerID, back, e.storeNow()); err != nil {
			return rep, fmt.Errorf("durable: tick: release: %w", err)
		}
	}
	if len(outs) == 0 {
		return rep, nil
	}
	ran := map[store.ClaimRef]bool{}
	for _, o := range outs {
		ran[store.ClaimRef{ID: o.ID, Fence: o.Fence}] = true
	}
	var handed []store.Claimed
	hooks := commitHooks{
		committed: func(b []store.Outcome, res []store.OutcomeResult) {
			rep.Outcomes = append(rep.Outcomes, b...)
			rep.Stale += e.countStale(res)
		},
		abandoned:   func(store.Outcome) {},
		unreachable: func(error) bool { return false },
	}
	if handsOff {
		room := make(map[string]int, len(e.cfg.Queues))
		for q, n := range e.cfg.Queues {
			room[q] = n
		}
		hooks.handOff = &store.HandOff{Room: room, Workflows: workflows, Lease: e.cfg.Lease, Reserve: true, Claiming: true}
		hooks.handed = func(cs []store.Claimed, _ time.Time) {
			for _, c := range cs {
				if !ran[refOf(c)] { // a successor that ran in this round
					handed = append(handed, c)
				}
			}
		}
	}
	err = e.commitOutcomes(ctx, outs, hooks)
	e.tick.hold(handed)
	if err != nil {
		return rep, fmt.Errorf("durable: tick: complete: %w", err)
	}
	return rep, nil
}

// tickRows are the rows a Tick's commit handed to this worker (executing,
// each holding its slot, and the successors reserved for them), which
// the next Tick runs first.
type tickRows struct {
	mu   sync.Mutex
	rows []store.Claimed
}

func (t *tickRows) take() []store.Claimed {
	t.mu.Lock()
	defer t.mu.Unlock()
	rows := t.rows
	t.rows = nil
	return rows
}

func (t *tickRows) hold(rows []store.Claimed) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rows = append(t.rows, rows...)
}

// drop takes out the rows whose id matches (all when id is empty), with
// the successors reserved for them, and returns them.
func (t *tickRows) drop(id string) []store.ClaimRef {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]bool{}
	var refs []store.ClaimRef
	kept := t.rows[:0]
	for _, c := range t.rows {
		if id == "" || c.ID == id || (c.After != "" && out[c.After]) {
			out[c.ID] = true
			refs = append(refs, refOf(c))
			continue
		}
		kept = append(kept, c)
	}
	t.rows = kept
	return refs
}

// TickCanceled gives back a row that a Tick's commit handed to this worker
// and that has not run yet, once it is canceled (see durable's Cancel): a
// canceled row that has not started never starts. The successor reserved
// for it goes back too.
func (e *Runtime) TickCanceled(ctx context.Context, id string) error {
	return e.releaseTickRows(ctx, id)
}

// ReleaseTickRows gives back every row a Tick's commit handed to this
// worker that has not run yet: the live scheduler, which does not know
// them, starts instead.
func (e *Runtime) ReleaseTickRows(ctx context.Context) error { return e.releaseTickRows(ctx, "") }

func (e *Runtime) releaseTickRows(ctx context.Context, id string) error {
	refs := e.tick.drop(id)
	if len(refs) == 0 {
		return nil
	}
	return e.st.Release(ctx, e.cfg.WorkerID, refs, e.storeNow())
}
