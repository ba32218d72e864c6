package durable_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

func TestTelemetrySpansAndMetricsCarryNoKeyValues(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEngine(t, durable.Config{TracerProvider: tp, MeterProvider: mp}, counterWorkflow())
	start(t, e)
	ctx := waitCtx(t)
	const secret = "tenant-secret-7731"
	id, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{Key: gate.Identity("account", secret)})
	require.NoError(t, err)
	_, err = durable.Result[int](ctx, e, id)
	require.NoError(t, err)

	ended := spans.GetSpans()
	require.Len(t, ended, 3, "one span per step")
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range ended[0].Attributes {
		attrs[kv.Key] = kv.Value
	}
	assert.Equal(t, "count", attrs[durable.AttrWorkflow].AsString())
	assert.Equal(t, "inc", attrs[durable.AttrStep].AsString())
	assert.Equal(t, "default", attrs[durable.AttrQueue].AsString())
	assert.Equal(t, "next", attrs[durable.AttrOutcome].AsString())
	assert.Equal(t, id, attrs[durable.AttrInstanceID].AsString(), "the instance id is on the span")
	assert.Equal(t, int64(0), attrs[durable.AttrAttempt].AsInt64())

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	names := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names[m.Name] = true
			for _, set := range attributeSets(m) {
				for _, kv := range set.ToSlice() {
					v := kv.Value.String()
					assert.NotContains(t, v, secret, "metric %s carries a key value", m.Name)
					assert.NotEqual(t, id, v, "metric %s carries an instance id", m.Name)
					assert.NotEqual(t, durable.AttrInstanceID, kv.Key)
				}
			}
		}
	}
	for _, want := range []string{"durable.steps", "durable.step.duration", "durable.queue.latency"} {
		assert.True(t, names[want], "metric %s recorded; got %v", want, names)
	}
	steps := findSum(rm, "durable.steps")
	assert.Equal(t, int64(3), steps)
	for _, s := range ended {
		assert.False(t, strings.Contains(s.Name, secret))
	}
}

func attributeSets(m metricdata.Metrics) []attribute.Set {
	var out []attribute.Set
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	}
	return out
}

func findSum(rm metricdata.ResourceMetrics, name string) int64 {
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, p := range s.DataPoints {
					n += p.Value
				}
			}
		}
	}
	return n
}

func TestReapedLeasesAreCounted(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := waitCtx(t)
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		e := newEngine(t, durable.Config{Store: st, MeterProvider: mp, ReaperInterval: 20 * time.Millisecond}, counterWorkflow())
		id, err := e.Insert(ctx, "count", counter{}, durable.InsertOptions{})
		require.NoError(t, err)
		// A worker claims and dies before its lease runs out.
		res, err := st.Claim(ctx, store.ClaimRequest{Queue: durable.DefaultQueue, Worker: "ghost", Limit: 1, Lease: time.Millisecond})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 1)
		start(t, e)
		n, err := durable.Result[int](ctx, e, id)
		require.NoError(t, err, "the reaped row runs to the end")
		assert.Equal(t, 3, n)
		// The sweep counts the reap after Reap returns: the instance may
		// finish first.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			var rm metricdata.ResourceMetrics
			require.NoError(c, reader.Collect(ctx, &rm))
			assert.Equal(c, int64(1), findSum(rm, "durable.leases.reaped"))
		}, 5*time.Second, 10*time.Millisecond)
	})
}
