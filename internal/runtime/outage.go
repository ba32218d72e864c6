// Store outages: one log line per outage and per recovery, and the
// backoff of the loops that hit it.

package runtime

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// storeOutage is the engine's view of whether its store is reachable,
// shared by every loop (claims, flushes, heartbeats, sweeps): the first
// failure of an outage is logged once, at error level, and the recovery once,
// at info level, with how long the outage lasted and how many calls failed
// meanwhile. A store that stays down for an hour logs two lines, not one per
// attempt. The recovery is declared at the first success that comes
// outageSettle after the last failure, so that a pool still handing out a
// few dead connections after a database restart does not log a second
// outage. Each loop retries on its own backoff (see retrier).
type storeOutage struct {
	log    *slog.Logger
	isDown atomic.Bool // fast path for ok()

	mu       sync.Mutex
	since    time.Time
	lastFail time.Time
	failed   int
}

// outageSettle is how long the store must answer without a failure before
// an outage is declared over.
const outageSettle = time.Second

// fail records a failed store call of loop. A conflict between
// transactions (SQL class 40: a deadlock or serialization failure) is not an
// outage: it is logged as a warning, and the call is retried all the same.
func (o *storeOutage) fail(loop string, err error) {
	var se interface{ SQLState() string }
	if errors.As(err, &se) && strings.HasPrefix(se.SQLState(), "40") {
		o.log.Warn("store conflict; retrying", "loop", loop, "err", err)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failed++
	o.lastFail = time.Now()
	if o.isDown.Load() {
		return
	}
	o.isDown.Store(true)
	o.since = o.lastFail
	o.log.Error("store unavailable; retrying with backoff until it is back", "loop", loop, "err", err)
}

// ok records a successful store call.
func (o *storeOutage) ok() {
	if !o.isDown.Load() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.isDown.Load() || time.Since(o.lastFail) < outageSettle {
		return
	}
	o.isDown.Store(false)
	o.log.Info("store available again", "down_for", o.lastFail.Sub(o.since).Round(time.Millisecond).String(), "failed_calls", o.failed)
	o.failed = 0
}

// retrier is one loop's exponential backoff (cenkalti/backoff) over the
// engine's shared outage state.
type retrier struct {
	o    *storeOutage
	loop string
	b    *backoff.ExponentialBackOff
}

func newRetrier(o *storeOutage, loop string) *retrier {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 50*time.Millisecond, 5*time.Second, 0
	return &retrier{o: o, loop: loop, b: b}
}

// fail records an error and returns how long to wait before trying again.
func (r *retrier) fail(err error) time.Duration {
	r.o.fail(r.loop, err)
	return r.b.NextBackOff()
}

func (r *retrier) ok() {
	r.o.ok()
	r.b.Reset()
}
