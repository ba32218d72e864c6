package runtime

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/godurable/godurable/store"
)

// Round is what one Tick did (durable.TickReport has the same fields).
type Round struct {
	// Claimed are the rows claimed in this round, in claim order, across
	// queues (sorted by queue name). They all held their slots at once.
	Claimed []store.Claimed
	// Outcomes are the committed outcomes, in the same order (an outcome
	// the store refused for its data is replaced by the failure it became;
	// one refused even so is left out, its claim left to the reaper).
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

// Tick runs one synchronous scheduling round without goroutines: it fires
// due schedule ticks and due timers, claims up to each queue's executor count, runs the claimed
// steps one after another in claim order, and commits all their outcomes as
// one batch. The rows of one round held their slots at the same time, as if
// they ran in parallel. The caller makes sure that no scheduler runs.
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
	queues := make([]string, 0, len(e.cfg.Queues))
	for q := range e.cfg.Queues {
		queues = append(queues, q)
	}
	sort.Strings(queues)
	workflows := e.workflowNames()
	for _, q := range queues {
		res, err := e.st.Claim(ctx, e.claimRequest(q, e.cfg.Queues[q], workflows))
		if err != nil {
			return rep, fmt.Errorf("durable: tick: claim %s: %w", q, err)
		}
		rep.Claimed = append(rep.Claimed, res.Claimed...)
		if !res.NextDue.IsZero() && (rep.NextDue.IsZero() || res.NextDue.Before(rep.NextDue)) {
			rep.NextDue = res.NextDue
		}
	}
	var outs []store.Outcome
	for _, c := range rep.Claimed {
		outs = append(outs, e.execute(ctx, c))
	}
	if len(outs) == 0 {
		return rep, nil
	}
	err = e.commitOutcomes(ctx, outs, commitHooks{
		committed: func(b []store.Outcome, res []store.OutcomeResult) {
			rep.Outcomes = append(rep.Outcomes, b...)
			rep.Stale += e.countStale(res)
		},
		abandoned:   func(store.Outcome) {},
		unreachable: func(error) bool { return false },
	})
	if err != nil {
		return rep, fmt.Errorf("durable: tick: complete: %w", err)
	}
	return rep, nil
}
