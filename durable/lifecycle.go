package durable

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// Start syncs the configured limits to the store, reclaims claims left by a
// dead predecessor with the same WorkerID, and starts the scheduler. A limit
// change that alters keys held by live instances is logged with the number
// of instances affected, or refused in Strict mode.
func (e *Engine) Start(ctx context.Context) error {
	e.mu.Lock()
	if e.state != 0 {
		e.mu.Unlock()
		if e.state == 2 {
			return ErrStopped
		}
		return fmt.Errorf("durable: engine already started")
	}
	e.mu.Unlock()
	if err := e.syncLimits(ctx); err != nil {
		return err
	}
	if n, err := e.st.ReclaimWorker(ctx, e.cfg.WorkerID, e.storeNow()); err != nil {
		return fmt.Errorf("durable: start: reclaim: %w", err)
	} else if n > 0 {
		e.log.Warn("reclaimed claims of a previous run of this worker", "n", n)
	}
	s := newScheduler(e)
	e.mu.Lock()
	e.sched, e.state = s, 1
	e.mu.Unlock()
	s.start()
	return nil
}

func (e *Engine) syncLimits(ctx context.Context) error {
	if e.cfg.Strict {
		// Check before writing: a refused change must not be stored.
		stored, err := e.st.Limits(ctx)
		if err != nil {
			return fmt.Errorf("durable: start: read limits: %w", err)
		}
		old, err := gate.NewLimits(stored)
		if err != nil {
			return fmt.Errorf("durable: start: stored limits: %w", err)
		}
		if changes := gate.Diff(old, e.limits); len(changes) > 0 {
			live, err := e.liveByName(ctx, changes)
			if err != nil {
				return err
			}
			for _, c := range changes {
				if live[c.Name] > 0 {
					return fmt.Errorf("durable: start: %w", c.LiveWarning(live[c.Name]).Error())
				}
			}
		}
	}
	res, err := e.st.SyncLimits(ctx, e.limits.All())
	if err != nil {
		return fmt.Errorf("durable: start: sync limits: %w", err)
	}
	for _, c := range res.Changes {
		if n := res.Live[c.Name]; n > 0 {
			w := c.LiveWarning(n)
			e.mu.Lock()
			e.warned[string(w.Kind)+"/"+w.Name] = true
			e.mu.Unlock()
			e.log.Warn("concurrency limit change alters live keys", "name", c.Name, "old_k", c.OldK, "new_k", c.NewK, "live_instances", n)
		}
	}
	return nil
}

// liveByName counts live instances per changed key name, using SyncLimits'
// dry run is not part of the contract, so it lists instances by key name.
func (e *Engine) liveByName(ctx context.Context, changes []gate.Change) (map[string]int64, error) {
	out := map[string]int64{}
	for _, st := range []store.Status{store.StatusReady, store.StatusBlocked, store.StatusExecuting, store.StatusAwaiting, store.StatusChildren} {
		after := ""
		for {
			page, err := e.st.List(ctx, store.ListFilter{Status: st, AfterID: after, Limit: 1000})
			if err != nil {
				return nil, fmt.Errorf("durable: start: count live keys: %w", err)
			}
			for _, in := range page {
				for _, c := range changes {
					if in.Key != "" && gate.NameOf(in.Key) == c.Name {
						out[c.Name]++
					}
				}
			}
			if len(page) < 1000 {
				break
			}
			after = page[len(page)-1].ID
		}
	}
	return out, nil
}

// Stop stops claiming, releases claimed rows that have not started, lets
// running steps finish until ctx's deadline (then cancels them and releases
// their claims), commits their outcomes, and closes nothing else: the store
// stays open for its owner to close. Stop returns by ctx's deadline even if
// the store is unreachable; outcomes it could not commit are not lost but
// re-run (their claims expire and the reaper retries the steps). Calling Stop again, even concurrently,
// waits for the first call to finish (or for its own ctx) and returns nil.
func (e *Engine) Stop(ctx context.Context) error {
	e.mu.Lock()
	if e.state == 2 {
		done := e.stopDone
		e.mu.Unlock()
		if done != nil {
			select {
			case <-done:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	s := e.sched
	e.state = 2
	done := make(chan struct{})
	e.stopDone = done
	e.mu.Unlock()
	defer close(done)
	if s == nil {
		return nil
	}
	return s.stop(ctx)
}

// StaleOutcomes returns how many outcomes of this engine were discarded
// because their claim was no longer current.
func (e *Engine) StaleOutcomes() int64 {
	e.mu.RLock()
	s := e.sched
	e.mu.RUnlock()
	if s == nil {
		return 0
	}
	return s.staleOutcomes.Load()
}

// TickReport is what one Tick did.
type TickReport struct {
	// Claimed are the rows claimed in this round, in claim order, across
	// queues (sorted by queue name). They all held their slots at once.
	Claimed []store.Claimed
	// Outcomes are the committed outcomes, in the same order.
	Outcomes []store.Outcome
	// Stale counts outcomes that did not commit.
	Stale int
	// Fired counts await timeouts that fired before the claim.
	Fired int
	// NextDue is the earliest future time a row becomes eligible or an
	// await times out, over all queues (zero: none known).
	NextDue time.Time
}

// Tick runs one synchronous scheduling round without goroutines: it fires
// due timers, claims up to each queue's executor count, runs the claimed
// steps one after another in claim order, and commits all their outcomes as
// one batch. The rows of one round held their slots at the same time, as if
// they ran in parallel. It is the deterministic driver behind durabletest;
// it refuses to run on a started engine.
func (e *Engine) Tick(ctx context.Context) (TickReport, error) {
	var rep TickReport
	e.mu.RLock()
	state := e.state
	e.mu.RUnlock()
	if state != 0 {
		return rep, fmt.Errorf("durable: tick: engine is started or stopped")
	}
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
		res, err := e.st.Claim(ctx, store.ClaimRequest{Queue: q, Worker: e.cfg.WorkerID, Limit: e.cfg.Queues[q],
			Lease: e.cfg.Lease, Now: e.storeNow(), Workflows: workflows})
		if err != nil {
			return rep, fmt.Errorf("durable: tick: claim %s: %w", q, err)
		}
		rep.Claimed = append(rep.Claimed, res.Claimed...)
		if !res.NextDue.IsZero() && (rep.NextDue.IsZero() || res.NextDue.Before(rep.NextDue)) {
			rep.NextDue = res.NextDue
		}
	}
	for _, c := range rep.Claimed {
		rep.Outcomes = append(rep.Outcomes, e.execute(ctx, c))
	}
	if len(rep.Outcomes) == 0 {
		return rep, nil
	}
	res, err := e.st.Complete(ctx, e.cfg.WorkerID, rep.Outcomes, e.storeNow())
	if err != nil {
		return rep, fmt.Errorf("durable: tick: complete: %w", err)
	}
	for _, r := range res {
		if r.Stale {
			rep.Stale++
		}
	}
	return rep, nil
}
