// Command stripecharge charges a batch of orders through a simulated Stripe
// API that allows 5 requests in flight and answers ~30% of calls with a 429.
//
// Each charge is validated under its order's identity key (order:<id>,
// K = 1), then switches its key to the Stripe gate (stripe:<account>, a
// configured limit of 5 split into 2 shards) for the API call. A 429 is
// retried with exponential backoff under the same gate. The program measures
// concurrency itself, per key, and prints it against K:
//
//	go run ./examples/stripecharge [-orders 60]
//
// It runs on the in-memory store, or on PostgreSQL when DATABASE_URL is set.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/examples/internal/exstore"
	"github.com/godurable/godurable/examples/internal/inflight"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// DemoAccount is the Stripe account every demo charge goes to.
const DemoAccount = "acct_demo"

func main() {
	var o Options
	flag.IntVar(&o.Orders, "orders", 60, "orders to charge")
	flag.IntVar(&o.Executors, "executors", 16, "steps this process runs at once")
	flag.Float64Var(&o.FailRate, "fail", 0.3, "fraction of Stripe calls answered with a 429")
	flag.DurationVar(&o.MinLatency, "min-latency", 20*time.Millisecond, "fastest Stripe call")
	flag.DurationVar(&o.MaxLatency, "max-latency", 50*time.Millisecond, "slowest Stripe call")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, closeStore, where, err := exstore.Open(ctx, "stripecharge")
	if err != nil {
		fmt.Fprintln(os.Stderr, "stripecharge:", err)
		os.Exit(1)
	}
	defer closeStore()
	o.Store, o.StoreName = st, where
	rep, err := Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stripecharge:", err)
		os.Exit(1)
	}
	rep.Print(os.Stdout)
	if rep.Failed > 0 || rep.Violations() > 0 {
		os.Exit(1)
	}
}

// Options configures one run.
type Options struct {
	// Store is where the engine keeps everything (see exstore.Open).
	Store store.Store
	// StoreName describes Store in the output (default: in-memory store).
	StoreName string
	// Orders is how many charges to run, one order each.
	Orders int
	// Executors is how many steps the engine runs at once.
	Executors int
	// FailRate is the fraction of Stripe calls answered with a 429.
	FailRate float64
	// MinLatency and MaxLatency bound a simulated Stripe call.
	MinLatency time.Duration
	MaxLatency time.Duration
	// Logger receives the engine's logs (default: warnings and errors to stderr).
	Logger *slog.Logger
}

// Report is what a run measured.
type Report struct {
	Orders, Executors int
	// StoreName says which store the run used.
	StoreName string
	// OrderKeys is how many order keys ran; OrderMax the most step bodies
	// any one of them ran at once.
	OrderKeys, OrderMax int
	// StripeKey, StripeMax and StripeK describe the Stripe gate.
	StripeKey          string
	StripeMax, StripeK int
	StripeShards       int
	// ServerMax is the most requests the simulated Stripe saw at once.
	ServerMax int
	// Calls and RateLimited count Stripe calls and 429 answers.
	Calls, RateLimited int
	// Attempts counts finished charges by the attempts they needed.
	Attempts    map[int]int
	Steps       int
	Done        int
	Failed      int
	ChargedCent int64
	Elapsed     time.Duration
}

// Violations counts keys whose measured concurrency exceeded their K.
func (r *Report) Violations() int {
	n := 0
	if r.OrderMax > 1 {
		n++
	}
	if r.StripeMax > r.StripeK || r.ServerMax > r.StripeK {
		n++
	}
	return n
}

// Run starts an engine with the Stripe gate on o.Store, inserts o.Orders
// charges, waits for all of them, stops the engine and reports.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Store == nil || o.Orders < 1 || o.Executors < 1 {
		return nil, errors.New("need a store and at least one order and executor")
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	rec := &inflight.Recorder{}
	stripe := &simStripe{minLatency: o.MinLatency, maxLatency: o.MaxLatency, failRate: o.FailRate, charged: map[string]string{}}
	svc := &Service{Stripe: stripe, Recorder: rec}
	eng, err := durable.New(durable.Config{
		Store:          o.Store,
		Queues:         map[string]int{durable.DefaultQueue: o.Executors},
		Limits:         []gate.Limit{StripeLimit},
		Strict:         true, // order is an identity, stripe a gate: refuse any mix-up
		PollInterval:   50 * time.Millisecond,
		ReaperInterval: 100 * time.Millisecond,
		Logger:         logger,
	})
	if err != nil {
		return nil, err
	}
	if err := eng.Register(svc.Workflow()); err != nil {
		return nil, err
	}

	start := time.Now()
	if err := eng.Start(ctx); err != nil {
		return nil, err
	}
	reqs := make([]durable.InsertRequest, o.Orders)
	for i := range reqs {
		order := strconv.Itoa(1001 + i)
		reqs[i] = durable.InsertRequest{Workflow: WorkflowName,
			State:   Charge{Order: order, StripeAccount: DemoAccount, AmountCents: int64(500 + 125*(i%9)), Currency: "EUR"},
			Options: durable.InsertOptions{Key: OrderKey(order)}}
	}
	ids, err := eng.InsertMany(ctx, reqs)
	if err != nil {
		_ = eng.Stop(ctx)
		return nil, err
	}

	rep := &Report{Orders: o.Orders, Executors: o.Executors, StoreName: o.storeName(), Attempts: map[int]int{}}
	var waitErr error
	for _, id := range ids {
		receipt, err := durable.Result[Receipt](ctx, eng, id)
		if errors.Is(err, durable.ErrFailed) {
			rep.Failed++
			logger.Error("charge failed", "instance", id, "err", err)
			continue
		}
		if err != nil {
			waitErr = err
			break
		}
		rep.Done++
		rep.Attempts[receipt.Attempts]++
		rep.ChargedCent += receipt.AmountCents
	}
	rep.Elapsed = time.Since(start)
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Stop(stopCtx); err != nil {
		return nil, err
	}
	if waitErr != nil {
		return nil, fmt.Errorf("waiting for results: %w", waitErr)
	}

	stripeKey := StripeKey(DemoAccount).String()
	for _, k := range rec.Keys() {
		if gate.NameOf(k) == "order" {
			rep.OrderKeys++
			rep.OrderMax = max(rep.OrderMax, rec.Max(k))
		}
	}
	rep.StripeKey, rep.StripeMax, rep.StripeK, rep.StripeShards = stripeKey, rec.Max(stripeKey), StripeLimit.Limit, StripeLimit.Shards
	rep.ServerMax = stripe.inflight.Max(DemoAccount)
	rep.Calls, rep.RateLimited = int(stripe.calls.Load()), int(stripe.limited.Load())
	rep.Steps = rec.TotalSteps()
	return rep, nil
}

// Print writes the report.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "stripecharge: %d orders, %d executors, %s\n\n", r.Orders, r.Executors, r.StoreName)
	fmt.Fprintf(w, "per key:\n")
	fmt.Fprintf(w, "  order:*            %2d identity keys  max concurrent %d (K=1 each, no limit configured)  %s\n",
		r.OrderKeys, r.OrderMax, verdict(r.OrderMax <= 1))
	fmt.Fprintf(w, "  %-18s gate, %d shards    max concurrent %d (K=%d)  %s\n",
		r.StripeKey, r.StripeShards, r.StripeMax, r.StripeK, verdict(r.StripeMax <= r.StripeK))
	fmt.Fprintf(w, "  simulated Stripe saw at most %d requests in flight at once (the gate allows %d)\n\n", r.ServerMax, r.StripeK)
	fmt.Fprintf(w, "retries: %d Stripe calls, %d answered 429 and retried with backoff\n", r.Calls, r.RateLimited)
	fmt.Fprintf(w, "attempts per charge: %s\n", attemptsLine(r.Attempts))
	fmt.Fprintf(w, "totals: %d instances, %d steps, %d done, %d failed, %.2f EUR charged\n",
		r.Done+r.Failed, r.Steps, r.Done, r.Failed, float64(r.ChargedCent)/100)
	fmt.Fprintf(w, "elapsed: %s\n", r.Elapsed.Round(time.Millisecond))
}

func verdict(ok bool) string {
	if ok {
		return "ok"
	}
	return "VIOLATION"
}

func attemptsLine(m map[int]int) string {
	top := 0
	for a := range m {
		top = max(top, a)
	}
	var parts []string
	for a := 1; a <= top; a++ {
		if m[a] > 0 {
			parts = append(parts, fmt.Sprintf("%d×%d", m[a], a))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ") + " (charges × attempts)"
}

// simStripe plays Stripe: each call takes a random latency, a fraction is
// answered with a 429, and an idempotency key charges once. It measures the
// requests in flight per account from its own side.
type simStripe struct {
	minLatency, maxLatency time.Duration
	failRate               float64

	inflight inflight.Recorder
	calls    atomic.Int64
	limited  atomic.Int64

	mu      sync.Mutex
	charged map[string]string // idempotency key -> charge id
	next    int
}

func (s *simStripe) CreateCharge(ctx context.Context, idempotencyKey, account string, amountCents int64, currency string) (string, error) {
	defer s.inflight.Enter(account, "charge")()
	s.calls.Add(1)
	latency := s.minLatency
	if s.maxLatency > s.minLatency {
		latency += rand.N(s.maxLatency - s.minLatency)
	}
	t := time.NewTimer(latency)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	if rand.Float64() < s.failRate {
		s.limited.Add(1)
		return "", ErrRateLimited
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.charged[idempotencyKey]; ok {
		return id, nil
	}
	s.next++
	id := fmt.Sprintf("ch_%06d", s.next)
	s.charged[idempotencyKey] = id
	return id, nil
}

func (o Options) storeName() string {
	if o.StoreName == "" {
		return "in-memory store"
	}
	return o.StoreName
}
