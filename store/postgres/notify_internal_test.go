package postgres

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store"
)

// TestListenOnADeadIdleConnectionConnectsAnew: a first listen that takes an
// idle connection of the pool whose backend is gone (the server restarted
// since the pool used it) makes a new connection at once and listens,
// rather than failing the attempt (which would cost Listen a backoff).
func TestListenOnADeadIdleConnectionConnectsAnew(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := newInternalStore(t)
	// Two idle connections: Listen leaves the pool its last one.
	c1, err := s.pool.Acquire(ctx)
	require.NoError(t, err)
	c2, err := s.pool.Acquire(ctx)
	require.NoError(t, err)
	c1.Release()
	c2.Release()
	var pids []uint32
	for _, c := range s.pool.AcquireAllIdle(ctx) {
		pids = append(pids, c.Conn().PgConn().PID())
		c.Release()
	}
	require.GreaterOrEqual(t, len(pids), 2)
	admin, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	defer func() { _ = admin.Close(context.Background()) }()
	for _, pid := range pids {
		_, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1::int, 5000)", int64(pid))
		require.NoError(t, err)
	}

	lctx, stop := context.WithCancel(ctx)
	connected := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.listenOnce(lctx, func(store.Notification) {}, func() { close(connected) }, true)
	}()
	select {
	case <-connected:
	case err := <-done:
		t.Fatalf("the attempt failed instead of connecting anew: %v", err)
	case <-ctx.Done():
		t.Fatal("never listened")
	}
	var pid uint32
	require.NoError(t, admin.QueryRow(ctx, `SELECT pid::bigint FROM pg_stat_activity
		WHERE query LIKE 'LISTEN %' AND query LIKE '%' || $1 || '%'`, s.channel).Scan(&pid))
	require.NotContains(t, pids, pid, "it listens on a live backend")
	stop()
	<-done
}

// TestFirstListenWaitsForTheFirstClaim: with no idle connection to spare,
// Listen's first connection is made only once the store's first claim
// returned (see listenConn), or the store's listenWait after it began
// without one.
func TestFirstListenWaitsForTheFirstClaim(t *testing.T) {
	for _, claim := range []bool{true, false} {
		name := map[bool]string{true: "after the first claim", false: "after listenWait"}[claim]
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s := newInternalStore(t)
			s.listenWait = 400 * time.Millisecond
			if claim {
				s.listenWait = time.Hour // only the claim can end the wait
			}
			idle := s.pool.AcquireAllIdle(ctx)
			require.NotEmpty(t, idle)
			idle[0].Release()
			for _, c := range idle[1:] { // the pool keeps one idle connection
				require.NoError(t, c.Hijack().Close(ctx))
			}

			listening := make(chan time.Time, 1)
			lctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			began := time.Now()
			go func() {
				done <- s.Listen(lctx, func(n store.Notification) {
					if n == (store.Notification{}) {
						select {
						case listening <- time.Now():
						default:
						}
					}
				})
			}()
			defer func() { stop(); require.NoError(t, <-done) }()
			select {
			case <-listening:
				t.Fatal("Listen connected before the first claim, with no idle connection to spare")
			case <-time.After(200 * time.Millisecond):
			}
			if claim {
				claimOne(t, s)
			}
			select {
			case at := <-listening:
				if !claim {
					require.GreaterOrEqual(t, at.Sub(began), s.listenWait)
				}
			case <-ctx.Done():
				t.Fatal("Listen never listened")
			}
		})
	}
}

// TestFreeingTransactionsDoNotNotify: no statement a freeing transaction
// queues (queueFree, for a K = 1 key and a credited gate shard) calls
// pg_notify. A NOTIFY in a transaction holds PostgreSQL's notification
// lock from its pre-commit to the end of its commit, WAL flush included,
// so every outcome flush that promotes a row would commit one at a time
// with every other notifying transaction (see wakeSender); the queues of
// the rows it makes ready are notified after its commit (heal).
func TestFreeingTransactionsDoNotNotify(t *testing.T) {
	s := &Store{schema: "t_free"}
	var b pgx.Batch
	s.queueFree(&b, []freedSlot{{key: "acct:1", shard: -1, waiters: true}, {key: "hot:1", shard: 0, waiters: true}}, true, time.Time{})
	require.NotEmpty(t, batchSQL(&b))
	for _, sql := range batchSQL(&b) {
		require.NotContains(t, sql, "pg_notify", "a statement of a freeing transaction notifies")
	}
}

// TestPromotionNotifiesItsQueueAfterTheCommit: the row an outcome promotes
// (its K = 1 key's next blocked row) wakes its queue's listeners, though
// the outcome's transaction no longer notifies (see
// TestFreeingTransactionsDoNotNotify), and the row is ready when the
// notification arrives.
func TestPromotionNotifiesItsQueueAfterTheCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := newInternalStore(t)
	listener, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	require.NoError(t, err)
	defer func() { _ = listener.Close(context.Background()) }()
	_, err = listener.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize())
	require.NoError(t, err)

	row := func() store.NewInstance {
		return store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`), Key: "acct:1"}
	}
	holder := row()
	_, err = s.Insert(ctx, []store.NewInstance{holder})
	require.NoError(t, err)
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	next := row()
	_, err = s.Insert(ctx, []store.NewInstance{next})
	require.NoError(t, err)
	require.Equal(t, store.StatusBlocked, statusOf(t, s, next.ID), "behind its key's running row")
	drainNotifications(ctx, listener) // the inserts' own

	c := res.Claimed[0]
	_, err = s.Complete(ctx, "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone}}, time.Time{})
	require.NoError(t, err)
	n, err := listener.WaitForNotification(ctx)
	require.NoError(t, err, "the promoted row's queue was not notified")
	require.Equal(t, "q", n.Payload)
	require.Equal(t, store.StatusReady, statusOf(t, s, next.ID))
}

// argsRecorder records the arguments of every query of a pool whose text
// is one of the statements it watches (a pgx.QueryTracer and
// pgx.BatchTracer).
type argsRecorder struct {
	mu    sync.Mutex
	watch map[string]string // text -> name
	seen  map[string][][]any
	inTx  map[string][]bool // name -> for each call, whether its connection was in a transaction
}

func (r *argsRecorder) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if name, ok := r.watch[d.SQL]; ok {
		r.seen[name] = append(r.seen[name], d.Args)
		r.inTx[name] = append(r.inTx[name], c.PgConn().TxStatus() != 'I')
	}
	return ctx
}

func (r *argsRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The statements of a batch, recorded as the queries above (a
// pgx.BatchTracer).
func (r *argsRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (r *argsRecorder) TraceBatchQuery(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.TraceQueryStart(ctx, c, pgx.TraceQueryStartData{SQL: d.SQL, Args: d.Args})
}

func (r *argsRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// take returns, for the calls of statement name so far, their arguments
// and whether each call's connection was in a transaction when it was sent
// (a statement of a batch: when its result was read, before the batch's
// end), and forgets them.
func (r *argsRecorder) take(name string) ([][]any, []bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	args, inTx := r.seen[name], r.inTx[name]
	delete(r.seen, name)
	delete(r.inTx, name)
	return args, inTx
}

// calls returns the arguments of the calls of statement name so far (see take).
func (r *argsRecorder) calls(name string) [][]any {
	args, _ := r.take(name)
	return args
}

// inTransaction returns, for the calls of statement name so far, whether
// each call's connection was in a transaction (see take).
func (r *argsRecorder) inTransaction(name string) []bool {
	_, inTx := r.take(name)
	return inTx
}

// tracedStore is a store on a pool of its own whose calls of the
// statements of watch (statement -> name) rec records, and a connection
// listening on the store's channel; both close with the test.
func tracedStore(ctx context.Context, t *testing.T, watch map[string]string) (*Store, *argsRecorder, *pgx.Conn) {
	t.Helper()
	base := pgtest.Pool(t)
	schema := pgtest.SchemaOf(base)
	rec := &argsRecorder{seen: map[string][][]any{}, inTx: map[string][]bool{}, watch: map[string]string{}}
	cfg := base.Config().Copy()
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = Migrate(ctx, pool, schema)
	require.NoError(t, err)
	s, err := New(ctx, pool, Options{Schema: schema})
	require.NoError(t, err)
	rec.mu.Lock()
	for stmt, name := range watch {
		rec.watch[s.q(stmt)] = name
	}
	rec.mu.Unlock()
	listener, err := pgx.ConnectConfig(ctx, base.Config().ConnConfig.Copy())
	require.NoError(t, err)
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	_, err = listener.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize())
	require.NoError(t, err)
	return s, rec, listener
}

// TestInsertBesideAnotherNotifiesAfterItsCommit: an Insert made while
// another of the store's is in flight leaves its statement's notification
// out (an empty channel: see sqlInsert) and notifies the queue once it
// has committed, so that concurrent inserts do not commit one at a time
// behind PostgreSQL's notification lock; one made alone notifies in its
// statement. Either way the queue's listeners hear of the row.
func TestInsertBesideAnotherNotifiesAfterItsCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, rec, listener := tracedStore(ctx, t, map[string]string{sqlInsert: "insert", sqlNotifyQueues: "notify"})
	insert := func() {
		t.Helper()
		in := store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`)}
		_, err := s.Insert(ctx, []store.NewInstance{in})
		require.NoError(t, err)
		n, err := listener.WaitForNotification(ctx)
		require.NoError(t, err, "the queue was not notified")
		require.Equal(t, "q", n.Payload)
	}

	insert()
	calls := rec.calls("insert")
	require.Len(t, calls, 1)
	require.Equal(t, s.channel, calls[0][13], "alone: the statement notifies")
	require.Empty(t, rec.calls("notify"))

	s.inserting.Add(1) // another Insert in flight
	insert()
	s.inserting.Add(-1)
	calls = rec.calls("insert")
	require.Len(t, calls, 1)
	require.Equal(t, "", calls[0][13], "beside another: the statement does not notify")
	require.Len(t, rec.calls("notify"), 1, "the queue is notified after the commit")
}

// TestParentWokenByItsLastChildIsNotifiedAfterTheCommit: the outcome of a
// parent's last child wakes the parent without a NOTIFY in the outcome's
// transaction (sqlJoinParents runs with an empty channel: a NOTIFY holds
// PostgreSQL's notification lock through the commit, see wakeSender), and
// the parent's queue is notified once the outcome has committed, the parent
// ready by then.
func TestParentWokenByItsLastChildIsNotifiedAfterTheCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, rec, listener := tracedStore(ctx, t, map[string]string{sqlJoinParents: "join"})

	claimOf := func(queue string) store.Claimed {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimRequest{Queue: queue, Worker: "w", Limit: 1})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 1)
		return res.Claimed[0]
	}
	parent := store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`)}
	_, err := s.Insert(ctx, []store.NewInstance{parent})
	require.NoError(t, err)
	p := claimOf("q")
	child := store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "kids", Step: "s", State: json.RawMessage(`{}`)}
	res, err := s.Complete(ctx, "w", []store.Outcome{{ID: p.ID, Fence: p.Fence, Kind: store.OutcomeSpawn, Step: "joined",
		Children: []store.NewInstance{child}}}, time.Time{})
	require.NoError(t, err)
	require.False(t, res[0].Stale)
	c := claimOf("kids")
	drainNotifications(ctx, listener) // the notifications so far
	_, err = s.Complete(ctx, "w", []store.Outcome{{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeDone}}, time.Time{})
	require.NoError(t, err)
	calls := rec.calls("join")
	require.Len(t, calls, 1)
	require.Equal(t, "", calls[0][3], "the outcome's transaction does not notify")
	awaitQueue(ctx, t, listener, "q", "the parent's queue was not notified") // the child's queue may be notified too
	require.Equal(t, store.StatusReady, statusOf(t, s, parent.ID))
}

// TestReleaseAndReapNotifyAfterTheirCommit: a release of a claim and a
// reap of an expired one make the row ready again and notify its queue
// once their transaction has committed, not inside it (see
// TestFreeingTransactionsDoNotNotify): the queue's listeners hear of the
// row, and no notification is sent from a connection in a transaction.
func TestReleaseAndReapNotifyAfterTheirCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, rec, listener := tracedStore(ctx, t, map[string]string{sqlNotifyQueues: "notify"})
	heard := func(what string) {
		t.Helper()
		awaitQueue(ctx, t, listener, "q", what+": the queue was not notified")
		calls := rec.inTransaction("notify")
		require.NotEmpty(t, calls, what)
		require.NotContains(t, calls, true, "%s: notified inside its transaction", what)
	}
	in := store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", State: json.RawMessage(`{}`)}
	_, err := s.Insert(ctx, []store.NewInstance{in})
	require.NoError(t, err)
	claim := func() store.Claimed {
		t.Helper()
		drainNotifications(ctx, listener) // the insert's own
		rec.calls("notify")
		res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1, Lease: time.Second})
		require.NoError(t, err)
		require.Len(t, res.Claimed, 1)
		return res.Claimed[0]
	}

	c := claim()
	require.NoError(t, s.Release(ctx, "w", []store.ClaimRef{{ID: c.ID, Fence: c.Fence}}, time.Time{}))
	heard("release")
	require.Equal(t, store.StatusReady, statusOf(t, s, in.ID))

	c = claim()
	n, err := s.Reap(ctx, c.LeaseExpiresAt.Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	heard("reap")
	require.Equal(t, store.StatusReady, statusOf(t, s, in.ID))
}

// drainNotifications reads conn's notifications until none comes for 200
// ms, so that a test's next wait hears only what follows.
func drainNotifications(ctx context.Context, conn *pgx.Conn) {
	for {
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			return
		}
	}
}

// awaitQueue waits up to 5 s for a notification of queue on conn, passing
// over those of other queues, and fails with msg when none comes.
func awaitQueue(ctx context.Context, t *testing.T, conn *pgx.Conn, queue, msg string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(wctx)
		require.NoError(t, err, msg)
		if n.Payload == queue {
			return
		}
	}
}
