// Package runtime runs the steps of a durable.Engine: the live scheduler
// (pick loops, executors, the flusher, heartbeats, the lease watchdog, the
// maintenance and schedule loops, store outage handling) and Tick, the
// synchronous round behind durabletest. Both claim, run and commit through
// the same code (claimRequest, Host.Execute, commitOutcomes).
//
// Package durable keeps the public API and the workflow registry; it runs
// the steps, fires schedules and reconciles for the runtime through Host.
package runtime

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/metric"

	"github.com/godurable/godurable/store"
)

// Host is the engine the runtime runs: what it needs of package durable.
type Host interface {
	// Execute runs one claimed step to completion and returns the outcome
	// to commit. It never panics and never blocks beyond the step itself.
	Execute(ctx context.Context, c store.Claimed) store.Outcome
	// Workflows are the registered versions of the registered workflows,
	// sorted: a claim takes only their rows.
	Workflows() []store.WorkflowVersion
	// StoreNow is the "now" passed to the store: zero (the store's own
	// clock) unless a fake clock is configured.
	StoreNow() time.Time
	// FireSchedules fires the engine's due schedule ticks.
	FireSchedules(ctx context.Context) ScheduleRound
	// Reconcile runs the reconciler and retention sweep and records what
	// it did (the caller holds the maintenance lease).
	Reconcile(ctx context.Context) (store.ReconcileReport, error)
	// Flushed is called after every batch of outcomes the live scheduler
	// committed.
	Flushed()
}

// ScheduleRound is what one Host.FireSchedules did.
type ScheduleRound struct {
	// Started counts the instances started.
	Started int
	// Next is when a schedule is next due (zero: none).
	Next time.Time
	// StoreErr is the first store call that failed (the loop retries with
	// the engine's outage handling); Errs are the schedules that could not
	// fire for another reason (their state, an unknown workflow).
	StoreErr error
	Errs     error
}

// Config is what the runtime reads of the engine's configuration (see
// durable.Config, whose defaults are applied).
type Config struct {
	Store store.Store
	// Logger is the engine's logger (with its worker id).
	Logger *slog.Logger
	Clock  interface{ Now() time.Time }

	WorkerID          string
	Queues            map[string]int
	Lease             time.Duration
	HeartbeatInterval time.Duration
	PollInterval      time.Duration
	MaxFlushBatch     int
	ReaperInterval    time.Duration
	ReconcileInterval time.Duration
	// Schedules is true when the engine has schedules to fire (the
	// schedule loop runs).
	Schedules bool
	// MaxErrorLength is the longest error text stored (durable.MaxErrorLength).
	MaxErrorLength int

	// StaleCounter and ReapedCounter are the engine's metrics of stale
	// outcomes and reaped leases.
	StaleCounter, ReapedCounter metric.Int64Counter
}

// Runtime is the runtime of one engine, from New on: Tick drives it
// synchronously, or NewScheduler makes the live scheduler.
type Runtime struct {
	cfg Config
	st  store.Store
	log *slog.Logger
	h   Host
	tel telemetry

	outage        *storeOutage
	staleOutcomes atomic.Int64
	tick          tickRows // rows handed to Tick's next round
}

// telemetry holds the runtime's instruments.
type telemetry struct {
	stale, reaped metric.Int64Counter
}

// New returns the runtime of the engine h configured by cfg.
func New(cfg Config, h Host) *Runtime {
	return &Runtime{cfg: cfg, st: cfg.Store, log: cfg.Logger, h: h,
		tel:    telemetry{stale: cfg.StaleCounter, reaped: cfg.ReapedCounter},
		outage: &storeOutage{log: cfg.Logger}}
}

// NewScheduler returns the live scheduler, not yet started.
func (e *Runtime) NewScheduler() *Scheduler { return newScheduler(e) }

// StaleOutcomes returns how many outcomes were discarded because their
// claim was no longer current.
func (e *Runtime) StaleOutcomes() int64 { return e.staleOutcomes.Load() }

func (e *Runtime) execute(ctx context.Context, c store.Claimed) store.Outcome {
	return e.h.Execute(ctx, c)
}
func (e *Runtime) workflowVersions() []store.WorkflowVersion       { return e.h.Workflows() }
func (e *Runtime) storeNow() time.Time                             { return e.h.StoreNow() }
func (e *Runtime) notifyFlushed()                                  { e.h.Flushed() }
func (e *Runtime) fireSchedules(ctx context.Context) ScheduleRound { return e.h.FireSchedules(ctx) }
func (e *Runtime) reconcile(ctx context.Context) (store.ReconcileReport, error) {
	return e.h.Reconcile(ctx)
}

// claimRequest is the claim of up to limit rows of queue, for the
// registered workflows, by the live pick loops and by Tick alike.
func (e *Runtime) claimRequest(queue string, limit int, workflows []store.WorkflowVersion) store.ClaimRequest {
	return store.ClaimRequest{Queue: queue, Worker: e.cfg.WorkerID, Limit: limit,
		Lease: e.cfg.Lease, Now: e.storeNow(), Workflows: workflows}
}

// CleanText makes free text (an error message, a stop reason) storable
// anywhere: invalid UTF-8 and NUL characters become U+FFFD, and text longer
// than max bytes is cut at a rune boundary with a marker.
func CleanText(s string, max int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…(truncated)"
	}
	return s
}
