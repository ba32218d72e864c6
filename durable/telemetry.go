package durable

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/godurable/godurable/store"
)

// instrumentationName names the tracer and meter of the engine.
const instrumentationName = "github.com/godurable/godurable/durable"

// Attribute keys. Metric attributes carry workflow, step, queue, outcome and
// gate name only — never an instance id or a key's value. The instance id
// and attempt go on spans.
const (
	AttrWorkflow   = attribute.Key("durable.workflow")
	AttrStep       = attribute.Key("durable.step")
	AttrQueue      = attribute.Key("durable.queue")
	AttrOutcome    = attribute.Key("durable.outcome")
	AttrAttempt    = attribute.Key("durable.attempt")
	AttrInstanceID = attribute.Key("durable.instance_id")
	AttrGate       = attribute.Key("durable.gate")
	// AttrState is the row state a queue depth gauge counts: ready,
	// scheduled, blocked, executing, awaiting or failed.
	AttrState = attribute.Key("durable.state")
	// AttrSchedule is a schedule's name (the schedule metrics).
	AttrSchedule = attribute.Key("durable.schedule")
	// AttrReason is why a schedule's tick started nothing
	// (durable.schedule.skips): ScheduleSkipMissed, ScheduleSkipRunning or
	// ScheduleSkipDuplicate.
	AttrReason = attribute.Key("durable.reason")
)

// The reasons of durable.schedule.skips (AttrReason).
const (
	// ScheduleSkipMissed: missed ticks recorded without a run
	// (CatchUpSkip), one count per recorded skip.
	ScheduleSkipMissed = "missed"
	// ScheduleSkipRunning: a tick recorded while the previous tick's
	// instance still ran (OverlapSkip).
	ScheduleSkipRunning = "running"
	// ScheduleSkipDuplicate: a tick whose instance already existed (its
	// unique key was taken).
	ScheduleSkipDuplicate = "duplicate"
)

// telemetry holds the engine's instruments.
type telemetry struct {
	meter        metric.Meter
	tracer       trace.Tracer
	steps        metric.Int64Counter
	stale        metric.Int64Counter
	reaped       metric.Int64Counter
	stepDuration metric.Float64Histogram
	queueLatency metric.Float64Histogram
	// The schedule metrics: ticks this engine recorded that started an
	// instance, or nothing, and how late after its time each was recorded.
	scheduleFires    metric.Int64Counter
	scheduleSkips    metric.Int64Counter
	scheduleLateness metric.Float64Histogram

	// noopTrace and noopMetrics say that the providers are OpenTelemetry's
	// no-op ones (the default): a step's telemetry is then skipped, as it
	// would record nothing.
	noopTrace, noopMetrics bool
	// stepSets holds the attribute sets of the step metrics by workflow,
	// step, queue and outcome: building a set sorts and copies its
	// attributes, for every step otherwise. The map is replaced, never
	// changed, so that a step reads it without a lock.
	stepSets   atomic.Pointer[map[stepSetKey]*stepSets]
	stepSetsMu sync.Mutex
}

// maxStepSets bounds the cached attribute sets; past it, the sets of a new
// combination are built for each step (as they always were).
const maxStepSets = 1024

type stepSetKey struct{ workflow, step, queue, outcome string }

// stepSets are the measurement options of one step's metrics.
type stepSets struct {
	steps, duration, latency metric.MeasurementOption
}

// stepSetsOf returns the attribute sets of a step's metrics.
func (t *telemetry) stepSetsOf(c store.Claimed, outcome string) *stepSets {
	k := stepSetKey{c.Workflow, c.Step, c.Queue, outcome}
	if m := t.stepSets.Load(); m != nil {
		if s, ok := (*m)[k]; ok {
			return s
		}
	}
	s := &stepSets{
		steps:    metric.WithAttributes(AttrWorkflow.String(c.Workflow), AttrStep.String(c.Step), AttrQueue.String(c.Queue), AttrOutcome.String(outcome)),
		duration: metric.WithAttributes(AttrWorkflow.String(c.Workflow), AttrStep.String(c.Step), AttrQueue.String(c.Queue)),
		latency:  metric.WithAttributes(AttrWorkflow.String(c.Workflow), AttrQueue.String(c.Queue)),
	}
	t.stepSetsMu.Lock()
	defer t.stepSetsMu.Unlock()
	old := t.stepSets.Load()
	if old != nil {
		if s, ok := (*old)[k]; ok {
			return s
		}
		if len(*old) >= maxStepSets {
			return s
		}
	}
	m := map[stepSetKey]*stepSets{}
	if old != nil {
		m = maps.Clone(*old)
	}
	m[k] = s
	t.stepSets.Store(&m)
	return s
}

func newTelemetry(tp trace.TracerProvider, mp metric.MeterProvider) (*telemetry, error) {
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	m := mp.Meter(instrumentationName)
	t := &telemetry{meter: m, tracer: tp.Tracer(instrumentationName)}
	_, t.noopTrace = tp.(tracenoop.TracerProvider)
	_, t.noopMetrics = mp.(metricnoop.MeterProvider)
	var err error
	if t.steps, err = m.Int64Counter("durable.steps", metric.WithDescription("Steps run, by workflow, step, queue and outcome."), metric.WithUnit("{step}")); err != nil {
		return nil, err
	}
	if t.stale, err = m.Int64Counter("durable.outcomes.stale", metric.WithDescription("Outcomes discarded because their claim was no longer current."), metric.WithUnit("{outcome}")); err != nil {
		return nil, err
	}
	if t.reaped, err = m.Int64Counter("durable.leases.reaped", metric.WithDescription("Claims taken back after their lease expired."), metric.WithUnit("{claim}")); err != nil {
		return nil, err
	}
	if t.stepDuration, err = m.Float64Histogram("durable.step.duration", metric.WithDescription("Time a step ran."), metric.WithUnit("s")); err != nil {
		return nil, err
	}
	if t.queueLatency, err = m.Float64Histogram("durable.queue.latency", metric.WithDescription("Time from a row becoming ready to its step starting."), metric.WithUnit("s")); err != nil {
		return nil, err
	}
	if t.scheduleFires, err = m.Int64Counter("durable.schedule.fires",
		metric.WithDescription("Schedule ticks this engine recorded that started an instance, by schedule and workflow."), metric.WithUnit("{tick}")); err != nil {
		return nil, err
	}
	if t.scheduleSkips, err = m.Int64Counter("durable.schedule.skips",
		metric.WithDescription("Schedule ticks this engine recorded that started nothing, by schedule, workflow and reason (missed, running, duplicate)."),
		metric.WithUnit("{tick}")); err != nil {
		return nil, err
	}
	if t.scheduleLateness, err = m.Float64Histogram("durable.schedule.lateness",
		metric.WithDescription("How long after its time a schedule tick was recorded, fired or skipped, by schedule and workflow."), metric.WithUnit("s")); err != nil {
		return nil, err
	}
	return t, nil
}

// scheduleTick records a tick this engine recorded for schedule (of
// workflow) late after its time: fired, or skipped for reason ("" when it
// fired).
func (t *telemetry) scheduleTick(ctx context.Context, schedule, workflow, reason string, late time.Duration) {
	if t.noopMetrics {
		return
	}
	set := metric.WithAttributes(AttrSchedule.String(schedule), AttrWorkflow.String(workflow))
	if reason == "" {
		t.scheduleFires.Add(ctx, 1, set)
	} else {
		t.scheduleSkips.Add(ctx, 1, metric.WithAttributes(AttrSchedule.String(schedule), AttrWorkflow.String(workflow), AttrReason.String(reason)))
	}
	t.scheduleLateness.Record(ctx, max(late, 0).Seconds(), set)
}

// startStep opens the span of a step.
func (t *telemetry) startStep(ctx context.Context, c store.Claimed) (context.Context, trace.Span) {
	if t.noopTrace {
		// The no-op tracer ignores the name and options; skip building them.
		return t.tracer.Start(ctx, "durable.step")
	}
	return t.tracer.Start(ctx, "durable.step "+c.Workflow+"/"+c.Step, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(AttrWorkflow.String(c.Workflow), AttrStep.String(c.Step), AttrQueue.String(c.Queue),
			AttrAttempt.Int(c.Attempt), AttrInstanceID.String(c.ID)))
}

// endStep closes the span and records the step's metrics.
func (t *telemetry) endStep(ctx context.Context, span trace.Span, c store.Claimed, outcome, errText string, took time.Duration) {
	if span.IsRecording() { // a span that does not record ignores both
		span.SetAttributes(AttrOutcome.String(outcome))
		if errText != "" {
			span.SetStatus(codes.Error, errText)
		}
	}
	span.End()
	if t.noopMetrics {
		return
	}
	sets := t.stepSetsOf(c, outcome)
	t.steps.Add(ctx, 1, sets.steps)
	t.stepDuration.Record(ctx, took.Seconds(), sets.duration)
	if !c.StartedAt.IsZero() && !c.RunAt.IsZero() {
		if lat := c.StartedAt.Sub(c.RunAt); lat >= 0 {
			t.queueLatency.Record(ctx, lat.Seconds(), sets.latency)
		}
	}
}

// observeHealth registers the gauges. Their callback reads snapshot, which
// returns a cached Health (see Config.HealthInterval) or false when none
// could be taken (nothing is observed then). Attributes are queue names,
// gate names and row states: never a key's id. The durable.policy.* gauges
// (a queue policy's limit, active rows, blocked ready rows and saturated
// keys) carry the queue name only, and are observed for queues with a
// policy.
func (t *telemetry) observeHealth(snapshot func(context.Context) (Health, bool)) error {
	m := t.meter
	depth, err := m.Int64ObservableGauge("durable.queue.depth",
		metric.WithDescription("Rows of a queue by state: ready, scheduled, blocked, executing, awaiting, failed (counted up to store.HealthScanLimit)."), metric.WithUnit("{instance}"))
	if err != nil {
		return err
	}
	oldest, err := m.Float64ObservableGauge("durable.queue.oldest_ready",
		metric.WithDescription("How long the oldest ready row of a queue has been eligible."), metric.WithUnit("s"))
	if err != nil {
		return err
	}
	limit, err := m.Int64ObservableGauge("durable.gate.limit",
		metric.WithDescription("The configured concurrency (K) per key of a gate name."), metric.WithUnit("{slot}"))
	if err != nil {
		return err
	}
	active, err := m.Int64ObservableGauge("durable.gate.active",
		metric.WithDescription("Executing rows holding keys of a gate name."), metric.WithUnit("{instance}"))
	if err != nil {
		return err
	}
	blocked, err := m.Int64ObservableGauge("durable.gate.blocked",
		metric.WithDescription("Rows of keys of a gate name blocked waiting for a slot."), metric.WithUnit("{instance}"))
	if err != nil {
		return err
	}
	saturated, err := m.Int64ObservableGauge("durable.gate.saturated_keys",
		metric.WithDescription("Keys of a gate name with no free slot (counted up to a bound)."), metric.WithUnit("{key}"))
	if err != nil {
		return err
	}
	policyLimit, err := m.Int64ObservableGauge("durable.policy.limit",
		metric.WithDescription("A queue policy's MaxActive: the most rows of the queue executing at once, fleet-wide."), metric.WithUnit("{instance}"))
	if err != nil {
		return err
	}
	policyActive, err := m.Int64ObservableGauge("durable.policy.active",
		metric.WithDescription("Executing rows a queue policy counts against its MaxActive."), metric.WithUnit("{instance}"))
	if err != nil {
		return err
	}
	policyBlocked, err := m.Int64ObservableGauge("durable.policy.blocked_ready",
		metric.WithDescription("Ready rows of a queue held back by its full MaxActive (counted up to a bound)."), metric.WithUnit("{instance}"))
	if err != nil {
		return err
	}
	policySaturated, err := m.Int64ObservableGauge("durable.policy.saturated_keys",
		metric.WithDescription("Keys of a queue at its policy's MaxActivePerKey with work waiting (counted up to a bound)."), metric.WithUnit("{key}"))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		h, ok := snapshot(ctx)
		if !ok {
			return nil
		}
		for _, q := range h.Queues {
			qa := AttrQueue.String(q.Queue)
			for _, d := range []struct {
				state string
				n     int64
			}{{"ready", q.Ready}, {"scheduled", q.Scheduled}, {"blocked", q.Blocked}, {"executing", q.Executing},
				{"awaiting", q.Awaiting}, {"failed", q.Failed}} {
				o.ObserveInt64(depth, d.n, metric.WithAttributes(qa, AttrState.String(d.state)))
			}
			o.ObserveFloat64(oldest, q.OldestReady.Seconds(), metric.WithAttributes(qa))
			if q.MaxActive > 0 { // the queue has a policy
				pa := metric.WithAttributes(qa)
				o.ObserveInt64(policyLimit, int64(q.MaxActive), pa)
				o.ObserveInt64(policyActive, q.Active, pa)
				o.ObserveInt64(policyBlocked, q.BlockedReady, pa)
				o.ObserveInt64(policySaturated, int64(q.SaturatedKeys), pa)
			}
		}
		for _, g := range h.Gates {
			ga := metric.WithAttributes(AttrGate.String(g.Name))
			o.ObserveInt64(limit, int64(g.Limit), ga)
			o.ObserveInt64(active, g.Active, ga)
			o.ObserveInt64(blocked, g.BlockedReady, ga)
			o.ObserveInt64(saturated, int64(g.SaturatedKeys), ga)
		}
		return nil
	}, depth, oldest, limit, active, blocked, saturated, policyLimit, policyActive, policyBlocked, policySaturated)
	return err
}
