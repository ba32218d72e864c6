package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// probeBefore and probeAfter bound the counter probes around the limit
	// change (see counterProbe).
	probeBefore = 5 * time.Second
	probeAfter  = 10 * time.Second
	probeEvery  = 10 * time.Millisecond
	probeKeys   = 5
)

// counterProbe measures the wait a gate step's claim or credit has for its
// key's counters around a limit change. SyncKeyLimits reshapes the counters
// of the changed name's keys a chunk of keys to a transaction, each chunk
// locking the counters no one else holds (key_slots rows, FOR UPDATE SKIP
// LOCKED) and holding them until it commits, a few statements later:
// a claim skips locked counters (its rows wait for a later claim), an
// optimistic claim waits for them up to 50 ms, a credit (a step's end)
// waits. The other locks the change holds, its advisory lock and the
// limits row, are taken by no claim and no credit (they read limits
// without a lock), so the counters are what to probe. The probe sees the
// claims' and credits' own holds too; holdTracer times the change's alone.
//
// Every probeEvery, one of the first probeKeys keys of the gate "api" in
// key order that have counters (in turn) is locked FOR SHARE, which waits
// for any transaction writing its counters and holds them for as long as
// one statement takes (a claim meanwhile skips them, a credit waits that
// long); the wait is the server's (clock_timestamp once locked, against the
// statement's start), so that it leaves out the round trip and this
// process's scheduling. Keys without counters (the reconciler deletes an
// idle key's) are nothing the change locks, hence "the first that have".
type counterProbe struct {
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	samples []probeSample
	errs    int
	lastErr error
}

type probeSample struct {
	at    time.Time // the probe's start
	wait  time.Duration
	found bool // the probe found counters to lock
}

// startCounterProbe probes until stopped (see counterProbe).
func startCounterProbe(ctx context.Context, pool *pgxpool.Pool, schema string) *counterProbe {
	q := fmt.Sprintf(`
SELECT coalesce(max(extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1e6), -1)::bigint
FROM (SELECT 1 FROM %[1]s.key_slots
      WHERE key = (SELECT DISTINCT key FROM %[1]s.key_slots WHERE split_part(key, ':', 1) = 'api'
                   ORDER BY key OFFSET $1 LIMIT 1)
      FOR SHARE) s`, schema)
	p := &counterProbe{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(probeEvery)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-p.stop:
				return
			case <-tick.C:
			}
			at := time.Now()
			var us int64
			err := pool.QueryRow(ctx, q, i%probeKeys).Scan(&us)
			p.mu.Lock()
			if err != nil {
				p.errs, p.lastErr = p.errs+1, err
				p.mu.Unlock()
				continue
			}
			p.samples = append(p.samples, probeSample{at: at, wait: time.Duration(max(us, 0)) * time.Microsecond, found: us >= 0})
			p.mu.Unlock()
		}
	}()
	return p
}

// result stops the probe and describes it: the longest wait of the probes
// started before t and of those from t on.
func (p *counterProbe) result(t time.Time) string {
	close(p.stop)
	<-p.done
	var before, from time.Duration
	var nBefore, nFrom, none int
	for _, s := range p.samples {
		switch {
		case !s.found:
			none++
		case s.at.Before(t):
			before, nBefore = max(before, s.wait), nBefore+1
		default:
			from, nFrom = max(from, s.wait), nFrom+1
		}
	}
	return fmt.Sprintf("longest wait for a gate key's counters: %v before, %v from the change (probes %d before, %d from it, every %v, %d finding no counters, %d failed: %v)",
		before.Round(10*time.Microsecond), from.Round(10*time.Microsecond), nBefore, nFrom, probeEvery, none, p.errs, p.lastErr)
}
