package enginepg

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/big"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/pgstoretest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
)

// Fuzzers that round-trip values through real PostgreSQL rows. Each input
// costs a few statements, so `go test -fuzz` explores slowly but with the
// real decoder on the other side; without -fuzz only the seeds run.

// fuzzStore is one migrated schema for a whole fuzz run (the schemas of
// pgStore are per test, and a fuzz function is one test).
func fuzzStore(f *testing.F) (*postgres.Store, *durable.Engine, *pgxpool.Pool) {
	pool := pgstoretest.Migrated.Pool(f)
	st, err := postgres.New(context.Background(), pool, postgres.Options{Schema: pool.Config().ConnConfig.RuntimeParams["search_path"]})
	if err != nil {
		f.Fatal(err)
	}
	e, err := durable.New(durable.Config{Store: st})
	if err != nil {
		f.Fatal(err)
	}
	if err := e.Register(countWorkflow()); err != nil {
		f.Fatal(err)
	}
	return st, e, pool
}

// FuzzStateRoundTrip inserts arbitrary JSON as a state through the engine.
// The engine either refuses it with ErrEncode (it cannot be stored as it
// is) or PostgreSQL stores it, and reading the row back gives the same JSON
// value (jsonb may reorder keys, drop duplicates and respell numbers, but
// not change a value).
func FuzzStateRoundTrip(f *testing.F) {
	for _, s := range []string{`{"n":1}`, `{"s":"\u0000"}`, `"\ud800"`, `[1e131073]`, `{"a":{"b":[1.50,-0,1E2]}}`,
		`"\ud83d\ude00"`, `{"k":1,"k":2}`, `[12345678901234567890123456789]`, `{"s":"\\u0000"}`, `0.000000000000000000001`} {
		f.Add([]byte(s))
	}
	st, e, _ := fuzzStore(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) || len(b) > 4096 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		id, err := e.Insert(ctx, "count", json.RawMessage(b), durable.InsertOptions{Delay: time.Hour})
		if err != nil {
			if !errors.Is(err, durable.ErrEncode) {
				t.Fatalf("insert %q: %v (want ErrEncode or success)", b, err)
			}
			return
		}
		in, err := st.Get(ctx, id)
		if err != nil {
			t.Fatalf("get %q: %v", b, err)
		}
		want, got := decodeNumbers(t, b), decodeNumbers(t, in.State)
		if !sameJSON(want, got) {
			t.Fatalf("state %q came back as %q", b, in.State)
		}
	})
}

// FuzzInstanceRoundTrip inserts rows with arbitrary text straight through
// the store (as an InsertTx caller might). The store either refuses them
// with a typed error, or reading them back returns every field as written.
func FuzzInstanceRoundTrip(f *testing.F) {
	f.Add("wf", "step", "queue", "acct:1", "unique", 3)
	f.Add("w\x00f", "s", "q", "", "", 0)
	f.Add("wf", "s\xff", "q", "api:x:y", "u", -5)
	f.Add("wf", "s", "q", "acct:\u0085", "u\x00", 1)
	f.Add("wf", "s", "q", "", "u\x00", 1)
	f.Add("wf", "s", "q\xff", "", "", 1)
	st, _, pool := fuzzStore(f)
	f.Fuzz(func(t *testing.T, workflow, step, queue, key, unique string, priority int) {
		if queue == "" || workflow == "" || step == "" || len(workflow)+len(step)+len(queue)+len(key)+len(unique) > 2000 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		in := store.NewInstance{ID: uuid.NewString(), Workflow: workflow, Version: 1, Queue: queue, Priority: priority % 1000,
			Step: step, State: json.RawMessage(`{}`), Key: key, UniqueKey: unique, RunAt: time.Now().Add(time.Hour)}
		res, err := st.Insert(ctx, []store.NewInstance{in})
		if err != nil {
			if !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("insert %+v: untyped error %v", in, err)
			}
			return
		}
		if res[0].Duplicate {
			return
		}
		got, err := st.Get(ctx, in.ID)
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if got.Workflow != workflow || got.Step != step || got.Queue != queue || got.Key != key ||
			got.UniqueKey != unique || got.Priority != priority%1000 {
			t.Fatalf("round trip: wrote %q %q %q %q %q %d, read %q %q %q %q %q %d", workflow, step, queue, key, unique, priority%1000,
				got.Workflow, got.Step, got.Queue, got.Key, got.UniqueKey, got.Priority)
		}
		if key != "" {
			// The limit a key gets is matched by its name: PostgreSQL's
			// generated key_name and gate.NameOf must agree.
			info, err := st.KeyInfo(ctx, key)
			if err != nil {
				t.Fatalf("key info %q: %v", key, err)
			}
			if info.Waiting != 1 {
				t.Fatalf("key %q: %d waiting, want 1", key, info.Waiting)
			}
			var name string
			if err := pool.QueryRow(ctx, "SELECT key_name FROM instances WHERE id = $1", in.ID).Scan(&name); err != nil {
				t.Fatal(err)
			}
			if name != gate.NameOf(key) {
				t.Fatalf("key %q: PostgreSQL matches limits on the name %q, gate.NameOf says %q", key, name, gate.NameOf(key))
			}
			ls, _ := gate.NewLimits([]gate.Limit{{Name: name, Limit: 2}})
			if ls.K(key) != 2 {
				t.Fatalf("key %q does not match the limit of its own name %q", key, name)
			}
		}
		if err := st.Cancel(ctx, in.ID, time.Time{}); err != nil {
			t.Fatalf("cancel: %v", err)
		}
	})
}

func decodeNumbers(t *testing.T, b []byte) any {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return v
}

// sameJSON compares decoded JSON values, numbers by exact decimal value.
func sameJSON(a, b any) bool {
	switch x := a.(type) {
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		rx, okx := new(big.Rat).SetString(string(x))
		ry, oky := new(big.Rat).SetString(string(y))
		return okx && oky && rx.Cmp(ry) == 0
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameJSON(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if !sameJSON(v, y[k]) {
				return false
			}
		}
		return true
	default:
		return reflect.DeepEqual(a, b)
	}
}
