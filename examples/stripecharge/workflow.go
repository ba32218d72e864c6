package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/examples/internal/inflight"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/transitions"
)

// WorkflowName is the registered name of the charge workflow.
const WorkflowName = "stripe.charge"

// StripeLimit is the gate on calls to Stripe: at most 5 requests in flight
// per Stripe account, across every engine sharing the store. Its counter is
// split into 2 shards (capacities 3 and 2) so that completions do not all
// queue on one row lock; gate.ShardsFor gives the sizing rule.
var StripeLimit = gate.Limit{Name: "stripe", Limit: 5, Shards: 2}

// Errors of the Stripe API that the workflow tells apart.
var (
	// ErrRateLimited is Stripe's 429: transient, retried with backoff.
	ErrRateLimited = errors.New("stripe: 429 too many requests")
	// ErrCardDeclined is permanent: retrying cannot help.
	ErrCardDeclined = errors.New("stripe: 402 card declined")
)

// Charge is the durable state of one charge.
type Charge struct {
	Order         string `json:"order"`
	StripeAccount string `json:"stripe_account"`
	AmountCents   int64  `json:"amount_cents"`
	Currency      string `json:"currency"`
}

// Receipt is what a successful charge returns.
type Receipt struct {
	Order       string `json:"order"`
	ChargeID    string `json:"charge_id"`
	AmountCents int64  `json:"amount_cents"`
	// Attempts is how many times the charge step called Stripe.
	Attempts int `json:"attempts"`
}

// Stripe is the part of the Stripe API the workflow uses.
type Stripe interface {
	// CreateCharge charges amountCents on account. idempotencyKey makes a
	// repeated call (a step that ran twice) charge once.
	CreateCharge(ctx context.Context, idempotencyKey, account string, amountCents int64, currency string) (chargeID string, err error)
}

// Service holds what the charge steps depend on.
type Service struct {
	// Stripe is the API client.
	Stripe Stripe
	// Recorder, if set, measures how many step bodies run at once per key.
	Recorder *inflight.Recorder
	// Retry is the charge step's retry policy (default ChargeRetry()).
	Retry *steps.RetryPolicy
}

// ChargeRetry is the charge step's policy: short exponential backoff, so the
// demo finishes in seconds (a real service would start near a second).
func ChargeRetry() steps.RetryPolicy {
	return steps.RetryPolicy{MaxAttempts: 15, InitialInterval: 10 * time.Millisecond,
		MaxInterval: 200 * time.Millisecond, Multiplier: 2, RandomizationFactor: 0.5}
}

// OrderKey is an order's concurrency key: an identity (K = 1), so two
// charges of one order are never validated at the same time.
func OrderKey(order string) gate.ConcurrencyKey { return gate.Identity("order", order) }

// StripeKey is the gate key of a Stripe account: its name "stripe" has a
// limit, so up to StripeLimit.Limit charges of the account call Stripe at once.
func StripeKey(account string) gate.ConcurrencyKey { return gate.Gate("stripe", account) }

// Workflow returns the charge definition:
//
//	validate (order:<id>, K=1)    check the order; switch to the Stripe gate
//	charge   (stripe:<acct>, K=5) call Stripe; a 429 is an error, retried
//	                              with backoff (ChargeRetry) under the same key,
//	                              a decline stops the charge; success is Done
func (svc *Service) Workflow() *durable.Workflow[Charge] {
	retry := svc.Retry
	if retry == nil {
		p := ChargeRetry()
		retry = &p
	}
	return durable.NewWorkflow[Charge](WorkflowName, "validate", durable.WorkflowOptions{}).
		Step("validate", func(ctx steps.Context, c Charge) (transitions.Transition, error) {
			defer svc.enter(ctx)()
			if problem := validate(c); problem != "" {
				return transitions.Stop("invalid charge: " + problem), nil
			}
			c.Currency = strings.ToLower(c.Currency)
			return transitions.Next("charge", c, transitions.SwitchKey(StripeKey(c.StripeAccount))), nil
		}).
		StepWith("charge", func(ctx steps.Context, c Charge) (transitions.Transition, error) {
			defer svc.enter(ctx)()
			id, err := svc.Stripe.CreateCharge(ctx, "charge-"+ctx.InstanceID(), c.StripeAccount, c.AmountCents, c.Currency)
			switch {
			case errors.Is(err, ErrCardDeclined):
				return transitions.Stop(err.Error()), nil
			case err != nil:
				return transitions.Transition{}, fmt.Errorf("charge order %s: %w", c.Order, err)
			}
			return transitions.Done(Receipt{Order: c.Order, ChargeID: id, AmountCents: c.AmountCents, Attempts: ctx.Attempt() + 1}), nil
		}, steps.Options{Retry: retry, Timeout: 10 * time.Second})
}

func validate(c Charge) string {
	switch {
	case c.Order == "":
		return "no order"
	case c.StripeAccount == "":
		return "no Stripe account"
	case c.AmountCents <= 0:
		return fmt.Sprintf("amount %d is not positive", c.AmountCents)
	case len(c.Currency) != 3:
		return fmt.Sprintf("currency %q is not an ISO 4217 code", c.Currency)
	}
	return ""
}

func (svc *Service) enter(ctx steps.Context) func() {
	if svc.Recorder == nil {
		return func() {}
	}
	return svc.Recorder.Enter(ctx.Key(), ctx.Step())
}
