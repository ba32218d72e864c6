package durable_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/transitions"
)

type rich struct {
	N    int               `json:"n"`
	S    string            `json:"s"`
	L    []float64         `json:"l"`
	M    map[string]bool   `json:"m"`
	P    *rich             `json:"p"`
	Raw  json.RawMessage   `json:"raw"`
	Tags map[string]string `json:"tags"`
}

// FuzzStoredStateDecode stores arbitrary bytes as an instance's state (as a
// bug elsewhere, a manual edit or another version of the code might) and
// runs one scheduling round. Bytes that are not JSON are refused by the
// store with store.ErrInvalid; JSON that does not decode into the
// workflow's state type fails the instance with a decode error; anything
// else runs. The engine never panics and the instance always ends in one of
// those two ways.
func FuzzStoredStateDecode(f *testing.F) {
	for _, s := range []string{`{"n":1}`, `{"n":"x"}`, `"{\"n\":1}"`, `null`, `[]`, `{"p":{"p":{"n":2}}}`, `{"l":[1e400]}`,
		`{"m":{"a":1}}`, `not json`, `{"raw":{"deep":[1,2,{}]}}`, `{"n":9223372036854775808}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, state []byte) {
		st := memory.New(memory.Options{})
		wf := durable.NewWorkflow[rich]("rich", "go", durable.WorkflowOptions{Retry: steps.RetryPolicy{MaxAttempts: 1}})
		wf.Step("go", func(ctx steps.Context, s rich) (transitions.Transition, error) {
			return transitions.Done(s.N), nil
		})
		e, err := durable.New(durable.Config{Store: st, Clock: fixedClock{}, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Register(wf); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		id := uuid.NewString()
		_, err = st.Insert(ctx, []store.NewInstance{{ID: id, Workflow: "rich", Version: 1, Queue: durable.DefaultQueue,
			Step: "go", State: json.RawMessage(state), RunAt: fixedClock{}.Now()}})
		if err != nil {
			if !errors.Is(err, store.ErrInvalid) || json.Valid(state) {
				t.Fatalf("insert %q: %v", state, err)
			}
			return
		}
		if _, err := e.Tick(ctx); err != nil {
			t.Fatalf("tick: %v", err)
		}
		in, err := e.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var s rich
		decodes := len(state) == 0 || json.Unmarshal(state, &s) == nil
		switch {
		case decodes && in.Status != store.StatusDone:
			t.Fatalf("state %q decodes but the instance is %s: %s", state, in.Status, in.LastError)
		case !decodes && (in.Status != store.StatusFailed || !strings.Contains(in.LastError, "decode state")):
			t.Fatalf("state %q does not decode but the instance is %s: %s", state, in.Status, in.LastError)
		}
	})
}

// fixedClock is a fake clock that never moves.
type fixedClock struct{}

func (fixedClock) Now() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }
