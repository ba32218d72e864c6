package durable_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
)

// listenCounting is a store that counts who listens: a Listen call
// listens until its context is done.
type listenCounting struct {
	*memory.Store
	listening atomic.Int64
}

func (s *listenCounting) Listen(ctx context.Context, fn func(store.Notification)) error {
	s.listening.Add(1)
	context.AfterFunc(ctx, func() { s.listening.Add(-1) })
	return s.Store.Listen(ctx, fn)
}

// TestStartListensWhileItSyncsAndStopsListeningWhenRefused: Start opens the
// store's notifications while it syncs limits and reclaims (Scheduler.Listen);
// a Start that is refused stops listening before it returns, and a started
// engine listens until Stop.
func TestStartListensWhileItSyncsAndStopsListeningWhenRefused(t *testing.T) {
	ctx := waitCtx(t)
	st := &listenCounting{Store: memory.New(memory.Options{})}
	_, err := st.SyncKeyLimits(ctx, store.DefaultNamespace, store.KeyLimits{Limits: []gate.Limit{{Name: "api", Limit: 2}}})
	require.NoError(t, err)
	_, err = st.Insert(ctx, []store.NewInstance{{ID: "6f1c1f8e-8a7e-4c41-9d5a-0b3a1b7f3c12", Workflow: "count", Version: 1,
		Queue: "other", Step: "inc", State: json.RawMessage(`{}`), Key: "api:1"}})
	require.NoError(t, err)

	refused := newEngine(t, durable.Config{Store: st, Strict: true, Limits: []gate.Limit{{Name: "api", Limit: 9}}}, counterWorkflow())
	require.ErrorIs(t, refused.Start(ctx), gate.ErrPrefixCapture)
	require.Eventually(t, func() bool { return st.listening.Load() == 0 }, 5*time.Second, time.Millisecond,
		"a refused Start leaves no listener")

	e := newEngine(t, durable.Config{Store: st, WorkerID: "w2"}, counterWorkflow())
	require.NoError(t, e.Start(ctx))
	require.EqualValues(t, 1, st.listening.Load())
	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, e.Stop(stopCtx))
	require.Eventually(t, func() bool { return st.listening.Load() == 0 }, 5*time.Second, time.Millisecond,
		"Stop stops listening")
}
