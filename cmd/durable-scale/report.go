package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// reporter samples the server while the load runs and prints a line per
// interval.
type reporter struct {
	pool       *pgxpool.Pool
	schema     string
	f          *fleet
	statements bool
	backlogged int  // keys acct:0 … acct:backlogged-1 start with a backlog
	sustained  bool // and keep it (see topUp)
	start      time.Time

	mu        sync.Mutex
	maxLocks  int           // most locks one transaction held, this interval
	maxWait   time.Duration // longest lock wait seen, this interval
	allLocks  int
	allWait   time.Duration
	notes     []string
	intervals []interval
}

// interval is one report line.
type interval struct {
	at       time.Duration // since the start of the load
	done     int64
	inserted int64   // the offered load's rows
	topped   int64   // the backlog's top-up rows (see topUp)
	p50, p99 float64 // insert→start, ms, of the rows created during the load that ended in it
	p99Fresh float64 // the same p99 without the rows of the backlogged keys
	// The same p99 by class: keyless rows, rows of the K = 1 keys without
	// a backlog, rows of the gate's keys, rows of several keys (-several).
	p99Plain, p99Acct, p99Gate, p99Several float64
	total, heap, ix                        int64 // instances: bytes
	dead, live                             int64
	autovacuums                            int64
	locks                                  int
	wait                                   time.Duration
	errors                                 int
}

func newReporter(pool *pgxpool.Pool, schema string, f *fleet, statements bool, backlogged int, sustained bool) *reporter {
	return &reporter{pool: pool, schema: schema, f: f, statements: statements, backlogged: backlogged, sustained: sustained, start: time.Now()}
}

func (r *reporter) note(s string) {
	r.mu.Lock()
	r.notes = append(r.notes, fmt.Sprintf("+%v %s", time.Since(r.start).Round(time.Second), s))
	r.mu.Unlock()
}

// sample reads pg_locks twice a second: the most locks one transaction
// holds, and the longest wait for a lock so far (from when the waiter
// started waiting, not when its statement started).
func (r *reporter) sample(ctx context.Context) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var locks int
		var waitUs int64
		err := r.pool.QueryRow(ctx, `
SELECT coalesce((SELECT max(c) FROM (SELECT count(*) c FROM pg_locks
                                     WHERE pid <> pg_backend_pid() GROUP BY virtualtransaction) x), 0),
       coalesce((SELECT max(extract(epoch FROM clock_timestamp() - waitstart) * 1e6)::bigint FROM pg_locks
                 WHERE NOT granted AND pid <> pg_backend_pid()), 0)`).Scan(&locks, &waitUs)
		if err != nil {
			continue
		}
		r.mu.Lock()
		r.maxLocks = max(r.maxLocks, locks)
		r.maxWait = max(r.maxWait, time.Duration(waitUs)*time.Microsecond)
		r.mu.Unlock()
	}
}

func (r *reporter) loop(ctx context.Context, every time.Duration, inserted, topped *atomic.Int64) {
	fmt.Println("  min   done/s  ins/s  backlog ins/s  p50 ms  p99 ms  p99 fresh ms (plain/K=1/gate/several)  instances MB (heap+idx)  dead tuples  autovac  max locks/tx  longest lock wait  errors")
	tick := time.NewTicker(every)
	defer tick.Stop()
	last := time.Now()
	var lastIns, lastTop int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		iv := interval{at: now.Sub(r.start)}
		q := fmt.Sprintf(`
SELECT count(*),
       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000)
                FILTER (WHERE created_at >= $3), 0),
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000)
                FILTER (WHERE created_at >= $3), 0),
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000)
                FILTER (WHERE created_at >= $3 AND NOT coalesce(key_name = 'acct' AND split_part(key, ':', 2)::int < $4, false)), 0),
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000)
                FILTER (WHERE created_at >= $3 AND key IS NULL), 0),
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000)
                FILTER (WHERE created_at >= $3 AND key_name = 'acct' AND split_part(key, ':', 2)::int >= $4 AND extra_keys IS NULL), 0),
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000)
                FILTER (WHERE created_at >= $3 AND key_name = 'api' AND extra_keys IS NULL), 0),
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at) * 1000)
                FILTER (WHERE created_at >= $3 AND extra_keys IS NOT NULL), 0)
FROM %s.instances WHERE status = 'done' AND updated_at >= $1 AND updated_at < $2`, r.schema)
		if err := r.pool.QueryRow(context.Background(), q, last, now, r.start, r.backlogged).Scan(&iv.done, &iv.p50, &iv.p99, &iv.p99Fresh, &iv.p99Plain, &iv.p99Acct, &iv.p99Gate, &iv.p99Several); err != nil {
			r.f.errorf("report: %v", err)
		}
		rel := r.schema + ".instances"
		if err := r.pool.QueryRow(context.Background(), `
SELECT pg_total_relation_size($1::regclass), pg_relation_size($1::regclass), pg_indexes_size($1::regclass),
       coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0), coalesce(s.autovacuum_count, 0)
FROM pg_stat_user_tables s WHERE s.relid = $1::regclass`, rel).Scan(&iv.total, &iv.heap, &iv.ix, &iv.dead, &iv.live, &iv.autovacuums); err != nil {
			r.f.errorf("report: %v", err)
		}
		ins := inserted.Load()
		iv.inserted = ins - lastIns
		lastIns = ins
		top := topped.Load()
		iv.topped = top - lastTop
		lastTop = top
		errs := r.f.takeErrors()
		iv.errors = len(errs)
		r.mu.Lock()
		iv.locks, iv.wait = r.maxLocks, r.maxWait
		r.allLocks, r.allWait = max(r.allLocks, r.maxLocks), max(r.allWait, r.maxWait)
		r.maxLocks, r.maxWait = 0, 0
		notes := r.notes
		r.notes = nil
		r.intervals = append(r.intervals, iv)
		r.mu.Unlock()
		secs := now.Sub(last).Seconds()
		fmt.Printf("%5.1f  %7.0f  %5.0f  %13.0f  %6.1f  %6.1f  %12.1f (%.0f/%.0f/%.0f/%.0f)  %6d (%d+%d)  %11d  %7d  %12d  %17v  %6d\n",
			iv.at.Minutes(), float64(iv.done)/secs, float64(iv.inserted)/secs, float64(iv.topped)/secs, iv.p50, iv.p99, iv.p99Fresh,
			iv.p99Plain, iv.p99Acct, iv.p99Gate, iv.p99Several,
			iv.total>>20, iv.heap>>20, iv.ix>>20, iv.dead, iv.autovacuums, iv.locks, iv.wait.Round(time.Millisecond), iv.errors)
		for _, n := range notes {
			fmt.Println("      " + n)
		}
		for i, e := range errs {
			if i == 5 {
				fmt.Printf("      ... and %d more\n", len(errs)-5)
				break
			}
			fmt.Println("      " + truncate(e, 300))
		}
		last = now
	}
}

// summary prints the targets' figures and the slowest statements.
func (r *reporter) summary(ctx context.Context) {
	r.mu.Lock()
	ivs := r.intervals
	r.mu.Unlock()
	fmt.Println()
	fmt.Printf("whole run: most locks held by one transaction %d, longest lock wait %v\n", r.allLocks, r.allWait.Round(time.Millisecond))
	r.f.mu.Lock()
	fmt.Printf("errors and warnings logged: %d (out of shared memory %d, too many connections %d, deadlock detected %d)\n",
		r.f.counts["all"], r.f.counts["out of shared memory"], r.f.counts["too many connections"], r.f.counts["deadlock detected"])
	r.f.mu.Unlock()
	if n := len(ivs); n >= 10 {
		early, late := ivs[4:min(10, n-5)], ivs[n-5:]
		ratio := func(f func(interval) float64) float64 { return mean(late, f) / mean(early, f) }
		fmt.Printf("last 5 intervals against intervals 5–10: throughput %.2f×, p99 %.2f×, p99 without the backlogged keys %.2f×\n",
			ratio(func(i interval) float64 { return float64(i.done) }),
			ratio(func(i interval) float64 { return i.p99 }),
			ratio(func(i interval) float64 { return i.p99Fresh }))
		if r.sustained || r.backlogged == 0 {
			fmt.Println("  (the target, throughput ≥ 0.95× and p99 ≤ 1.2×, reads throughput and p99 without the backlogged keys)")
		} else {
			fmt.Println("  (-sustain=false: where the backlog drains between the two windows, they hold different work and compare no slowdown)")
		}
		mid := ivs[n/2-1]
		fmt.Printf("instances + indexes over the second half: %d MB → %d MB (%+.1f%%)\n", mid.total>>20, ivs[n-1].total>>20,
			100*float64(ivs[n-1].total-mid.total)/float64(mid.total))
	} else {
		fmt.Println("fewer than 10 intervals: no steady-state comparison")
	}
	if !r.statements {
		return
	}
	rows, err := r.pool.Query(ctx, `
SELECT calls, mean_exec_time, max_exec_time, query FROM pg_stat_statements
WHERE query LIKE '%' || $1 || '%' AND query NOT LIKE '%percentile_cont%' AND query NOT LIKE '%pg_stat_user_tables%'
ORDER BY max_exec_time DESC LIMIT 15`, r.schema)
	if err != nil {
		fmt.Println("pg_stat_statements:", err)
		return
	}
	defer rows.Close()
	fmt.Println("slowest statements (by max time): calls, mean ms, max ms, statement")
	for rows.Next() {
		var calls int64
		var meanMs, maxMs float64
		var q string
		if err := rows.Scan(&calls, &meanMs, &maxMs, &q); err != nil {
			fmt.Println("pg_stat_statements:", err)
			return
		}
		q = strings.NewReplacer(`"`+r.schema+`".`, "", r.schema+".", "").Replace(q)
		q = strings.Join(strings.Fields(q), " ")
		fmt.Printf("  %9d  %8.2f  %8.1f  %s\n", calls, meanMs, maxMs, truncate(q, 140))
	}
}

// gatePauseWindow is how long before and after the limit change the gate's
// step starts are compared (see gatePause).
const gatePauseWindow = 15 * time.Second

// gatePause returns the longest time between two consecutive starts of
// steps of the gate's keys, among the rows done that started in [from, to):
// with a few hundred gate steps a second, a pause of every gate key (its
// counters locked) shows as a gap, read from the rows, outside the engines.
func (r *reporter) gatePause(ctx context.Context, from, to time.Time) (time.Duration, error) {
	var us int64
	err := r.pool.QueryRow(ctx, fmt.Sprintf(`
SELECT coalesce(max(extract(epoch FROM gap) * 1e6), 0)::bigint FROM (
    SELECT started_at - lag(started_at) OVER (ORDER BY started_at) AS gap FROM %s.instances
    WHERE status = 'done' AND updated_at >= $1 AND key_name = 'api' AND started_at >= $1 AND started_at < $2) g`, r.schema),
		from, to).Scan(&us)
	return time.Duration(us) * time.Microsecond, err
}

func mean(ivs []interval, f func(interval) float64) float64 {
	if len(ivs) == 0 {
		return 0
	}
	s := 0.0
	for _, i := range ivs {
		s += f(i)
	}
	return s / float64(len(ivs))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
