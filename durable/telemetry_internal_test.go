package durable

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/godurable/godurable/store"
)

// The cached attribute sets of the step metrics are those built per step
// before the cache: by workflow, step, queue and outcome for durable.steps,
// without the outcome for the duration, workflow and queue for the latency;
// past the cache's bound, sets are still right.
func TestStepMetricSets(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	tel, err := newTelemetry(nil, sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	if !tel.noopTrace || tel.noopMetrics {
		t.Fatalf("noopTrace %v noopMetrics %v", tel.noopTrace, tel.noopMetrics)
	}
	ctx := context.Background()
	c := store.Claimed{Instance: store.Instance{Workflow: "wf", Step: "s", Queue: "q"}}
	first, again := tel.stepSetsOf(c, "done"), tel.stepSetsOf(c, "done")
	if first != again {
		t.Fatal("sets of one combination are built once")
	}
	run := func(step, outcome string) {
		c := c
		c.Step = step
		_, span := tel.startStep(ctx, c)
		tel.endStep(ctx, span, c, outcome, "", 0)
	}
	for i := range maxStepSets + 10 {
		run(fmt.Sprint("s", i), "done")
	}
	run("s3", "error")
	run(fmt.Sprint("s", maxStepSets+5), "error") // not cached
	if n := len(*tel.stepSets.Load()); n != maxStepSets {
		t.Fatalf("%d sets cached, bound %d", n, maxStepSets)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]map[attribute.Set]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			got[m.Name] = map[attribute.Set]int64{}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					got[m.Name][p.Attributes] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					got[m.Name][p.Attributes] += int64(p.Count)
				}
			}
		}
	}
	if n := len(got["durable.steps"]); n != maxStepSets+12 {
		t.Errorf("durable.steps: %d sets", n)
	}
	last := fmt.Sprint("s", maxStepSets+5)
	for _, w := range []struct {
		metric string
		set    attribute.Set
		n      int64
	}{
		{"durable.steps", attribute.NewSet(AttrWorkflow.String("wf"), AttrStep.String("s3"), AttrQueue.String("q"), AttrOutcome.String("error")), 1},
		{"durable.steps", attribute.NewSet(AttrWorkflow.String("wf"), AttrStep.String("s3"), AttrQueue.String("q"), AttrOutcome.String("done")), 1},
		{"durable.steps", attribute.NewSet(AttrWorkflow.String("wf"), AttrStep.String(last), AttrQueue.String("q"), AttrOutcome.String("error")), 1},
		{"durable.step.duration", attribute.NewSet(AttrWorkflow.String("wf"), AttrStep.String("s3"), AttrQueue.String("q")), 2},
		{"durable.step.duration", attribute.NewSet(AttrWorkflow.String("wf"), AttrStep.String(last), AttrQueue.String("q")), 2},
	} {
		if n := got[w.metric][w.set]; n != w.n {
			t.Errorf("%s %s: %d, want %d", w.metric, w.set.Encoded(attribute.DefaultEncoder()), n, w.n)
		}
	}
	if len(got["durable.queue.latency"]) != 0 {
		t.Errorf("no latency without run and start times: %v", got["durable.queue.latency"])
	}
}
