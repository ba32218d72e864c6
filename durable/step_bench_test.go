package durable

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/transitions"
)

// BenchmarkExecutePlainStep measures the engine's own work for one plain
// step (a one-step workflow without a key, as durable-bench scenario 1 runs
// it): looking up the step, its context, decoding the state, the step's
// telemetry (no-op providers) and building the outcome and history entry.
// The store is not involved. "noop" is the default (OpenTelemetry's no-op
// providers), "metrics" records the step metrics with the SDK.
//
//	go test ./durable -run '^$' -bench ExecutePlainStep -benchmem
func BenchmarkExecutePlainStep(b *testing.B) {
	b.Run("noop", func(b *testing.B) { benchExecutePlainStep(b, nil) })
	b.Run("metrics", func(b *testing.B) {
		benchExecutePlainStep(b, sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())))
	})
}

func benchExecutePlainStep(b *testing.B, mp metric.MeterProvider) {
	type state struct {
		I int           `json:"i"`
		K int           `json:"k"`
		D time.Duration `json:"d,omitempty"`
	}
	e, err := New(Config{Store: memory.New(memory.Options{}), WorkerID: "bench-worker", MeterProvider: mp,
		Logger: slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		b.Fatal(err)
	}
	wf := NewWorkflow[state]("noop", "run", WorkflowOptions{}).
		Step("run", func(_ steps.Context, s state) (transitions.Transition, error) {
			return transitions.Done(nil), nil
		})
	if err := e.Register(wf); err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	c := store.Claimed{Instance: store.Instance{ID: "0b0c8f4e-3a57-4d1b-9d39-6c1f0b8e7a21", Workflow: "noop", Version: 1,
		Queue: DefaultQueue, Status: store.StatusExecuting, Step: "run", State: json.RawMessage(`{"i":12345,"k":0}`),
		Attempt: 1, Worker: "bench-worker", Fence: 7, RunAt: now, StartedAt: now, ReadySince: now}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		out := e.execute(ctx, c)
		if out.Kind != store.OutcomeDone {
			b.Fatal(out.Kind, out.Error)
		}
	}
}
