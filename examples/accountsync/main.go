// Command accountsync is a small account synchronisation service built on
// godurable. Each sync of an account fetches its changes, applies them to a
// ledger, waits for the ledger's ledger.confirmed webhook (with a timeout),
// settles, and wraps up.
//
// Every sync carries the concurrency key account:<id>, an identity with no
// configured limit, so K = 1: two syncs of one account never run a step at
// the same time, while different accounts run in parallel. The await
// releases the account's slot, so the next sync of the account can start
// while the ledger thinks; the wrap-up step releases the key altogether.
//
// The program measures concurrency itself, with a recorder around every step
// body, and prints what it saw per key:
//
//	go run ./examples/accountsync [-syncs 40] [-accounts 8]
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
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/examples/internal/exstore"
	"github.com/godurable/godurable/examples/internal/inflight"
	"github.com/godurable/godurable/store"
)

func main() {
	var o Options
	flag.IntVar(&o.Syncs, "syncs", 40, "syncs to run")
	flag.IntVar(&o.Accounts, "accounts", 8, "accounts the syncs are spread over")
	flag.IntVar(&o.Executors, "executors", 16, "steps this process runs at once")
	flag.DurationVar(&o.Work, "work", 5*time.Millisecond, "simulated work per fetch, apply and wrap_up step")
	flag.DurationVar(&o.ConfirmTimeout, "confirm-timeout", 300*time.Millisecond, "how long a sync waits for the ledger webhook")
	flag.DurationVar(&o.MaxWebhookDelay, "webhook-delay", 100*time.Millisecond, "the ledger's webhooks arrive after a random delay up to this")
	flag.Float64Var(&o.DropRate, "drop", 0.1, "fraction of webhooks the ledger never sends (those syncs time out)")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, closeStore, where, err := exstore.Open(ctx, "accountsync")
	if err != nil {
		fmt.Fprintln(os.Stderr, "accountsync:", err)
		os.Exit(1)
	}
	defer closeStore()
	o.Store, o.StoreName = st, where
	rep, err := Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "accountsync:", err)
		os.Exit(1)
	}
	rep.Print(os.Stdout)
	if rep.Failed > 0 || rep.Violations() > 0 {
		os.Exit(1)
	}
}

// Options configures one run of the service.
type Options struct {
	// Store is where the engine keeps everything (see exstore.Open).
	Store store.Store
	// StoreName describes Store in the output (default: in-memory store).
	StoreName string
	// Syncs are spread round-robin over Accounts accounts.
	Syncs    int
	Accounts int
	// Executors is how many steps the engine runs at once.
	Executors int
	// Work is the simulated work of fetch, apply and wrap_up.
	Work time.Duration
	// ConfirmTimeout bounds each sync's wait for its webhook.
	ConfirmTimeout time.Duration
	// MaxWebhookDelay bounds the simulated ledger's random webhook delay.
	MaxWebhookDelay time.Duration
	// DropRate is the fraction of webhooks the ledger never sends.
	DropRate float64
	// Logger receives the engine's logs (default: warnings and errors to stderr).
	Logger *slog.Logger
}

// Report is what a run measured.
type Report struct {
	Syncs, Accounts, Executors int
	// Keys are the keys step bodies ran under, with what the recorder saw.
	Keys []KeyReport
	// NoKeyMax is the most wrap_up steps (no key) that ran at once.
	NoKeyMax, NoKeySteps int
	// Peak is the most step bodies that ran at once over all keys.
	Peak int
	// StepCounts is how many times each step ran.
	StepCounts          map[string]int
	Steps               int
	Done, Failed        int
	ByWebhook, TimedOut int
	Elapsed             time.Duration
	// StoreName says which store the run used.
	StoreName string
}

// KeyReport is one key's line of the report.
type KeyReport struct {
	Key   string
	Syncs int
	Steps int
	Max   int
	K     int
	// Parked is the most syncs of the key that waited for their webhook at
	// once: more than one means the await gave the slot back.
	Parked int
}

// Violations counts keys whose measured concurrency exceeded their K.
func (r *Report) Violations() int {
	n := 0
	for _, k := range r.Keys {
		if k.Max > k.K {
			n++
		}
	}
	return n
}

// Run starts an engine on o.Store, inserts o.Syncs syncs spread round-robin
// over o.Accounts accounts, plays the ledger (webhooks after a random delay,
// some dropped), waits for every sync, stops the engine and reports.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Store == nil || o.Syncs < 1 || o.Accounts < 1 || o.Executors < 1 {
		return nil, errors.New("need a store and at least one sync, account and executor")
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	rec := &inflight.Recorder{}
	ledger := newLedger(o.MaxWebhookDelay, o.DropRate)
	svc := &Service{Ledger: ledger, Recorder: rec, Work: o.Work, ConfirmTimeout: o.ConfirmTimeout}

	eng, err := durable.New(durable.Config{
		Store:          o.Store,
		Queues:         map[string]int{durable.DefaultQueue: o.Executors},
		Strict:         true, // "account" is an identity: refuse any limit that would capture it
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
	ledger.send = func(id string, c Confirmation) {
		err := eng.Signal(context.Background(), id, SignalConfirmed, c, durable.SignalOptions{DedupKey: "ledger:" + id})
		if err != nil && !errors.Is(err, store.ErrTerminal) && !errors.Is(err, durable.ErrStopped) {
			logger.Warn("webhook not delivered", "instance", id, "err", err)
		}
	}

	start := time.Now()
	if err := eng.Start(ctx); err != nil {
		return nil, err
	}
	reqs := make([]durable.InsertRequest, o.Syncs)
	seq := map[string]int{}
	for i := range reqs {
		account := strconv.Itoa(i%o.Accounts + 1)
		seq[account]++
		reqs[i] = durable.InsertRequest{Workflow: WorkflowName,
			State:   SyncState{Account: account, Seq: seq[account]},
			Options: durable.InsertOptions{Key: AccountKey(account)}}
	}
	ids, err := eng.InsertMany(ctx, reqs)
	if err != nil {
		_ = eng.Stop(ctx)
		return nil, err
	}

	rep := &Report{Syncs: o.Syncs, Accounts: o.Accounts, Executors: o.Executors, StepCounts: map[string]int{},
		StoreName: o.storeName()}
	syncs := map[string]int{}
	var waitErr error
	for _, id := range ids {
		res, err := durable.Result[SyncResult](ctx, eng, id)
		if errors.Is(err, durable.ErrFailed) {
			rep.Failed++
			logger.Error("sync failed", "instance", id, "err", err)
			continue
		}
		if err != nil {
			waitErr = err
			break
		}
		rep.Done++
		syncs[AccountKey(res.Account).String()]++
		if res.ConfirmedBy == "webhook" {
			rep.ByWebhook++
		} else {
			rep.TimedOut++
		}
	}
	rep.Elapsed = time.Since(start)
	ledger.wait()
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Stop(stopCtx); err != nil {
		return nil, err
	}
	if waitErr != nil {
		return nil, fmt.Errorf("waiting for results: %w", waitErr)
	}

	for _, k := range rec.Keys() {
		if k == inflight.NoKey {
			rep.NoKeyMax, rep.NoKeySteps = rec.Max(k), rec.Entered(k)
			continue
		}
		rep.Keys = append(rep.Keys, KeyReport{Key: k, Syncs: syncs[k], Steps: rec.Entered(k), Max: rec.Max(k), K: 1,
			Parked: ledger.parked.Max(k)})
	}
	for _, s := range []string{"fetch", "apply", "settle", "wrap_up"} {
		rep.StepCounts[s] = rec.Steps(s)
	}
	rep.Steps, rep.Peak = rec.TotalSteps(), rec.Peak()
	return rep, nil
}

// Print writes the report.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "accountsync: %d syncs over %d accounts, %d executors, %s\n\n", r.Syncs, r.Accounts, r.Executors, r.StoreName)
	fmt.Fprintf(w, "per key (identity keys, no limit configured => K=1):\n")
	for _, k := range r.Keys {
		verdict := "ok"
		if k.Max > k.K {
			verdict = "VIOLATION"
		}
		fmt.Fprintf(w, "  %-10s  syncs %d  steps %2d  max concurrent %d (K=%d)  %s   awaiting webhook at once: %d\n",
			k.Key, k.Syncs, k.Steps, k.Max, k.K, verdict, k.Parked)
	}
	fmt.Fprintf(w, "  %-10s  wrap_up steps %d after ReleaseKey(): max concurrent %d (no limit)\n", inflight.NoKey, r.NoKeySteps, r.NoKeyMax)
	fmt.Fprintf(w, "  all keys    peak step bodies running at once: %d (accounts run in parallel)\n", r.Peak)
	fmt.Fprintf(w, "  (an await gives the account's slot back: while one sync waits for its webhook the next one runs)\n\n")
	names := make([]string, 0, len(r.StepCounts))
	for s := range r.StepCounts {
		names = append(names, s)
	}
	sort.Slice(names, func(i, j int) bool { return stepOrder[names[i]] < stepOrder[names[j]] })
	fmt.Fprintf(w, "totals: %d instances, %d steps (", r.Done+r.Failed, r.Steps)
	for i, s := range names {
		if i > 0 {
			fmt.Fprint(w, ", ")
		}
		fmt.Fprintf(w, "%s %d", s, r.StepCounts[s])
	}
	fmt.Fprintf(w, "), %d done, %d failed\n", r.Done, r.Failed)
	fmt.Fprintf(w, "ledger: %d confirmed by webhook, %d timed out waiting (webhook dropped)\n", r.ByWebhook, r.TimedOut)
	fmt.Fprintf(w, "elapsed: %s\n", r.Elapsed.Round(time.Millisecond))
}

var stepOrder = map[string]int{"fetch": 0, "apply": 1, "settle": 2, "wrap_up": 3}

// simLedger plays the ledger: each submission is confirmed by a webhook
// after a random delay, except a fraction that is never confirmed.
type simLedger struct {
	maxDelay time.Duration
	dropRate float64
	send     func(id string, c Confirmation)
	// parked counts, per account key, submissions whose webhook is pending.
	parked inflight.Recorder

	mu      sync.Mutex
	seen    map[string]bool
	pending sync.WaitGroup
}

func newLedger(maxDelay time.Duration, dropRate float64) *simLedger {
	return &simLedger{maxDelay: maxDelay, dropRate: dropRate, seen: map[string]bool{}}
}

// Submit schedules the webhook. A repeated submission of one instance (a
// step that ran twice) is booked once, like an idempotency key would.
func (l *simLedger) Submit(_ context.Context, instanceID, account string, records int) error {
	l.mu.Lock()
	dup := l.seen[instanceID]
	l.seen[instanceID] = true
	l.mu.Unlock()
	if dup || rand.Float64() < l.dropRate {
		return nil
	}
	delay := time.Duration(0)
	if l.maxDelay > 0 {
		delay = rand.N(l.maxDelay)
	}
	ref := fmt.Sprintf("L-%s-%d", account, records)
	l.pending.Add(1)
	unpark := l.parked.Enter(AccountKey(account).String(), "await")
	time.AfterFunc(delay, func() {
		defer l.pending.Done()
		l.send(instanceID, Confirmation{Ref: ref})
		unpark()
	})
	return nil
}

// wait blocks until every scheduled webhook was sent.
func (l *simLedger) wait() { l.pending.Wait() }

func (o Options) storeName() string {
	if o.StoreName == "" {
		return "in-memory store"
	}
	return o.StoreName
}
