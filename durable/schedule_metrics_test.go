package durable_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/testing/durabletest"
	"github.com/godurable/godurable/transitions"
)

// The schedule metrics count the ticks an engine records, fired or skipped
// (with the reason), and how late after its time each was recorded.
func TestScheduleMetrics(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := durabletest.NewClock(t0)
	reader := sdkmetric.NewManualReader()
	hold := durable.NewWorkflow[counter]("hold", "park", durable.WorkflowOptions{}).
		Step("park", func(ctx steps.Context, c counter) (transitions.Transition, error) {
			return transitions.Await("never", "park", c), nil // still running at the next ticks
		})
	e := newEngine(t, durable.Config{Store: memory.New(memory.Options{Clock: clock.Now}), Clock: clock,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		Schedules:     []durable.Schedule{{Name: "digest", Workflow: "hold", Cron: "@every 1m", Overlap: durable.OverlapSkip}}}, hold)
	_, err := e.SyncSchedules(ctx)
	require.NoError(t, err)

	for _, at := range []time.Duration{
		time.Minute + 5*time.Second,     // fires, 5 s late
		2 * time.Minute,                 // skipped: the first run still goes
		10*time.Minute + 40*time.Second, // ticks missed (past their 30 s grace): skipped to the next
	} {
		clock.Set(t0.Add(at))
		_, err := e.Tick(ctx)
		require.NoError(t, err)
	}

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	assert.Equal(t, int64(1), findSum(rm, "durable.schedule.fires"))
	skips := map[string]int64{}
	var lateness metricdata.HistogramDataPoint[float64]
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name != "durable.schedule.skips" {
					continue
				}
				for _, p := range d.DataPoints {
					reason, _ := p.Attributes.Value(durable.AttrReason)
					schedule, _ := p.Attributes.Value(durable.AttrSchedule)
					assert.Equal(t, "digest", schedule.AsString())
					skips[reason.AsString()] += p.Value
				}
			case metricdata.Histogram[float64]:
				if m.Name == "durable.schedule.lateness" {
					require.Len(t, d.DataPoints, 1)
					lateness = d.DataPoints[0]
				}
			}
		}
	}
	assert.Equal(t, map[string]int64{durable.ScheduleSkipRunning: 1, durable.ScheduleSkipMissed: 1}, skips)
	assert.Equal(t, uint64(3), lateness.Count, "one lateness per recorded tick")
	assert.InDelta(t, 45, lateness.Sum, 0.001, "5 s, 0 s and 40 s late")
}
