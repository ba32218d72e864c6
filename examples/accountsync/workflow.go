package main

import (
	"context"
	"fmt"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/examples/internal/inflight"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/transitions"
)

// WorkflowName is the registered name of the account sync workflow.
const WorkflowName = "account.sync"

// SignalConfirmed is the webhook the ledger sends once it has booked a sync.
const SignalConfirmed = "ledger.confirmed"

// SyncState is the durable state of one sync of one account.
type SyncState struct {
	Account string `json:"account"`
	// Seq numbers the syncs of one account in insertion order.
	Seq int `json:"seq"`
	// Records is what fetch found upstream; Applied what apply wrote.
	Records int `json:"records"`
	Applied int `json:"applied"`
	// LedgerRef is the ledger's reference from the webhook ("" on timeout).
	LedgerRef string `json:"ledger_ref,omitempty"`
	// ConfirmedBy is "webhook" or "timeout".
	ConfirmedBy string `json:"confirmed_by,omitempty"`
}

// SyncResult is what a finished sync returns.
type SyncResult struct {
	Account     string `json:"account"`
	Seq         int    `json:"seq"`
	Applied     int    `json:"applied"`
	ConfirmedBy string `json:"confirmed_by"`
	LedgerRef   string `json:"ledger_ref,omitempty"`
}

// Confirmation is the payload of the ledger.confirmed webhook.
type Confirmation struct {
	Ref string `json:"ref"`
}

// Ledger is the downstream system apply writes to. It confirms each
// submission later, out of band, with a ledger.confirmed webhook.
type Ledger interface {
	// Submit books applied records for an account. instanceID is where the
	// webhook must go; it doubles as an idempotency key because a step may
	// run more than once.
	Submit(ctx context.Context, instanceID, account string, records int) error
}

// Service holds what the sync steps depend on. Zero durations mean "no
// simulated work", which is what unit tests want.
type Service struct {
	// Ledger receives applied records.
	Ledger Ledger
	// Recorder, if set, measures how many step bodies run at once per key.
	Recorder *inflight.Recorder
	// Work is how long fetch and apply pretend to work.
	Work time.Duration
	// ConfirmTimeout bounds the wait for the ledger's webhook (default 30s).
	ConfirmTimeout time.Duration
}

// AccountKey is the concurrency key of an account: an identity, so its name
// ("account") must stay unconfigured and every key runs at K = 1.
func AccountKey(account string) gate.ConcurrencyKey { return gate.Identity("account", account) }

// Workflow returns the sync definition:
//
//	fetch  (account key) read the account's changes upstream
//	apply  (account key) write them to the ledger, then await ledger.confirmed
//	                     with a timeout; the await releases the account's slot,
//	                     so the next sync of the account may start meanwhile
//	settle (account key) record the confirmation (or the timeout); it is
//	                     admitted through the key again, then releases it
//	wrap_up  (no key)    notify and clean up: needs no exclusion, so it runs
//	                     in parallel with the account's next sync
func (svc *Service) Workflow() *durable.Workflow[SyncState] {
	timeout := svc.ConfirmTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	return durable.NewWorkflow[SyncState](WorkflowName, "fetch", durable.WorkflowOptions{}).
		Step("fetch", func(ctx steps.Context, s SyncState) (transitions.Transition, error) {
			defer svc.enter(ctx)()
			if err := svc.work(ctx); err != nil {
				return transitions.Transition{}, err
			}
			s.Records = 10 + len(s.Account) + s.Seq
			return transitions.Next("apply", s), nil
		}).
		Step("apply", func(ctx steps.Context, s SyncState) (transitions.Transition, error) {
			defer svc.enter(ctx)()
			if err := svc.work(ctx); err != nil {
				return transitions.Transition{}, err
			}
			if err := svc.Ledger.Submit(ctx, ctx.InstanceID(), s.Account, s.Records); err != nil {
				return transitions.Transition{}, fmt.Errorf("submit to ledger: %w", err)
			}
			s.Applied = s.Records
			return transitions.Await(SignalConfirmed, "settle", s, transitions.Timeout(timeout)), nil
		}).
		Step("settle", func(ctx steps.Context, s SyncState) (transitions.Transition, error) {
			defer svc.enter(ctx)()
			if sig, ok := ctx.Signal(); ok {
				var c Confirmation
				if err := sig.Decode(&c); err != nil {
					return transitions.Stop("bad ledger.confirmed payload: " + err.Error()), nil
				}
				s.LedgerRef, s.ConfirmedBy = c.Ref, "webhook"
			} else {
				s.ConfirmedBy = "timeout"
			}
			return transitions.Next("wrap_up", s, transitions.ReleaseKey()), nil
		}).
		Step("wrap_up", func(ctx steps.Context, s SyncState) (transitions.Transition, error) {
			defer svc.enter(ctx)()
			if err := svc.work(ctx); err != nil {
				return transitions.Transition{}, err
			}
			return transitions.Done(SyncResult{Account: s.Account, Seq: s.Seq, Applied: s.Applied,
				ConfirmedBy: s.ConfirmedBy, LedgerRef: s.LedgerRef}), nil
		})
}

func (svc *Service) enter(ctx steps.Context) func() {
	if svc.Recorder == nil {
		return func() {}
	}
	return svc.Recorder.Enter(ctx.Key(), ctx.Step())
}

// work pretends to do I/O for svc.Work, and stops early if the step's
// context is cancelled (lease lost, instance cancelled, engine stopping).
func (svc *Service) work(ctx context.Context) error {
	if svc.Work <= 0 {
		return nil
	}
	t := time.NewTimer(svc.Work)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
