package durable_test

import (
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/transitions"
)

// logBuffer collects log text from any goroutine.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// linesWith returns the log lines that contain every one of parts.
func linesWith(logs string, parts ...string) []string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		all := l != ""
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			out = append(out, l)
		}
	}
	return out
}

func onQueue(name, queue string) *durable.Workflow[counter] {
	wf := durable.NewWorkflow[counter](name, "run", durable.WorkflowOptions{Queue: queue})
	wf.Step("run", func(ctx steps.Context, s counter) (transitions.Transition, error) { return transitions.Done(s.N), nil })
	return wf
}

func TestRegisterWarnsOncePerQueueTheEngineDoesNotWork(t *testing.T) {
	var logs logBuffer
	newEngine(t, durable.Config{Queues: map[string]int{"default": 1}, Logger: textLogger(&logs)},
		onQueue("a", "mail"), onQueue("b", "mail"), onQueue("c", "default"))
	warns := linesWith(logs.String(), "level=WARN", "queue this engine does not work")
	require.Len(t, warns, 1, "one warning for the queue mail:\n%s", logs.String())
	assert.Contains(t, warns[0], "queue=mail")
	assert.Contains(t, warns[0], "workflow=a")
	assert.Contains(t, warns[0], "engine_queues=[default]")
}

// An instance inserted, or a child spawned, into a queue that no engine of
// the fleet works is logged once per queue, and Health lists the queue as
// one nobody works until an engine that works it starts.
func TestQueueNobodyWorksIsWarnedAndInHealth(t *testing.T) {
	backends(t, func(t *testing.T, st store.Store) {
		ctx := waitCtx(t)
		var logs logBuffer
		child := onQueue("side.job", "side")
		parent := durable.NewWorkflow[counter]("parent", "spawn", durable.WorkflowOptions{})
		parent.Step("spawn", func(ctx steps.Context, s counter) (transitions.Transition, error) {
			return transitions.Spawn([]transitions.Child{{Workflow: "side.job", State: counter{}, Queue: "side"}}, "after", s), nil
		})
		parent.Step("after", func(ctx steps.Context, s counter) (transitions.Transition, error) { return transitions.Done(0), nil })
		e := newEngine(t, durable.Config{Store: st, Queues: map[string]int{"default": 2}, Logger: textLogger(&logs)},
			onQueue("mail.send", "mail"), child, parent)
		start(t, e)

		for range 2 {
			_, err := e.Insert(ctx, "mail.send", counter{}, durable.InsertOptions{})
			require.NoError(t, err)
		}
		_, err := e.Insert(ctx, "mail.send", counter{}, durable.InsertOptions{Queue: "default"})
		require.NoError(t, err, "an insert into a queue the engine works")
		pid, err := e.Insert(ctx, "parent", counter{}, durable.InsertOptions{})
		require.NoError(t, err)
		eventually(t, "the parent waits for its child", func() bool {
			in, err := e.Get(ctx, pid)
			require.NoError(t, err)
			return in.Status == store.StatusChildren
		})

		out := logs.String()
		mail := linesWith(out, "level=WARN", "no engine has claimed from recently", "queue=mail ")
		require.Len(t, mail, 1, "once for the two inserts into mail:\n%s", out)
		assert.Contains(t, mail[0], "workflow=mail.send")
		side := linesWith(out, "level=WARN", "no engine has claimed from recently", "queue=side ")
		require.Len(t, side, 1, "the spawn into side:\n%s", out)
		assert.Empty(t, linesWith(out, "no engine has claimed from recently", "queue=default"), "the engine works default")

		h, err := e.Health(ctx)
		require.NoError(t, err)
		require.Len(t, h.UnworkedQueues, 2, "%+v", h.UnworkedQueues)
		assert.Equal(t, "mail", h.UnworkedQueues[0].Queue)
		assert.Equal(t, int64(2), h.UnworkedQueues[0].Ready)
		assert.Nil(t, h.UnworkedQueues[0].LastWorked, "no engine ever worked it")
		assert.Equal(t, "side", h.UnworkedQueues[1].Queue)
		assert.Equal(t, int64(1), h.UnworkedQueues[1].Ready)

		// An engine that works mail and side starts: the queues are worked
		// from its Start on, and their rows run.
		worker := newEngine(t, durable.Config{Store: st, Queues: map[string]int{"mail": 1, "side": 1}}, onQueue("mail.send", "mail"), child)
		start(t, worker)
		h, err = e.Health(ctx)
		require.NoError(t, err)
		assert.Empty(t, h.UnworkedQueues)
		_, err = e.Wait(ctx, pid)
		require.NoError(t, err)
	})
}

// The record of worked queues follows the engine's clock under Tick (the
// durabletest driver): a queue an engine ticks is worked, one nobody
// ticks is not.
func TestTickMarksTheQueuesItWorks(t *testing.T) {
	ctx := waitCtx(t)
	clock := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	st := memory.New(memory.Options{Clock: clock.Now})
	e := newEngine(t, durable.Config{Store: st, Clock: clock, Queues: map[string]int{"default": 1}}, onQueue("a", "default"), onQueue("b", "mail"))
	_, err := e.Insert(ctx, "a", counter{}, durable.InsertOptions{Delay: time.Hour})
	require.NoError(t, err)
	_, err = e.Insert(ctx, "b", counter{}, durable.InsertOptions{})
	require.NoError(t, err)
	_, err = e.Tick(ctx)
	require.NoError(t, err)
	clock.Add(30 * time.Second)
	h, err := e.Health(ctx)
	require.NoError(t, err)
	require.Len(t, h.UnworkedQueues, 1)
	assert.Equal(t, "mail", h.UnworkedQueues[0].Queue)
	assert.Equal(t, 30*time.Second, h.UnworkedQueues[0].OldestReady)

	clock.Add(store.QueueWorkedWithin)
	h, err = e.Health(ctx)
	require.NoError(t, err)
	require.Len(t, h.UnworkedQueues, 2, "no tick for longer than QueueWorkedWithin: default's scheduled row waits too")
	_, err = e.Tick(ctx)
	require.NoError(t, err)
	h, err = e.Health(ctx)
	require.NoError(t, err)
	require.Len(t, h.UnworkedQueues, 1, "a tick marks default again")
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestInsertErrorsNameTheRequestOnlyInABatch(t *testing.T) {
	ctx := waitCtx(t)
	e := newEngine(t, durable.Config{}, counterWorkflow())
	_, err := e.Insert(ctx, "nope", counter{}, durable.InsertOptions{})
	require.ErrorIs(t, err, durable.ErrUnknownWorkflow)
	assert.NotContains(t, err.Error(), "#0")
	assert.Contains(t, err.Error(), "call Register", "the string-named insert gives the typed API's hint")

	_, err = e.Insert(ctx, "count", math.NaN(), durable.InsertOptions{})
	require.ErrorIs(t, err, durable.ErrEncode)
	assert.NotContains(t, err.Error(), "#0")

	_, err = e.InsertMany(ctx, []durable.InsertRequest{{Workflow: "count", State: counter{}}, {Workflow: "nope"}})
	require.ErrorIs(t, err, durable.ErrUnknownWorkflow)
	assert.Contains(t, err.Error(), "insert #1")
}
