package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/transitions"
)

// seeded is a migrated schema holding a known mix of instances, made
// through the SDK:
//
//   - done: a "sync" that ran fetch → apply → done (history recorded)
//   - failed: a "charge" stopped with "card declined"
//   - awaiting: a "webhook" parked on the signal "paid"
//   - account:7 (no limit, K = 1): held by worker-a, two more blocked
//   - stripe:t (limit 2): held twice by worker-a, one more blocked
//   - captured: an identity key "stripe:captured" the stripe limit
//     captures, ready on queue "other"
type seeded struct {
	url, schema string
	st          *postgres.Store
	done        string
	failed      string
	awaiting    string
	acctHolder  string
	acctWaiting []string
	stripe      []string // two holders, then the blocked one
	captured    string
}

type payment struct {
	Amount int    `json:"amount"`
	Paid   string `json:"paid,omitempty"`
}

func workflows() []durable.Definition {
	sync := durable.NewWorkflow[payment]("sync", "fetch", durable.WorkflowOptions{})
	sync.Step("fetch", func(ctx steps.Context, s payment) (transitions.Transition, error) {
		return transitions.Next("apply", s), nil
	})
	sync.Step("apply", func(ctx steps.Context, s payment) (transitions.Transition, error) {
		return transitions.Done(s.Amount), nil
	})
	charge := durable.NewWorkflow[payment]("charge", "call", durable.WorkflowOptions{})
	charge.Step("call", func(ctx steps.Context, s payment) (transitions.Transition, error) {
		return transitions.Stop("card declined"), nil
	})
	webhook := durable.NewWorkflow[payment]("webhook", "wait", durable.WorkflowOptions{})
	webhook.Step("wait", func(ctx steps.Context, s payment) (transitions.Transition, error) {
		return transitions.Await("paid", "finish", s), nil
	})
	webhook.Step("finish", func(ctx steps.Context, s payment) (transitions.Transition, error) {
		sig, _ := ctx.Signal()
		var body struct {
			By string `json:"by"`
		}
		if err := sig.Decode(&body); err != nil {
			return transitions.Transition{}, err
		}
		s.Paid = body.By
		return transitions.Done(s), nil
	})
	return []durable.Definition{sync, charge, webhook}
}

func newEngine(t *testing.T, st store.Store) *durable.Engine {
	t.Helper()
	e, err := durable.New(durable.Config{Store: st, WorkerID: "seed-worker", PollInterval: 20 * time.Millisecond,
		Queues: map[string]int{"default": 4}, Limits: []gate.Limit{{Name: "stripe", Limit: 2}},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, e.Register(workflows()...))
	return e
}

// migrated returns a freshly migrated schema of the test's own and a store
// (with history) on it, for the CLI to run against.
func migrated(t *testing.T) *seeded {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := pgtest.Pool(t)
	s := &seeded{url: pgtest.URL(t), schema: pgtest.SchemaOf(pool)}
	_, err := postgres.Migrate(ctx, pool, s.schema)
	require.NoError(t, err)
	s.st, err = postgres.New(ctx, pool, postgres.Options{Schema: s.schema, History: true})
	require.NoError(t, err)
	return s
}

func seed(t *testing.T) *seeded {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := migrated(t)
	var err error

	e := newEngine(t, s.st)
	require.NoError(t, e.Start(ctx))
	s.done, err = e.Insert(ctx, "sync", payment{Amount: 5}, durable.InsertOptions{Key: gate.Identity("account", "1")})
	require.NoError(t, err)
	s.failed, err = e.Insert(ctx, "charge", payment{Amount: 9}, durable.InsertOptions{})
	require.NoError(t, err)
	s.awaiting, err = e.Insert(ctx, "webhook", payment{Amount: 3}, durable.InsertOptions{})
	require.NoError(t, err)
	_, err = e.Wait(ctx, s.done)
	require.NoError(t, err)
	_, err = e.Wait(ctx, s.failed)
	require.NoError(t, err)
	for {
		in, err := e.Get(ctx, s.awaiting)
		require.NoError(t, err)
		if in.Status == store.StatusAwaiting {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, e.Stop(ctx))

	// Work a live worker (worker-a) holds: inserted through an engine that
	// is not started, claimed straight from the store.
	idle := newEngine(t, s.st)
	insert := func(k gate.ConcurrencyKey, queue string) string {
		id, err := idle.Insert(ctx, "sync", payment{Amount: 1}, durable.InsertOptions{Key: k, Queue: queue})
		require.NoError(t, err)
		return id
	}
	s.acctHolder = insert(gate.Identity("account", "7"), "")
	s.stripe = append(s.stripe, insert(gate.Gate("stripe", "t"), ""), insert(gate.Gate("stripe", "t"), ""))
	s.acctWaiting = append(s.acctWaiting, insert(gate.Identity("account", "7"), ""), insert(gate.Identity("account", "7"), ""))
	s.stripe = append(s.stripe, insert(gate.Gate("stripe", "t"), ""))
	s.captured = insert(gate.Identity("stripe", "captured"), "other")
	res, err := s.st.Claim(ctx, store.ClaimRequest{Queue: "default", Worker: "worker-a", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	var claimed []string
	for _, c := range res.Claimed {
		claimed = append(claimed, c.ID)
	}
	require.ElementsMatch(t, []string{s.acctHolder, s.stripe[0], s.stripe[1]}, claimed)
	return s
}

// cli runs the built binary against the seeded schema.
func (s *seeded) cli(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runBinary(t, []string{"DATABASE_URL=" + s.url}, append(args, "-schema", s.schema)...)
}

// ok runs the binary and requires success.
func (s *seeded) ok(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := s.cli(t, args...)
	require.Equal(t, 0, code, "durable %v failed: %s", args, errOut)
	return out
}

func runBinary(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=")
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run durable: %v", err)
	}
	return out.String(), errb.String(), code
}

// line finds the output line starting with prefix (after spaces) and splits it into fields.
func line(t *testing.T, out, prefix string) []string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), prefix) {
			return strings.Fields(l)
		}
	}
	t.Fatalf("no line starting with %q in:\n%s", prefix, out)
	return nil
}

// TestCLIReadOnly runs the commands that change nothing against one seeded
// schema, each as a parallel subtest.
func TestCLIReadOnly(t *testing.T) {
	t.Parallel()
	s := seed(t)
	for name, fn := range map[string]func(*testing.T, *seeded){
		"health": cliHealth, "ls": cliList, "show": cliShow,
		"explain a saturated K=1 key": cliExplainSaturatedKey, "explain a gate and free keys": cliExplainGateAndFreeKeys,
		"hints work as pasted": cliHintsWorkAsPasted,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, s)
		})
	}
}

func cliHealth(t *testing.T, s *seeded) {
	out := s.ok(t, "health")
	before, errOut, code := runBinary(t, nil, "-database-url", s.url, "-schema", s.schema, "health")
	require.Equal(t, 0, code, "global flags before the command: %s", errOut)
	assert.Equal(t, line(t, out, "default"), line(t, before, "default"))
	assert.Equal(t, []string{"QUEUE", "READY", "SCHEDULED", "BLOCKED", "EXECUTING", "AWAITING", "FAILED", "OLDEST", "READY", "ACTIVE/MAX"},
		line(t, out, "QUEUE"))
	// queue ready scheduled blocked executing awaiting failed oldest active/max
	def := line(t, out, "default")
	assert.Equal(t, []string{"default", "0", "0", "3", "3", "1", "1", "-", "3/-"}, def)
	other := line(t, out, "other")
	assert.Equal(t, []string{"other", "1", "0", "0", "0", "0", "0"}, other[:7])
	assert.Regexp(t, `^\d+(ms|s|m\d+s)$`, other[7], "oldest ready age")
	// gate limit shards active blocked saturated highest
	assert.Equal(t, []string{"stripe", "2", "1", "2", "1", "1", "2"}, line(t, out, "stripe"))
	assert.Contains(t, out, "identity_captured stripe:")
	assert.NotContains(t, out, "captured\n", "no key id in health")
	// The seeding engine worked default; nobody ever worked other.
	_, nobody, found := strings.Cut(out, "QUEUES NOBODY WORKS")
	require.True(t, found, "a queue nobody works is listed:\n%s", out)
	assert.Equal(t, []string{"other", "1", "0", "0"}, line(t, nobody, "other")[:4])
	assert.Equal(t, "never", line(t, nobody, "other")[5])
	assert.NotContains(t, nobody, "default")
	assert.Contains(t, nobody, "list other's rows: durable ls -queue other -schema "+s.schema)

	var h healthReport
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "health", "--json")), &h))
	require.Len(t, h.Queues, 2)
	assert.Equal(t, store.QueueHealth{Queue: "default", Blocked: 3, Executing: 3, Awaiting: 1, Failed: 1, Active: 3}, h.Queues[0])
	assert.Equal(t, int64(1), h.Queues[1].Ready)
	assert.Equal(t, []store.GateHealth{{Name: "stripe", Limit: 2, Shards: 1, Active: 2, BlockedReady: 1, SaturatedKeys: 1, HighestKeyActive: 2}}, h.Gates)
	require.Len(t, h.Warnings, 1)
	assert.Equal(t, gate.IdentityCaptured, h.Warnings[0].Kind)
	assert.WithinDuration(t, time.Now(), h.At, time.Minute)
	require.Len(t, h.UnworkedQueues, 1)
	assert.Equal(t, "other", h.UnworkedQueues[0].Queue)
	assert.Equal(t, int64(1), h.UnworkedQueues[0].Ready)
	assert.Nil(t, h.UnworkedQueues[0].LastWorked)
}

func cliList(t *testing.T, s *seeded) {
	out := s.ok(t, "ls")
	for _, id := range []string{s.done, s.failed, s.awaiting, s.acctHolder, s.captured} {
		assert.Contains(t, out, id)
	}
	assert.Equal(t, 1+10, strings.Count(strings.TrimSpace(out), "\n")+1, "a header and ten instances:\n%s", out)

	out = s.ok(t, "ls", "-status", "failed")
	f := line(t, out, s.failed)
	assert.Equal(t, []string{s.failed, "failed", "charge", "call", "0", "default", "-"}, f[:7])
	assert.NotContains(t, out, s.done)

	out = s.ok(t, "ls", "-key", "account:7", "-status", "blocked")
	assert.ElementsMatch(t, s.acctWaiting, ids(out))
	out = s.ok(t, "ls", "-workflow", "webhook")
	assert.Equal(t, []string{s.awaiting}, ids(out))
	out = s.ok(t, "ls", "-queue", "other")
	assert.Equal(t, []string{s.captured}, ids(out))

	// Paging: -limit 4 gives four ids and the command for the next page.
	var all []string
	args := []string{"ls", "-limit", "4"}
	for page := 0; ; page++ {
		require.Less(t, page, 5)
		out = s.ok(t, args...)
		all = append(all, ids(out)...)
		m := regexp.MustCompile(`more: durable ls (.*)`).FindStringSubmatch(out)
		if m == nil {
			break
		}
		args = append([]string{"ls"}, strings.Fields(m[1])...)
	}
	assert.Len(t, all, 10)
	newest, err := s.st.List(context.Background(), store.ListFilter{Newest: true})
	require.NoError(t, err)
	var want []string
	for _, in := range newest {
		want = append(want, in.ID)
	}
	assert.Equal(t, want, all, "paged newest first by creation time, no repeats")
	assert.Equal(t, s.captured, all[0], "the instance inserted last comes first")
	assert.Equal(t, s.done, all[len(all)-1], "the instance inserted first comes last")

	var js struct {
		Instances []map[string]any `json:"instances"`
		Next      string           `json:"next_after"`
	}
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "ls", "-json", "-limit", "2")), &js))
	require.Len(t, js.Instances, 2)
	assert.Equal(t, js.Instances[1]["id"], js.Next)
	for _, f := range []string{"id", "workflow", "version", "queue", "priority", "status", "step", "state", "attempt",
		"key", "key_intent", "keys", "blocked_on", "run_at", "await_signal", "timeout_at", "worker", "lease_expires_at", "started_at",
		"result", "last_error", "parent_id", "pending_children", "unique_key", "created_at", "updated_at", "ready_since"} {
		assert.Contains(t, js.Instances[0], f, "instance JSON field")
	}
	assert.Len(t, js.Instances[0], 27, "no undocumented instance field")
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "ls", "-json", "-status", "failed")), &js))
	require.Len(t, js.Instances, 1)
	assert.Equal(t, map[string]any{"amount": float64(9)}, js.Instances[0]["state"], "state is a JSON object, not a string")
	assert.Equal(t, "card declined", js.Instances[0]["last_error"])
	assert.Empty(t, js.Next, "the last page")

	// A filtered page looks at -scan instances at most, says so, and the
	// hint it prints goes on from where it stopped: the oldest instance is
	// found in bounded pages.
	args = []string{"ls", "-status", "done", "-scan", "3"}
	var found []string
	for page := 0; ; page++ {
		require.Less(t, page, 6, "pages of 3 reach the oldest of 10 instances")
		out = s.ok(t, args...)
		found = append(found, ids(out)...)
		m := regexp.MustCompile(`(?:looked at 3 instances; older ones may match|more): durable ls (.*)`).FindStringSubmatch(out)
		if m == nil {
			break
		}
		args = []string{"ls"}
		for _, f := range strings.Fields(m[1]) {
			if u, err := strconv.Unquote(f); err == nil {
				f = u
			}
			args = append(args, f)
		}
	}
	assert.Equal(t, []string{s.done}, found)
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "ls", "-json", "-status", "done", "-scan", "3")), &js))
	assert.Empty(t, js.Instances, "the newest three are not done")
	assert.NotEmpty(t, js.Next, "a stopped page says where to go on")

	_, errOut, code := s.cli(t, "ls", "-status", "sleeping")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `unknown status "sleeping"`)
}

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// ids returns the ids that start the lines of an ls table.
func ids(out string) []string {
	var out2 []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && uuidPattern.MatchString(f[0]) {
			out2 = append(out2, f[0])
		}
	}
	return out2
}

func cliShow(t *testing.T, s *seeded) {
	out := s.ok(t, "show", s.done)
	assert.Equal(t, []string{"status", "done"}, line(t, out, "status"))
	assert.Equal(t, []string{"step", "apply"}, line(t, out, "step"))
	assert.Equal(t, []string{"key", "account:1", "(identity)"}, line(t, out, "key"))
	assert.Contains(t, out, `"amount": 5`, "the state, as JSON")
	assert.Contains(t, out, "result:\n  5")
	assert.Equal(t, []string{"fetch", "0", "account:1", "next", "seed-worker"}, line(t, out, "fetch")[:5], "each step with the key it ran under")
	assert.Equal(t, []string{"apply", "0", "account:1", "done", "seed-worker"}, line(t, out, "apply")[:5])

	out = s.ok(t, "show", "-json=false", s.failed) // flags before and after the arguments
	assert.Equal(t, []string{"status", "failed"}, line(t, out, "status"))
	assert.Equal(t, []string{"stop", "reason", "card", "declined"}, line(t, out, "stop reason"), "a Stop's reason, said as one")
	assert.Equal(t, []string{"call", "0", "-", "stop", "seed-worker"}, line(t, out, "call")[:5], "a step without a key")
	assert.Equal(t, []string{"card", "declined"}, line(t, out, "call")[len(line(t, out, "call"))-2:], "its history row says the reason too")

	out = s.ok(t, "show", s.acctHolder)
	assert.Equal(t, []string{"worker", "worker-a"}, line(t, out, "worker"))
	assert.Contains(t, line(t, out, "lease expires"), "(in")

	out = s.ok(t, "show", s.awaiting)
	assert.Equal(t, []string{"awaiting", "paid"}, line(t, out, "awaiting"))

	var js showReport
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "show", s.done, "-json")), &js))
	assert.Equal(t, store.StatusDone, js.Instance.Status)
	assert.JSONEq(t, "5", string(js.Instance.Result))
	require.Len(t, js.History, 2)
	assert.Equal(t, "fetch", js.History[0].Step)
	assert.Equal(t, "done", js.History[1].Outcome)

	_, errOut, code := s.cli(t, "show", "6f1c1f8e-8a7e-4c41-9d5a-0b3a1b7f3c11")
	assert.Equal(t, 1, code)
	assert.Equal(t, "durable: show: no instance 6f1c1f8e-8a7e-4c41-9d5a-0b3a1b7f3c11 (check the id and -schema)\n", errOut)
	_, errOut, code = s.cli(t, "show", "not-an-id")
	assert.Equal(t, 2, code)
	assert.Equal(t, "durable: show: \"not-an-id\" is not an instance id (a UUID)\n", errOut)
	for _, args := range [][]string{{"signal", "xyz", "paid"}, {"cancel", "xyz"}, {"retry", "xyz"}, {"ls", "-after", "xyz"}} {
		_, errOut, code = s.cli(t, args...)
		assert.Equal(t, 2, code, "%v", args)
		assert.Contains(t, errOut, `"xyz" is not an instance id (a UUID)`, "%v", args)
		assert.NotContains(t, errOut, "not found", "%v", args)
	}
	_, errOut, code = s.cli(t, "show")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "want ID")
}

func TestCLISignalCancelRetry(t *testing.T) {
	t.Parallel()
	s := seed(t)
	_, errOut, code := s.cli(t, "signal", s.awaiting, "paid", "{not json")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "not valid JSON")
	_, errOut, code = runBinary(t, []string{"DATABASE_URL=" + s.url}, "signal", s.awaiting, "paid", "-schema", s.schema, "-dedup")
	assert.Equal(t, 2, code)
	assert.Equal(t, 1, strings.Count(errOut, "flag needs an argument"), "the flag error is printed once:\n%s", errOut)

	// A signal no await matches is stored (it may arrive before its
	// await) with a warning that names what the instance awaits.
	out, errOut, code := s.cli(t, "signal", s.awaiting, "payd")
	assert.Equal(t, 0, code)
	assert.Equal(t, "signal payd stored for "+s.awaiting+": delivered at its next await of payd\n", out)
	assert.Equal(t, "warning: "+s.awaiting+` awaits "paid", not "payd": this signal stays stored until a step awaits "payd"`+"\n", errOut)
	out, errOut, code = s.cli(t, "signal", s.acctWaiting[1], "later")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "signal later stored for "+s.acctWaiting[1])
	assert.Equal(t, "warning: "+s.acctWaiting[1]+` is not awaiting a signal (it is blocked): this signal will be delivered to its first await of "later"`+"\n", errOut)

	out = s.ok(t, "signal", s.awaiting, "paid", `{"by":"ops"}`, "-dedup", "once")
	assert.Equal(t, "signal paid sent to "+s.awaiting+": it was awaiting it and is ready again\n", out)
	out = s.ok(t, "signal", s.awaiting, "paid", `{"by":"again"}`, "-dedup", "once")
	assert.Contains(t, out, `duplicate dedup key "once", nothing sent`)
	in, err := s.st.Get(context.Background(), s.awaiting)
	require.NoError(t, err)
	assert.Equal(t, store.StatusReady, in.Status)

	// An engine finishes the woken instance with the signal's payload.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := newEngine(t, s.st)
	require.NoError(t, e.Start(ctx))
	res, err := durable.Result[payment](ctx, e, s.awaiting)
	require.NoError(t, err)
	require.NoError(t, e.Stop(ctx))
	assert.Equal(t, "ops", res.Paid)

	_, errOut, code = s.cli(t, "signal", s.done, "paid")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "instance "+s.done+" is terminal")

	out = s.ok(t, "cancel", s.acctWaiting[0])
	assert.Equal(t, "canceled "+s.acctWaiting[0]+" (was blocked at step fetch)\n", out)
	out = s.ok(t, "cancel", s.acctHolder)
	assert.Contains(t, out, "cancel requested for "+s.acctHolder)
	assert.Contains(t, out, "on worker worker-a")
	assert.Contains(t, out, "keeps its key until it returns")
	out = s.ok(t, "show", s.acctHolder)
	assert.Regexp(t, `status\s+executing`, out)
	assert.Regexp(t, `cancel\s+requested`, out)
	out = s.ok(t, "cancel", s.acctHolder)
	assert.Contains(t, out, "cancel requested", "a second cancel of a running step changes nothing")

	out = s.ok(t, "retry", s.failed)
	assert.Equal(t, "retrying "+s.failed+" (was failed): ready at step call, attempt 0\n", out)
	in, err = s.st.Get(context.Background(), s.failed)
	require.NoError(t, err)
	assert.Equal(t, store.StatusReady, in.Status)
	_, errOut, code = s.cli(t, "retry", s.done)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "is done: only failed or canceled instances can be retried")
	_, errOut, code = s.cli(t, "retry", "6f1c1f8e-8a7e-4c41-9d5a-0b3a1b7f3c11")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "no instance")
}

func TestCLILimits(t *testing.T) {
	t.Parallel()
	s := seed(t)
	out := s.ok(t, "limits", "ls")
	assert.Equal(t, []string{"stripe", "2", "1"}, line(t, out, "stripe"))

	file := filepath.Join(t.TempDir(), "limits.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"limits": [{"name": "stripe", "limit": 5, "shards": 2}, {"name": "account", "limit": 3}]}`), 0o600))
	out = s.ok(t, "limits", "sync", file)
	assert.Contains(t, out, "limits synced: 2 stored, 2 changed")
	assert.Contains(t, out, "account: K = 1 (no limit) -> K = 3  WARNING: 3 live instance(s) hold keys of this name")
	assert.Contains(t, out, "stripe: K = 2 -> K = 5")

	var f limitsFile
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "limits", "ls", "-json")), &f))
	assert.Equal(t, []gate.Limit{{Name: "account", Limit: 3, Shards: 1}, {Name: "stripe", Limit: 5, Shards: 2}}, f.Limits)

	// A bare array works too; an empty one removes every limit.
	require.NoError(t, os.WriteFile(file, []byte(`[]`), 0o600))
	assert.Contains(t, s.ok(t, "limits", "sync", file), "limits synced: 0 stored, 2 changed")
	assert.Contains(t, s.ok(t, "limits", "ls"), "no limits")

	require.NoError(t, os.WriteFile(file, []byte(`{"limits": [{"name": "x", "limit": 0}]}`), 0o600))
	_, errOut, code := s.cli(t, "limits", "sync", file)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "limits sync: "+file)
	require.NoError(t, os.WriteFile(file, []byte(`{"limitz": []}`), 0o600))
	_, errOut, code = s.cli(t, "limits", "sync", file)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `unknown field "limitz"`)
	assert.Contains(t, errOut, `want {"limits": [{"name": "api", "limit": 4, "shards": 1}]`, "the error shows the JSON wanted")
	for _, body := range []string{`{"limits": {}}`, `[{"name": "x", "limit": "4"}]`, `"limits"`, `{"limits": [`, ``} {
		require.NoError(t, os.WriteFile(file, []byte(body), 0o600))
		_, errOut, code = s.cli(t, "limits", "sync", file)
		assert.Equal(t, 1, code, body)
		assert.Contains(t, errOut, `want {"limits": [`, body)
		assert.Contains(t, errOut, `or a bare array of limits`, body)
		assert.NotRegexp(t, `main\.|Go (value|type)|gate\.Limit`, errOut, "no Go type in the error of %s", body)
	}
	_, _, code = s.cli(t, "limits", "drop")
	assert.Equal(t, 2, code)
}

// TestCLILimitsSetUnset: set and unset change one limit, a key's own
// among them, and leave the others; a per-key limit needs its name's.
func TestCLILimitsSetUnset(t *testing.T) {
	t.Parallel()
	s := seed(t)
	out := s.ok(t, "limits", "set", "stripe:acct_big", "50", "-shards", "5")
	assert.Contains(t, out, "stripe:acct_big: K = 2 (its name's limit) -> K = 50")
	out = s.ok(t, "limits", "ls")
	assert.Equal(t, []string{"stripe", "2", "1"}, line(t, out, "stripe "), "the name's limit is left alone")
	assert.Equal(t, []string{"stripe:acct_big", "(this", "key", "only)", "50", "5"}, line(t, out, "stripe:acct_big"))
	assert.Contains(t, s.ok(t, "explain", "stripe:acct_big"), `per-key limit of "stripe:acct_big": K = 50`)

	_, errOut, code := s.cli(t, "limits", "unset", "stripe")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "per-key limit on a key name without a limit", "a name keeps its limit while a key of it has its own")
	_, errOut, code = s.cli(t, "limits", "set", "account:7", "3")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `add a limit for "account" first`, "a K = 1 name stays K = 1 for every key")
	_, errOut, code = s.cli(t, "limits", "set", "stripe:acct_big", "5", "-namespace", "ops")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `owned by another namespace "default"`)

	assert.Contains(t, s.ok(t, "limits", "unset", "stripe:acct_big", "-dry-run"), "would change")
	assert.Contains(t, s.ok(t, "limits", "ls"), "stripe:acct_big", "a dry run stores nothing")
	out = s.ok(t, "limits", "unset", "stripe:acct_big")
	assert.Contains(t, out, "stripe:acct_big: K = 50 -> K = 2 (its name's limit)")
	assert.NotContains(t, s.ok(t, "limits", "ls"), "stripe:acct_big")
	assert.Contains(t, s.ok(t, "limits", "unset", "stripe:acct_big"), "0 changed", "unset of what is not stored changes nothing")
	_, _, code = s.cli(t, "limits", "set", "stripe:x")
	assert.Equal(t, 2, code)
}

// TestCLILimitsListFilters: `limits ls` prints at most 20 per-key limits
// of a name and says how to list the rest; with a name it lists that
// name's limit and all its keys' own, with a key its name's and its own;
// -json, the file limits sync reads, prints every limit or nothing.
func TestCLILimitsListFilters(t *testing.T) {
	t.Parallel()
	s := migrated(t)
	ctx := context.Background()
	ls := []gate.Limit{{Name: "stripe", Limit: 2}, {Name: "mail", Limit: 4}, {Name: "mail:vip", Limit: 8}}
	for i := range 25 {
		ls = append(ls, gate.Limit{Name: fmt.Sprintf("stripe:t%02d", i), Limit: 3 + i})
	}
	_, err := s.st.SyncKeyLimits(ctx, store.DefaultNamespace, store.KeyLimits{Limits: ls}, store.SyncOptions{})
	require.NoError(t, err)
	perKeyLines := func(out, name string) int { return strings.Count(out, "  "+name+":") }

	out := s.ok(t, "limits", "ls")
	assert.Equal(t, 20, perKeyLines(out, "stripe"), out)
	assert.Equal(t, []string{"stripe:t19", "(this", "key", "only)", "22", "1"}, line(t, out, "stripe:t19"))
	assert.NotContains(t, out, "stripe:t20")
	assert.Contains(t, out, "5 more per-key limits of stripe: durable limits ls stripe\n")
	assert.Equal(t, 1, perKeyLines(out, "mail"), out)
	assert.NotContains(t, out, "more per-key limits of mail")

	out = s.ok(t, "limits", "ls", "stripe")
	assert.Equal(t, 25, perKeyLines(out, "stripe"), out)
	assert.Equal(t, []string{"stripe", "2", "1"}, line(t, out, "stripe "))
	assert.NotContains(t, out, "mail")
	assert.NotContains(t, out, "more per-key")

	out = s.ok(t, "limits", "ls", "stripe:t03")
	assert.Equal(t, []string{"stripe", "2", "1"}, line(t, out, "stripe "))
	assert.Equal(t, []string{"stripe:t03", "(this", "key", "only)", "6", "1"}, line(t, out, "stripe:t03"))
	assert.Equal(t, 1, perKeyLines(out, "stripe"), out)

	out = s.ok(t, "limits", "ls", "stripe:other")
	assert.Equal(t, []string{"stripe", "2", "1"}, line(t, out, "stripe "))
	assert.Zero(t, perKeyLines(out, "stripe"), out)
	assert.Contains(t, out, "stripe:other has no limit of its own: it runs at its name's")

	assert.Contains(t, s.ok(t, "limits", "ls", "account:7"), "no limit for account: its keys run at K = 1")

	var f limitsFile
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "limits", "ls", "-json")), &f))
	assert.Len(t, f.Limits, len(ls), "-json prints every limit")
	_, errOut, code := s.cli(t, "limits", "ls", "stripe", "-json")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "not one NAME's")
}

func cliExplainSaturatedKey(t *testing.T, s *seeded) {
	out := s.ok(t, "explain", "account:7")
	t.Log("\n" + out)
	holder := line(t, out, s.acctHolder)
	assert.Equal(t, []string{s.acctHolder, "sync", "fetch", "0", "worker-a"}, holder[:5])
	assert.Contains(t, strings.Join(holder, " "), "ago)", "since when")
	assert.Contains(t, strings.Join(holder, " "), "(in ", "lease expiry")
	assert.Contains(t, out, "waiting: 2 (2 blocked)")
	assert.Equal(t, []string{"oldest:", s.acctWaiting[0], "sync/fetch,", "blocked,"}, line(t, out, "oldest:")[:4])
	assert.Equal(t, []string{"next", "in", "line:", s.acctWaiting[0]}, line(t, out, "next in line:")[:4])
	assert.Equal(t, []string{"concurrency", "1/1", "in", "use", "BLOCKING", "no", "limit", "configured", "for", `"account":`},
		line(t, out, "concurrency")[:10])
	assert.Equal(t, []string{"rate", "-", "not", "configured"}, line(t, out, "rate")[:4])
	assert.Equal(t, []string{"fleet", "-", "not", "configured"}, line(t, out, "fleet")[:4])
	assert.Contains(t, out, "blocking now: concurrency\nblocked by its concurrency limit: all 1 slot(s) of account:7 are held")

	var x explanation
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "explain", "account:7", "-json")), &x))
	assert.Equal(t, "concurrency", x.Blocking)
	require.Len(t, x.Holders, 1)
	assert.Equal(t, "worker-a", x.Holders[0].Worker)
	assert.Equal(t, 2, x.Waiting.Count)
	assert.Equal(t, s.acctWaiting[0], x.Waiting.Next.ID)
	assert.Equal(t, []limitCheck{
		{Kind: "concurrency", Applies: true, Limit: 1, InUse: 1, Blocking: true, Detail: `no limit configured for "account": K = 1, one at a time per key; 1 held, 0 free`},
		{Kind: "rate", Detail: `no rate limit for "account"`},
		{Kind: "fleet", Detail: `no policy for queue "default"`},
	}, x.Limits)
}

func cliExplainGateAndFreeKeys(t *testing.T, s *seeded) {
	out := s.ok(t, "explain", "stripe:t")
	assert.Contains(t, out, "holders: 2")
	assert.Contains(t, out, "waiting: 1 (1 blocked)")
	assert.Equal(t, []string{"concurrency", "2/2", "in", "use", "BLOCKING", "gate", `"stripe":`, "K", "=", "2"}, line(t, out, "concurrency")[:10])
	assert.Contains(t, out, "blocking now: concurrency")

	out = s.ok(t, "explain", "stripe:captured")
	assert.Contains(t, out, "holders: none")
	assert.Equal(t, []string{"concurrency", "0/2", "in", "use", "ok"}, line(t, out, "concurrency")[:5])
	assert.Contains(t, out, "blocking now: none\nnot blocked by any limit: the ready rows of stripe:captured wait for a free executor on queue other")

	out = s.ok(t, "explain", "account:1")
	assert.Contains(t, out, "waiting: 0 (0 blocked)")
	assert.Contains(t, out, "nothing holds or waits for account:1")

	_, errOut, code := s.cli(t, "explain", "nokey")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `"nokey" is not a concurrency key`)
}

func TestCLIErrors(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaOf(pool) // exists, never migrated

	_, errOut, code := runBinary(t, nil, "health")
	assert.Equal(t, 1, code)
	assert.Equal(t, "durable: health: no database: pass -database-url or set DATABASE_URL\n", errOut)

	_, errOut, code = runBinary(t, []string{"DATABASE_URL=postgres://u:hunter2@[::1"}, "ls")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "durable: ls: bad database URL")
	assert.NotContains(t, errOut, "hunter2", "the password is never printed")

	_, errOut, code = runBinary(t, []string{"DATABASE_URL=postgres://postgres@127.0.0.1:1/test?connect_timeout=2"}, "health")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "cannot reach PostgreSQL at 127.0.0.1:1/test")

	_, errOut, code = runBinary(t, []string{"DATABASE_URL=" + url}, "health", "-schema", schema)
	assert.Equal(t, 1, code)
	assert.Equal(t, "durable: health: schema \""+schema+"\" has no godurable tables: run `durable migrate -schema "+schema+"` first\n", errOut)

	_, errOut, code = runBinary(t, []string{"DATABASE_URL=" + url}, "ls", "-schema", "Not-A-Schema")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "invalid schema name")

	// Behind this build: migrated to version 1 only.
	_, _, code = runBinary(t, []string{"DATABASE_URL=" + url}, "migrate", "-schema", schema)
	require.Equal(t, 0, code)
	_, _, code = runBinary(t, []string{"DATABASE_URL=" + url}, "migrate", "-schema", schema, "-down", "1")
	require.Equal(t, 0, code)
	_, errOut, code = runBinary(t, []string{"DATABASE_URL=" + url}, "show", "-schema", schema, "6f1c1f8e-8a7e-4c41-9d5a-0b3a1b7f3c11")
	assert.Equal(t, 1, code)
	ms, err := postgres.Migrations()
	require.NoError(t, err)
	assert.Contains(t, errOut, fmt.Sprintf("is at version 1, this build needs %d: run `durable migrate -schema %s`", len(ms), schema))

	_, errOut, code = runBinary(t, nil, "frobnicate")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `unknown command "frobnicate"`)
	assert.Contains(t, errOut, "usage: durable")
	out, _, code := runBinary(t, nil, "help")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "explain KEY")
	_, errOut, code = runBinary(t, nil, "health", "-bogus")
	assert.Equal(t, 2, code)
	assert.Equal(t, "durable: health: flag provided but not defined: -bogus (see durable health -h)\n", errOut,
		"the error once, without the flag defaults")
	_, errOut, code = runBinary(t, nil, "limits", "sync", "-bogus", "f.json")
	assert.Equal(t, 2, code)
	assert.Equal(t, 1, strings.Count(errOut, "-bogus"), "the error once:\n%s", errOut)
	_, errOut, code = runBinary(t, nil, "health", "-h")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "-json", "-h lists the flags")

	// The global flags may come before the command, as help says.
	_, errOut, code = runBinary(t, []string{"DATABASE_URL=" + url}, "-schema", schema, "health")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `schema "`+schema+`" is at version 1`, "-schema before the command is used")
	_, errOut, code = runBinary(t, nil, "--database-url=postgres://u:hunter2@[::1", "-schema", schema, "ls")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "durable: ls: bad database URL")
	_, errOut, code = runBinary(t, nil, "-json", "health")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "flag -json before the command: only -database-url and -schema may come before it")
	_, errOut, code = runBinary(t, nil, "-schema")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "flag -schema needs a value")
}

// TestCLIExplainFreeK1Key explains a K = 1 key whose rows wait for an
// executor while none of them runs: the key's one slot is free, so nothing
// blocks it, and nothing is said to have leaked.
func TestCLIExplainFreeK1Key(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := migrated(t)
	idle := newEngine(t, s.st)
	for range 2 {
		_, err := idle.Insert(ctx, "sync", payment{Amount: 1}, durable.InsertOptions{Key: gate.Identity("account", "9")})
		require.NoError(t, err)
	}

	out := s.ok(t, "explain", "account:9")
	t.Log("\n" + out)
	assert.Contains(t, out, "holders: none")
	assert.Contains(t, out, "waiting: 2 (0 blocked)")
	assert.Equal(t, []string{"concurrency", "0/1", "in", "use", "ok"}, line(t, out, "concurrency")[:5])
	assert.Contains(t, out, "blocking now: none\nnot blocked by any limit: the ready rows of account:9 wait for a free executor on queue default")
	assert.NotContains(t, out, "leaked")

	var x explanation
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "explain", "account:9", "-json")), &x))
	assert.Empty(t, x.Blocking)
	assert.Equal(t, limitCheck{Kind: "concurrency", Applies: true, Limit: 1,
		Detail: `no limit configured for "account": K = 1, one at a time per key; 0 held, 1 free`}, x.Limits[0])
}

// TestCLIExplainRateAndFleet explains a key throttled by its rate limit and
// a key held back by its queue's fleet policy.
func TestCLIExplainRateAndFleet(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := migrated(t)
	_, err := s.st.SyncKeyLimits(ctx, "billing", store.KeyLimits{
		Limits:     []gate.Limit{{Name: "api", Limit: 5}, {Name: "tenant", Limit: 10}},
		RateLimits: []gate.RateLimit{{Name: "api", Limit: 1, Period: time.Hour, Burst: 1, PerKey: true}}}, store.SyncOptions{})
	require.NoError(t, err)
	_, err = s.st.SyncConcurrencyPolicies(ctx, "billing", []store.ConcurrencyPolicy{{Queue: "mail", MaxActive: 1}}, store.SyncOptions{})
	require.NoError(t, err)
	idle := newEngine(t, s.st)
	for range 3 {
		_, err := idle.Insert(ctx, "sync", payment{Amount: 1}, durable.InsertOptions{Key: gate.Gate("api", "x")})
		require.NoError(t, err)
	}
	for range 2 {
		_, err := idle.Insert(ctx, "sync", payment{Amount: 1}, durable.InsertOptions{Key: gate.Gate("tenant", "1"), Queue: "mail"})
		require.NoError(t, err)
	}
	for _, q := range []string{"default", "mail"} {
		res, err := s.st.Claim(ctx, store.ClaimRequest{Queue: q, Worker: "worker-a", Limit: 10, Lease: time.Hour})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 1, "queue %s", q)
	}

	out := s.ok(t, "explain", "api:x")
	t.Log("\n" + out)
	assert.Equal(t, []string{"rate", "1/1", "in", "use", "BLOCKING", "rate", "limit", `"api":`, "1", "per", "1h0m0s,"}, line(t, out, "rate")[:11])
	assert.Contains(t, out, "blocking now: rate\nthrottled by its rate limit: the bucket of api:x holds no token")
	var x explanation
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "explain", "api:x", "-json")), &x))
	assert.Equal(t, "rate", x.Blocking)

	out = s.ok(t, "explain", "tenant:1")
	t.Log("\n" + out)
	assert.Equal(t, []string{"fleet", "1/1", "in", "use", "BLOCKING", "queue", `"mail"`, `(namespace`, `"billing"):`}, line(t, out, "fleet")[:9])
	assert.Contains(t, out, `blocking now: fleet`)
	assert.Equal(t, []string{"rate", "-", "not", "configured"}, line(t, out, "rate")[:4])
}

// TestCLIHealthPolicyPressure shows a queue policy's pressure: the ready
// rows a full MaxActive holds back and the keys at MaxActivePerKey with
// work waiting, in text and JSON, without key ids.
func TestCLIHealthPolicyPressure(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := migrated(t)
	_, err := s.st.SyncConcurrencyPolicies(ctx, "mailers", []store.ConcurrencyPolicy{{Queue: "mail", MaxActive: 2, MaxActivePerKey: 1}}, store.SyncOptions{})
	require.NoError(t, err)
	idle := newEngine(t, s.st)
	insert := func(k gate.ConcurrencyKey) {
		_, err := idle.Insert(ctx, "sync", payment{Amount: 1}, durable.InsertOptions{Key: k, Queue: "mail"})
		require.NoError(t, err)
	}
	insert(gate.Identity("account", "secret-1"))
	insert(gate.Identity("account", "secret-1"))
	for range 3 {
		insert(gate.ConcurrencyKey{})
	}
	res, err := s.st.Claim(ctx, store.ClaimRequest{Queue: "mail", Worker: "worker-a", Limit: 10, Lease: time.Hour})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 2, "MaxActive 2")

	out := s.ok(t, "health")
	t.Log("\n" + out)
	assert.Equal(t, []string{"POLICY", "MAX", "ACTIVE", "ACTIVE", "BLOCKED", "READY", "MAX", "PER", "KEY", "SATURATED", "KEYS"},
		line(t, out, "POLICY"))
	policies := strings.SplitN(out, "POLICY", 2)
	require.Len(t, policies, 2, "a policy section:\n%s", out)
	// policy max-active active blocked-ready max-per-key saturated-keys
	assert.Equal(t, []string{"mail", "2", "2", "2", "1", "1"}, line(t, policies[1], "mail"))
	assert.NotContains(t, out, "secret-1", "no key id in health")

	jsonOut := s.ok(t, "health", "-json")
	assert.NotContains(t, jsonOut, "secret-1", "no key id in health")
	var h healthReport
	require.NoError(t, json.Unmarshal([]byte(jsonOut), &h))
	require.Len(t, h.Queues, 1)
	assert.Equal(t, store.QueueHealth{Queue: "mail", Ready: 2, Blocked: 1, Executing: 2, OldestReady: h.Queues[0].OldestReady,
		MaxActive: 2, MaxActivePerKey: 1, Active: 2, BlockedReady: 2, SaturatedKeys: 1}, h.Queues[0])
	assert.Contains(t, jsonOut, `"blocked_ready": 2`)
	assert.Contains(t, jsonOut, `"saturated_keys": 1`)
}

// TestCLIPoliciesAndRateLimits syncs and lists queue policies and rate
// limits, and finds them in health.
func TestCLIPoliciesAndRateLimits(t *testing.T) {
	t.Parallel()
	s := migrated(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}

	out := s.ok(t, "policies", "sync", write("p.json", `{"policies": [{"queue": "mail", "max_active": 20, "max_active_per_key": 3}]}`), "-namespace", "mailers")
	assert.Contains(t, out, `policies of namespace "mailers" synced: 1`)
	_, errOut, code := s.cli(t, "policies", "sync", write("q.json", `{"policies": [{"queue": "mail", "max_active": 1}]}`), "-namespace", "intruders")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `queue "mail": owned by another namespace "mailers"`)
	out = s.ok(t, "policies", "ls")
	assert.Equal(t, []string{"mail", "mailers", "20", "3"}, line(t, out, "mail"))

	// A bare array works for policies too, as for limits; errors name the
	// JSON wanted, never a Go type.
	out = s.ok(t, "policies", "sync", write("a.json", `[{"queue": "bulk", "max_active": 2}]`), "-namespace", "bulkers", "-dry-run")
	assert.Contains(t, out, `policies of namespace "bulkers" would store (dry run): 1`)
	assert.Contains(t, out, "bulk: max active 2, per key 0")
	for _, body := range []string{`{"policies": {}}`, `[{"queue": "q", "max_active": "2"}]`, `{"policy": []}`, `[`, ``} {
		_, errOut, code := s.cli(t, "policies", "sync", write("bad.json", body), "-dry-run")
		assert.Equal(t, 1, code, body)
		assert.Contains(t, errOut, `want {"policies": [{"queue": "mail", "max_active": 20, "max_active_per_key": 3}]} or a bare array of policies`, body)
		assert.NotRegexp(t, `main\.|Go (value|type)|store\.Concurrency`, errOut, "no Go type in the error of %s", body)
	}
	var pf policiesFile
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "policies", "ls", "-json")), &pf))
	assert.Equal(t, []store.ConcurrencyPolicy{{Queue: "mail", Namespace: "mailers", MaxActive: 20, MaxActivePerKey: 3}}, pf.Policies)

	out = s.ok(t, "limits", "sync", write("l.json", `{"limits": [{"name": "api", "limit": 4}],
		"rate_limits": [{"name": "api", "limit": 10, "period": "1m", "burst": 2, "per_key": true}]}`))
	assert.Contains(t, out, `rate limit change for key name "api" from no rate limit to 10 per 1m0s, burst 2, per key`)
	out = s.ok(t, "limits", "ls")
	assert.Equal(t, []string{"api", "4", "1"}, line(t, out, "api"))
	rates := strings.SplitN(out, "RATE LIMIT", 2)
	require.Len(t, rates, 2, "a rate limit section:\n%s", out)
	assert.Equal(t, []string{"api", "10", "per", "1m0s", "2", "key"}, line(t, rates[1], "api"))
	out = s.ok(t, "health")
	assert.Equal(t, []string{"mail", "0", "0", "0", "0", "0", "0", "-", "0/20"}, line(t, out, "mail"))
	assert.Contains(t, out, "RATE LIMIT")
}

// TestCLIHealthHandedBack: an instance stuck for five minutes because the
// only worker does not register its workflow version reads as five
// minutes old in health (not as young as its last hand-back), and health
// and show say why.
func TestCLIHealthHandedBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := migrated(t)
	// "sync" version 1 at a step it does not have (a deploy renamed it),
	// ready for five minutes.
	id := uuid.NewString()
	_, err := s.st.Insert(ctx, []store.NewInstance{{ID: id, Workflow: "sync", Version: 1, Queue: "default", Step: "renamed",
		State: json.RawMessage(`{"amount": 1}`), RunAt: time.Now().Add(-5 * time.Minute)}})
	require.NoError(t, err)
	e := newEngine(t, s.st)
	require.NoError(t, e.Start(ctx))
	for {
		in, err := s.st.Get(ctx, id)
		require.NoError(t, err)
		if in.Status == store.StatusReady && !in.ReadySince.IsZero() {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, e.Stop(ctx))

	out := s.ok(t, "health")
	t.Log("\n" + out)
	def := line(t, out, "default")
	// queue ready scheduled blocked executing awaiting failed oldest
	assert.Equal(t, []string{"default", "0", "1", "0", "0", "0", "0"}, def[:7], "handed back for later")
	assert.Regexp(t, `^5m\d+s$`, def[7], "aged from when it became ready, not from the hand-back")
	assert.Equal(t, []string{"HANDED", "BACK", "VERSION", "INSTANCES"}, line(t, out, "HANDED BACK"))
	assert.Equal(t, []string{"sync", "1", "1"}, line(t, out, "sync"))

	var h healthReport
	require.NoError(t, json.Unmarshal([]byte(s.ok(t, "health", "-json")), &h))
	assert.Equal(t, []store.HandBackHealth{{Workflow: "sync", Version: 1, Count: 1}}, h.HandedBack)
	require.Len(t, h.Queues, 1)
	assert.GreaterOrEqual(t, h.Queues[0].OldestReady, 5*time.Minute)

	out = s.ok(t, "show", id)
	assert.Contains(t, strings.Join(line(t, out, "handed back"), " "), "run sync version 1 without its step renamed")
}
