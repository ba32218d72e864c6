package postgres

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"

	"github.com/godurable/godurable/store"
)

// Listen calls fn with a queue name whenever work may have become ready
// there: an insert of due rows, a signal that woke an instance, a promoted
// blocked row, a fired timer, a woken parent, released or reaped claims; and
// with an instance id when the cancel of an executing instance was
// requested. It blocks until ctx is done and then returns nil.
//
// Listen holds its own connection: it takes an idle one out of the pool
// for good when the pool has two or more (see takeIdleConn), and
// otherwise, and on every reconnect, makes one from the pool's
// configuration, the first time only once the store's first claim
// returned (see listenConn). An engine's Start no longer waits for Listen,
// but a new connection made while the first claims run still slowed them
// on two cores: with it, the peers' keyed scenario (5,000 rows) reached
// its first step 28-46 ms after Start, against 17-27 ms with an idle one
// taken (five interleaved pairs). When the connection fails it
// reconnects with exponential backoff; notifications sent while it is down
// are lost, which engines tolerate because they also poll. With
// Options.PollOnly it listens to nothing and returns once ctx is done.
func (s *Store) Listen(ctx context.Context, fn func(store.Notification)) error {
	if err := s.check(); err != nil {
		return err
	}
	if s.pollOnly { // see Options.PollOnly
		<-ctx.Done()
		return nil
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 50 * time.Millisecond
	bo.MaxInterval = 5 * time.Second
	bo.MaxElapsedTime = 0
	for first := true; ; first = false {
		err := s.listenOnce(ctx, fn, bo.Reset, first)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errStoreClosed) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(bo.NextBackOff()):
		}
	}
}

var errStoreClosed = errors.New("store closed")

// listenOnce listens on one connection (see listenConn) until it fails or
// ctx is done. connected is called once LISTEN succeeded.
func (s *Store) listenOnce(ctx context.Context, fn func(store.Notification), connected func(), idle bool) error {
	conn, err := s.listenConn(ctx, idle)
	if err != nil {
		return err
	}
	defer closeConn(ctx, conn)
	connected()
	fn(store.Notification{}) // listening from now on
	for {
		if s.closed.Load() {
			return errStoreClosed
		}
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Channel == s.cancelChannel {
			fn(store.Notification{Canceled: n.Payload})
		} else {
			fn(store.Notification{Queue: n.Payload})
		}
	}
}

// listenConn returns a connection that listens on the store's channels:
// with idle set, an idle one of the pool's when there is one and it can
// LISTEN (one may be dead: the server restarted since the pool used it,
// and the pool pings only what it hands out), and otherwise a new one.
//
// With idle set and no idle connection to spare, it first waits for the
// store's first claim to return, for listenWait at most, and looks again:
// a new backend's start (a process forked, its caches filled) ran beside
// an engine's first claim, on two cores, and slowed it. In the peers' gate
// of 5 with 50 ms steps, whose pool holds one connection at Start, the
// first step came 28.5-34.1 ms after Start (median 30.4) with the wait,
// against 37.0-46.4 (median 39.3) without it (six interleaved runs each,
// load 1.0 falling to 0.3). Nothing is lost meanwhile: an engine claims at
// Start anyway, and again once Listen listens (see Scheduler.Listen).
func (s *Store) listenConn(ctx context.Context, idle bool) (*pgx.Conn, error) {
	if idle {
		conn := s.takeIdleConn(ctx)
		if conn == nil {
			t := time.NewTimer(s.listenWait)
			select {
			case <-s.claimed.done:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			conn = s.takeIdleConn(ctx)
		}
		if conn != nil {
			if err := s.listenOn(ctx, conn); err == nil {
				return conn, nil
			}
			closeConn(ctx, conn)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, err
	}
	if err := s.listenOn(ctx, conn); err != nil {
		closeConn(ctx, conn)
		return nil, err
	}
	return conn, nil
}

// listenWait bounds how long a first listen with no idle connection to
// spare waits for the store's first claim (see listenConn): a store that
// claims nothing (an inserter's) listens after it.
const listenWait = 250 * time.Millisecond

// event is closed once, when what it stands for first happened.
type event struct {
	once sync.Once
	done chan struct{}
}

func newEvent() *event { return &event{done: make(chan struct{})} }

// fire closes e.done, the first time only.
func (e *event) fire() { e.once.Do(func() { close(e.done) }) }

func (s *Store) listenOn(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()+"; LISTEN "+pgx.Identifier{s.cancelChannel}.Sanitize())
	return err
}

// closeConn closes a connection of Listen's, within a second, even when
// ctx is done.
func closeConn(ctx context.Context, conn *pgx.Conn) {
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = conn.Close(closeCtx)
}

// takeIdleConn takes one idle connection out of the pool for good (the
// pool opens another when it needs one), or returns nil when fewer than two
// are idle: an engine's start transactions run while it listens, and when
// Listen took the pool's only idle connection they waited for a new one
// (the peers' gate of 5 with 50 ms steps: its limit sync began about 20 ms
// after the LISTEN). It never waits for a busy one.
func (s *Store) takeIdleConn(ctx context.Context) *pgx.Conn {
	idle := s.pool.AcquireAllIdle(ctx)
	if len(idle) < 2 {
		for _, c := range idle {
			c.Release()
		}
		return nil
	}
	for _, c := range idle[1:] {
		c.Release()
	}
	return idle[0].Hijack()
}

// wakeSender sends the notifications of wake-ups that were committed
// without one, coalesced: at most one NOTIFY statement of the store is in
// flight, and the queues woken meanwhile go out together in the next. A
// transaction that notifies takes PostgreSQL's notification lock from its
// pre-commit to the end of its commit, WAL flush included, so concurrent
// notifying transactions commit one at a time (scenario 7 of make bench, 16
// clients signalling: 77% of the busy backends' time waiting for it). A
// NOTIFY on its own writes no WAL and holds the lock for microseconds.
type wakeSender struct {
	mu      sync.Mutex
	pending map[string]bool
	sending bool
}

// wakeAfterCommit notifies queues, whose wake-ups the caller has committed,
// from a goroutine of the store's. A notification that fails is dropped:
// engines also poll.
func (s *Store) wakeAfterCommit(queues []string) {
	if len(queues) == 0 {
		return
	}
	w := &s.wakes
	w.mu.Lock()
	if w.pending == nil {
		w.pending = map[string]bool{}
	}
	for _, q := range queues {
		w.pending[q] = true
	}
	if w.sending {
		w.mu.Unlock()
		return
	}
	w.sending = true
	w.mu.Unlock()
	go s.sendWakes()
}

func (s *Store) sendWakes() {
	w := &s.wakes
	for {
		w.mu.Lock()
		if len(w.pending) == 0 || s.closed.Load() {
			clear(w.pending)
			w.sending = false
			w.mu.Unlock()
			return
		}
		queues := mapKeys(w.pending)
		clear(w.pending)
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = s.pool.Exec(ctx, s.q(sqlNotifyQueues), queues, s.channel)
		cancel()
	}
}
