package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMigrateEmbedded(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.SchemaOf(pool)

	_, err := postgres.New(ctx, pool, postgres.Options{Schema: schema})
	require.ErrorContains(t, err, "run Migrate", "New refuses an unmigrated schema")

	ms, err := postgres.Migrations()
	require.NoError(t, err)
	done, err := postgres.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	require.Len(t, done, len(ms))
	done, err = postgres.Migrate(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, done, "a second Migrate applies nothing")
	v, err := postgres.AppliedVersions(ctx, pool, schema)
	require.NoError(t, err)
	require.Len(t, v, len(ms))
	var at time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT applied_at FROM schema_migrations WHERE version = 1").Scan(&at))
	require.WithinDuration(t, time.Now(), at, time.Minute)

	_, err = postgres.New(ctx, pool, postgres.Options{Schema: schema})
	require.NoError(t, err)

	done, err = postgres.MigrateDown(ctx, pool, schema, 0)
	require.NoError(t, err)
	require.Len(t, done, len(ms))
	var n int
	require.NoError(t, pool.QueryRow(ctx,
		"SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename <> 'schema_migrations'", schema).Scan(&n))
	require.Zero(t, n, "down to 0 removes every table")
	_, err = postgres.MigrateDown(ctx, pool, schema, len(ms)+1)
	require.Error(t, err)

	// Up again after down, and concurrent migrators serialize on the lock.
	errs := make(chan error, 4)
	for range 4 {
		go func() { _, err := postgres.Migrate(ctx, pool, schema); errs <- err }()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	v, err = postgres.AppliedVersions(ctx, pool, schema)
	require.NoError(t, err)
	require.Len(t, v, len(ms))
}

func TestSchemaValidation(t *testing.T) {
	for _, ok := range []string{"durable", "_x", "a1_b2", "a23456789012345678901234567890123456789012345678901234567890123"} {
		require.NoError(t, postgres.ValidateSchema(ok), ok)
	}
	for _, bad := range []string{"", "Durable", "1abc", "a-b", "a b", `a"b`, "pg_catalog", "durable;drop",
		"a234567890123456789012345678901234567890123456789012345678901234"} {
		err := postgres.ValidateSchema(bad)
		require.ErrorIs(t, err, postgres.ErrInvalidSchema, bad)
	}
	e := newEnv(t)
	_, err := postgres.New(e.ctx, e.pool, postgres.Options{Schema: "Bad"})
	require.ErrorIs(t, err, postgres.ErrInvalidSchema)
	_, err = postgres.Migrate(e.ctx, e.pool, "x;y")
	require.ErrorIs(t, err, postgres.ErrInvalidSchema)
	require.Len(t, postgres.Channel("a234567890123456789012345678901234567890123456789012345678901234"), 26)
}

func requireViolation(t *testing.T, err error, code string) {
	t.Helper()
	var pe *pgconn.PgError
	require.True(t, errors.As(err, &pe), "want a PostgreSQL error, got %v", err)
	require.Equal(t, code, pe.Code, pe.Message)
}

func TestSecondExecutingRowOfK1KeyIsUncommittable(t *testing.T) {
	e := newEnv(t)
	ids := e.insert(newInstance("account:1"), newInstance("account:1"))
	c := e.claim("w", 10)
	require.Len(t, c, 1)
	// Bypass admission: make the other row executing by hand.
	_, err := e.pool.Exec(e.ctx, `UPDATE instances SET status = 'executing', worker = 'rogue',
		lease_expires_at = now() + interval '1 minute' WHERE id = $1`, ids[1])
	requireViolation(t, err, "23505")
	// Its gate form (with a shard) is allowed only because a counter debited it.
	_, err = e.pool.Exec(e.ctx, `UPDATE instances SET key_shard = 0 WHERE id = $1`, ids[1])
	requireViolation(t, err, "23514") // a shard on a non-executing row
}

func TestCounterCheckConstraint(t *testing.T) {
	e := newEnv(t)
	_, err := e.s.SyncLimits(e.ctx, []gate.Limit{{Name: "stripe", Limit: 2}})
	require.NoError(t, err)
	e.insert(newInstance("stripe:a"), newInstance("stripe:a"), newInstance("stripe:a"))
	require.Len(t, e.claim("w", 10), 2)
	require.EqualValues(t, 0, e.scalar(`SELECT available FROM key_slots WHERE key = 'stripe:a'`))
	_, err = e.pool.Exec(e.ctx, `UPDATE key_slots SET available = available - 1 WHERE key = 'stripe:a'`)
	requireViolation(t, err, "23514")
	_, err = e.pool.Exec(e.ctx, `UPDATE key_slots SET available = capacity + 1 WHERE key = 'stripe:a'`)
	requireViolation(t, err, "23514")
}

// TestLoweredShardsCreditToTheNewShape lowers a gate's limit and shards
// under executing rows and checks the counters as the rows finish: the
// slots in use always equal the executing rows, no counter frees more than
// the new limit gives its shard, and once every row is gone the counters
// are the new shape exactly (the removed shard deleted), with nothing for
// Reconcile to repair.
func TestLoweredShardsCreditToTheNewShape(t *testing.T) {
	e := newEnv(t)
	_, err := e.s.SyncLimits(e.ctx, []gate.Limit{{Name: "stripe", Limit: 10, Shards: 4}})
	require.NoError(t, err)
	for range 10 {
		e.insert(newInstance("stripe:a"))
	}
	cs := e.claim("w", 10)
	require.Len(t, cs, 10)
	_, err = e.s.SyncLimits(e.ctx, []gate.Limit{{Name: "stripe", Limit: 6, Shards: 3}})
	require.NoError(t, err)

	type counter struct{ shard, capacity, available int }
	counters := func() []counter {
		rows, err := e.pool.Query(e.ctx, `SELECT shard, capacity, available FROM key_slots WHERE key = 'stripe:a' ORDER BY shard`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (counter, error) {
			var c counter
			return c, r.Scan(&c.shard, &c.capacity, &c.available)
		})
		require.NoError(t, err)
		return out
	}
	share := []int{2, 2, 2}
	for i, c := range cs {
		e.complete("w", done(c))
		executing := len(cs) - i - 1
		used, free := 0, 0
		for _, k := range counters() {
			used += k.capacity - k.available
			if k.shard < len(share) {
				require.LessOrEqual(t, k.available, share[k.shard], "shard %d frees more than its share after %d finished", k.shard, i+1)
				free += k.available
			} else {
				require.Zero(t, k.available, "a removed shard never frees a slot")
			}
		}
		require.Equal(t, executing, used, "slots in use after %d finished", i+1)
		require.LessOrEqual(t, free, 6, "free slots after %d finished", i+1)
		info, err := e.s.KeyInfo(e.ctx, "stripe:a")
		require.NoError(t, err)
		require.Equal(t, max(0, 6-executing), info.Available, "what a claim could admit after %d finished", i+1)
	}
	require.Equal(t, []counter{{0, 2, 2}, {1, 2, 2}, {2, 2, 2}}, counters(), "the new shape; shard 3 deleted")
	rep, err := e.s.Reconcile(e.ctx, 0, time.Time{})
	require.NoError(t, err)
	require.Zero(t, rep.Drift)
	require.Zero(t, rep.CountersRepaired)
}

func TestInsertTxCommitAndRollback(t *testing.T) {
	e := newEnv(t)
	_, err := e.pool.Exec(e.ctx, `CREATE TABLE orders (id int PRIMARY KEY)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = e.pool.Exec(context.Background(), `DROP TABLE orders`) })

	// InsertTx refuses a row no registered workflow version could run.
	txInstance := func() store.NewInstance {
		in := newInstance("")
		in.Version = 1
		return in
	}
	kept := txInstance()
	kept.UniqueKey = "order-1"
	err = pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(e.ctx, `INSERT INTO orders VALUES (1)`); err != nil {
			return err
		}
		res, err := e.s.InsertTx(e.ctx, tx, []store.NewInstance{kept})
		require.Equal(t, []store.InsertResult{{ID: kept.ID}}, res)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, store.StatusReady, e.get(kept.ID).Status)

	lost := txInstance()
	boom := errors.New("caller fails after the insert")
	err = pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(e.ctx, `INSERT INTO orders VALUES (2)`); err != nil {
			return err
		}
		if _, err := e.s.InsertTx(e.ctx, tx, []store.NewInstance{lost}); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	_, err = e.s.Get(e.ctx, lost.ID)
	require.ErrorIs(t, err, store.ErrNotFound, "the instance rolls back with the caller's write")
	require.EqualValues(t, 1, e.scalar(`SELECT count(*) FROM orders`))

	// A unique key taken inside the caller's transaction is a duplicate.
	dup := txInstance()
	dup.UniqueKey = "order-1"
	err = pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		res, err := e.s.InsertTx(e.ctx, tx, []store.NewInstance{dup})
		require.Equal(t, []store.InsertResult{{ID: kept.ID, Duplicate: true}}, res)
		return err
	})
	require.NoError(t, err)
}

func TestStateIsStoredAsJSONObject(t *testing.T) {
	e := newEnv(t)
	in := newInstance("")
	in.State = json.RawMessage(`{"a":{"b":[1,2]}}`)
	e.insert(in)
	var typ string
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT jsonb_typeof(state) FROM instances WHERE id = $1`, in.ID).Scan(&typ))
	require.Equal(t, "object", typ)
	in2 := newInstance("")
	in2.State = json.RawMessage(`{bad`)
	_, err := e.s.Insert(e.ctx, []store.NewInstance{in2})
	require.Error(t, err)
}

func TestClosedStore(t *testing.T) {
	e := newEnv(t)
	require.NoError(t, e.s.Close())
	_, err := e.s.Insert(e.ctx, []store.NewInstance{newInstance("")})
	require.ErrorIs(t, err, store.ErrClosed)
	_, err = e.s.Claim(e.ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1})
	require.ErrorIs(t, err, store.ErrClosed)
}

func TestListenNotifiesInsertWithinMilliseconds(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(e.ctx)
	got := make(chan string, 100)
	pings := make(chan struct{}, 100)
	stopped := make(chan error, 1)
	go func() {
		stopped <- e.s.Listen(ctx, func(n store.Notification) {
			q := n.Queue
			if q == "" {
				return // listening
			}
			if q == "ping" { // late answers to the connection pokes below
				pings <- struct{}{}
				return
			}
			got <- q
		})
	}()

	// Wait until the listener is connected: poke the channel until it hears.
	deadline := time.After(10 * time.Second)
	for ready := false; !ready; {
		_, err := e.pool.Exec(e.ctx, `SELECT pg_notify($1, 'ping')`, postgres.Channel(e.schema))
		require.NoError(t, err)
		select {
		case <-pings:
			ready = true
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatal("listener never connected")
		}
	}

	in := newInstance("")
	in.Queue = "mail"
	start := time.Now()
	e.insert(in)
	select {
	case q := <-got:
		require.Equal(t, "mail", q)
		lat := time.Since(start)
		t.Logf("insert to notification: %v", lat)
		require.Less(t, lat, 250*time.Millisecond)
	case <-time.After(5 * time.Second):
		t.Fatal("no notification for an insert")
	}

	// A delayed row does not notify; a signal wake does.
	later := newInstance("")
	later.RunAt = time.Now().Add(time.Hour)
	e.insert(later)
	select {
	case q := <-got:
		t.Fatalf("unexpected notification %q for a delayed row", q)
	case <-time.After(50 * time.Millisecond):
	}

	// A signal that wakes a parked instance notifies its queue (after the
	// signal's commit, from the store's coalescing sender).
	parked := newInstance("")
	parked.Queue = "q"
	e.insert(parked)
	require.Equal(t, "q", <-got) // the insert's
	c := e.claim("w", 1)
	require.Len(t, c, 1)
	e.complete("w", store.Outcome{ID: c[0].ID, Fence: c[0].Fence, Kind: store.OutcomeAwait, Step: "wait", Attempt: 1, AwaitSignal: "go"})
	res, err := e.s.Signal(e.ctx, store.SignalRequest{InstanceID: parked.ID, Name: "go"})
	require.NoError(t, err)
	require.True(t, res.Woke)
	select {
	case q := <-got:
		require.Equal(t, "q", q)
	case <-time.After(5 * time.Second):
		t.Fatal("no notification for a signal that woke an instance")
	}

	// A claim that finds a K = 1 key busy leaves its only row in sight
	// ready (see admission.Decide); the holder's end, promoting nothing,
	// notifies that row's queue.
	woken := e.claim("w", 10) // the parked row the signal woke
	require.Len(t, woken, 1)
	e.complete("w", store.Outcome{ID: woken[0].ID, Fence: woken[0].Fence, Kind: store.OutcomeDone, Step: "wait", Attempt: 1})
	e.insert(newInstance("acct:n"))
	require.Equal(t, "q", <-got)
	holder := e.claim("w", 1)
	require.Len(t, holder, 1)
	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	next := newInstance("acct:n")
	next.Version = 1
	_, err = e.s.InsertTx(e.ctx, tx, []store.NewInstance{next})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(e.ctx))
	require.Equal(t, "q", <-got)
	require.Empty(t, e.claim("w", 10))
	require.Equal(t, store.StatusReady, e.get(next.ID).Status)
	e.complete("w", store.Outcome{ID: holder[0].ID, Fence: holder[0].Fence, Kind: store.OutcomeDone, Step: "start", Attempt: 1})
	select {
	case q := <-got:
		require.Equal(t, "q", q)
	case <-time.After(5 * time.Second):
		t.Fatal("no notification for the ready row of a key that freed")
	}
	require.Equal(t, next.ID, e.claim("w", 10)[0].ID)

	cancel()
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Listen did not return after cancel")
	}
}

// TestListenTakesAnIdleConnectionOfThePool: a first Listen listens on a
// connection the pool had idle (no connect on an engine's start path),
// which leaves the pool for good.
func TestListenTakesAnIdleConnectionOfThePool(t *testing.T) {
	e := newEnv(t)
	idleConns(t, e.ctx, e.pool, 2)
	idle := map[uint32]bool{}
	for _, c := range e.pool.AcquireAllIdle(e.ctx) {
		idle[c.Conn().PgConn().PID()] = true
		c.Release()
	}
	require.NotEmpty(t, idle)
	total := e.pool.Stat().TotalConns()

	pid := listenerPID(t, e)
	require.Equal(t, total-1, e.pool.Stat().TotalConns(), "the pool no longer holds it")
	require.True(t, idle[pid], "the listener's backend %d was not idle in the pool (%v)", pid, idle)
}

// TestListenLeavesThePoolItsLastIdleConnection: with one idle connection in
// the pool, Listen opens its own, so that the transactions that run while
// it connects (an engine's start) do not wait for the pool to open one.
func TestListenLeavesThePoolItsLastIdleConnection(t *testing.T) {
	e := newEnv(t)
	idleConns(t, e.ctx, e.pool, 1)
	idle := e.pool.AcquireAllIdle(e.ctx)
	require.NotEmpty(t, idle)
	for _, c := range idle[1:] { // one idle connection left
		require.NoError(t, c.Hijack().Close(e.ctx))
	}
	lastIdle := idle[0].Conn().PgConn().PID()
	idle[0].Release()

	pid := listenerPID(t, e)
	require.NotEqual(t, lastIdle, pid, "the listener took the pool's last idle connection")
	c, err := e.pool.Acquire(e.ctx)
	require.NoError(t, err)
	defer c.Release()
	require.Equal(t, lastIdle, c.Conn().PgConn().PID(), "the pool still holds its idle connection")
}

// listenerPID starts the store's Listen until the test ends, waits until
// it listens, and returns its backend's pid.
func listenerPID(t *testing.T, e *env) uint32 {
	t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	t.Cleanup(cancel)
	listening := make(chan struct{}, 1)
	go func() {
		_ = e.s.Listen(ctx, func(n store.Notification) {
			if n == (store.Notification{}) {
				listening <- struct{}{}
			}
		})
	}()
	select {
	case <-listening:
	case <-time.After(10 * time.Second):
		t.Fatal("Listen never listened")
	}
	var pid uint32
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT pid::bigint FROM pg_stat_activity
		WHERE query LIKE 'LISTEN %' AND query LIKE '%' || $1 || '%'`, postgres.Channel(e.schema)).Scan(&pid))
	return pid
}

// idleConns leaves the pool holding at least n idle connections, by holding
// n at once.
func idleConns(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n int) {
	t.Helper()
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
}

func TestListenReconnects(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	got := make(chan string, 100)
	go func() {
		_ = e.s.Listen(ctx, func(n store.Notification) {
			if n.Queue != "" {
				got <- n.Queue
			}
		})
	}()
	waitFor := func(payload string) {
		t.Helper()
		deadline := time.After(15 * time.Second)
		for {
			_, err := e.pool.Exec(e.ctx, `SELECT pg_notify($1, $2)`, postgres.Channel(e.schema), payload)
			require.NoError(t, err)
			select {
			case q := <-got:
				if q == payload {
					return
				}
			case <-time.After(50 * time.Millisecond):
			case <-deadline:
				t.Fatalf("no notification %q", payload)
			}
		}
	}
	waitFor("before")
	// Kill the listening backend; Listen must reconnect on its own.
	var killed int
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE query LIKE 'LISTEN %' AND query LIKE '%' || $1 || '%'`, postgres.Channel(e.schema)).Scan(&killed))
	require.Equal(t, 1, killed)
	waitFor("after")
}

func TestUniqueKeyIndexGuardsRetry(t *testing.T) {
	e := newEnv(t)
	a := newInstance("")
	a.UniqueKey = "job"
	e.insert(a)
	c := e.claim("w", 1)[0]
	res := e.complete("w", store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeFailed, Error: "x"})
	require.False(t, res[0].Stale)
	b := newInstance("")
	b.UniqueKey = "job"
	r, err := e.s.Insert(e.ctx, []store.NewInstance{b})
	require.NoError(t, err)
	require.False(t, r[0].Duplicate, "a failed instance no longer holds the default scope")
	// Retrying a would make two live holders of the key.
	err = e.s.Retry(e.ctx, a.ID, time.Time{})
	require.ErrorIs(t, err, store.ErrDuplicate)
	err = e.s.Retry(e.ctx, b.ID, time.Time{})
	require.ErrorIs(t, err, postgres.ErrNotRetryable)
	err = e.s.Retry(e.ctx, uuid.NewString(), time.Time{})
	require.ErrorIs(t, err, store.ErrNotFound)
}

func TestHistoryOffRecordsNothing(t *testing.T) {
	e := newEnv(t, func(o *postgres.Options) { o.History = false })
	id := e.insert(newInstance(""))[0]
	c := e.claim("w", 1)[0]
	o := done(c)
	o.History = &store.HistoryEntry{Step: "start", Outcome: "done"}
	e.complete("w", o)
	h, err := e.s.History(e.ctx, id)
	require.NoError(t, err)
	require.Empty(t, h)
}

func TestKeyBacklogLeavesThePickPath(t *testing.T) {
	e := newEnv(t)
	// 3000 rows of one K=1 key ahead of 100 keyless rows.
	var hot []store.NewInstance
	for i := range 3000 {
		in := newInstance("tenant:hot")
		in.RunAt = time.Now().Add(-time.Hour + time.Duration(i)*time.Millisecond)
		hot = append(hot, in)
	}
	e.insert(hot...)
	var cold []store.NewInstance
	for range 100 {
		cold = append(cold, newInstance(""))
	}
	coldIDs := e.insert(cold...)
	got := map[string]bool{}
	claims := 0
	for len(got) < 101 && claims < 20 {
		for _, c := range e.claim("w", 10) {
			got[c.ID] = true
		}
		claims++
	}
	for _, id := range coldIDs {
		require.True(t, got[id], "keyless row never claimed behind a saturated key")
	}
	t.Logf("%d claims to reach the keyless rows behind 3000 rows of one key", claims)
	require.LessOrEqual(t, claims, 15)
	require.EqualValues(t, 0, e.scalar(`SELECT count(*) FROM instances WHERE key = 'tenant:hot' AND status = 'ready'`),
		"the hot key's backlog is off the pick path")
	require.EqualValues(t, 2999, e.scalar(`SELECT count(*) FROM instances WHERE key = 'tenant:hot' AND status = 'blocked'`))
}

// A claim that fills a key leaves the key's backlog (its ready rows beyond
// the claim's window) ready, so that the rows it admits do not wait for
// those writes; the next claim that finds the key full, admitting none of
// it, blocks the backlog past the key's first admission.ReadyCap ready rows
// (see admission.Plan.Backlog).
func TestFillingClaimLeavesTheBacklogToTheNext(t *testing.T) {
	e := newEnv(t)
	_, err := e.s.SyncLimits(e.ctx, []gate.Limit{{Name: "stripe", Limit: 2}})
	require.NoError(t, err)
	const n = 600
	var ins []store.NewInstance
	for i := range n {
		in := newInstance("stripe:eu")
		in.RunAt = time.Now().Add(-time.Hour + time.Duration(i)*time.Millisecond)
		ins = append(ins, in)
	}
	e.insert(ins...)
	count := func(status string) int64 {
		return e.scalar(`SELECT count(*) FROM instances WHERE key = 'stripe:eu' AND status = $1`, status)
	}
	require.Len(t, e.claim("w", 10), 2)
	window := count("blocked")
	require.Positive(t, window, "the window's refused rows leave the pick path")
	require.EqualValues(t, n-2-window, count("ready"), "the backlog beyond the window stays ready")

	require.Empty(t, e.claim("w", 10))
	require.EqualValues(t, admission.ReadyCap, count("ready"), "the next claim blocks the backlog past the first ReadyCap rows")
	require.EqualValues(t, n-2-admission.ReadyCap, count("blocked"))
}

// A child of an earlier spawn does not count against its parent's later
// join (the parent was canceled and retried meanwhile); a retried child of
// the current spawn counts again.
func TestChildJoinsOnlyItsOwnSpawn(t *testing.T) {
	e := newEnv(t)
	parent := e.insert(newInstance(""))[0]
	spawn := func(n int) []store.Claimed {
		t.Helper()
		c := e.claim("w", 1)[0]
		require.Equal(t, parent, c.ID)
		var kids []store.NewInstance
		for range n {
			k := newInstance("")
			k.Queue = "kids"
			kids = append(kids, k)
		}
		res := e.complete("w", store.Outcome{ID: c.ID, Fence: c.Fence, Kind: store.OutcomeSpawn, Step: "joined", Children: kids})
		require.False(t, res[0].Stale)
		got, err := e.s.Claim(e.ctx, store.ClaimRequest{Queue: "kids", Worker: "w", Limit: n})
		require.NoError(t, err)
		require.Len(t, got.Claimed, n)
		return got.Claimed
	}
	first := spawn(1)[0]
	require.NoError(t, e.s.Cancel(e.ctx, parent, time.Time{}))
	require.NoError(t, e.s.Retry(e.ctx, parent, time.Time{}))
	second := spawn(2)

	e.complete("w", done(first))
	p := e.get(parent)
	require.Equal(t, store.StatusChildren, p.Status, "a child of the earlier spawn ended the later join")
	require.Equal(t, 2, p.PendingChildren)

	// One current child fails and is retried: it counts in the join again.
	e.complete("w", store.Outcome{ID: second[0].ID, Fence: second[0].Fence, Kind: store.OutcomeFailed, Error: "x"})
	require.Equal(t, 1, e.get(parent).PendingChildren)
	require.NoError(t, e.s.Retry(e.ctx, second[0].ID, time.Time{}))
	require.Equal(t, 2, e.get(parent).PendingChildren)
	e.complete("w", done(second[1]))
	require.Equal(t, store.StatusChildren, e.get(parent).Status)
	again, err := e.s.Claim(e.ctx, store.ClaimRequest{Queue: "kids", Worker: "w", Limit: 1})
	require.NoError(t, err)
	require.Len(t, again.Claimed, 1)
	e.complete("w", done(again.Claimed[0]))
	require.Equal(t, store.StatusReady, e.get(parent).Status, "the parent wakes when its last child of this spawn ends")
}

// A batch of many unique keys takes a bounded number of locks: 20,000
// distinct unique keys insert in one call (one lock each would exceed the
// default lock table).
func TestManyUniqueKeysInOneBatch(t *testing.T) {
	e := newEnv(t)
	ins := make([]store.NewInstance, 20_000)
	for i := range ins {
		ins[i] = newInstance("")
		ins[i].UniqueKey = uuid.NewString()
	}
	res, err := e.s.Insert(e.ctx, ins)
	require.NoError(t, err)
	require.Len(t, res, len(ins))
	res, err = e.s.Insert(e.ctx, ins[:10])
	require.NoError(t, err)
	for _, r := range res {
		require.True(t, r.Duplicate)
	}
}

func TestHistoryDefaultsToTheClaimTimes(t *testing.T) {
	e := newEnv(t)
	id := e.insert(newInstance("acct:1"))[0]
	claimAt := time.Now().Add(time.Hour).Truncate(time.Microsecond).UTC()
	res, err := e.s.Claim(e.ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1, Now: claimAt})
	require.NoError(t, err)
	c := res.Claimed[0]
	o := done(c)
	o.History = &store.HistoryEntry{Step: "start", Attempt: 0, Key: "acct:1", Outcome: "done"}
	_, err = e.s.Complete(e.ctx, "w", []store.Outcome{o}, claimAt.Add(time.Second))
	require.NoError(t, err)
	h, err := e.s.History(e.ctx, id)
	require.NoError(t, err)
	require.Len(t, h, 1)
	require.Equal(t, store.HistoryEntry{InstanceID: id, Step: "start", Key: "acct:1", Worker: "w",
		StartedAt: claimAt, FinishedAt: claimAt.Add(time.Second), Outcome: "done"},
		store.HistoryEntry{InstanceID: h[0].InstanceID, Step: h[0].Step, Key: h[0].Key, Worker: h[0].Worker,
			StartedAt: h[0].StartedAt.UTC(), FinishedAt: h[0].FinishedAt.UTC(), Outcome: h[0].Outcome})
}
