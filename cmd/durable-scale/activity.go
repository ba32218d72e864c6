package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// activityEvery is how often the activity sampler reads pg_stat_activity.
const activityEvery = 250 * time.Millisecond

// activity samples what the server's backends are doing, so that a second
// in which the fleet starts few steps (a stall) can be matched with what
// every backend was waiting for then: each sample is written to
// activity.tsv in the log directory (the time, the backends running a
// statement, autovacuum's included, each wait event with how many wait on
// it, and the longest running statement of a client), and kept in memory for the stall report (see
// stalls).
type activity struct {
	mu      sync.Mutex
	samples []activitySample
}

type activitySample struct {
	at      time.Time
	active  int
	waits   map[string]int // "type:event" (or "CPU" when running) → backends
	longest time.Duration
	query   string
}

// run samples until ctx ends.
func (a *activity) run(ctx context.Context, pool *pgxpool.Pool, dir string) {
	f, err := os.Create(filepath.Join(dir, "activity.tsv"))
	if err != nil {
		return
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	defer w.Flush()
	fmt.Fprintln(w, "time\tactive\twaits\tlongest_ms\tlongest_statement")
	tick := time.NewTicker(activityEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rows, err := pool.Query(ctx, `
SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'),
       CASE WHEN backend_type = 'client backend' THEN extract(epoch FROM clock_timestamp() - query_start) * 1e6 ELSE 0 END,
       left(query, 200)
FROM pg_stat_activity
WHERE state = 'active' AND pid <> pg_backend_pid() AND backend_type IN ('client backend', 'autovacuum worker')`)
		if err != nil {
			continue
		}
		s := activitySample{at: time.Now(), waits: map[string]int{}}
		for rows.Next() {
			var ev, q string
			var us float64
			if rows.Scan(&ev, &us, &q) != nil {
				continue
			}
			s.active++
			s.waits[ev]++
			if d := time.Duration(us) * time.Microsecond; d > s.longest {
				s.longest, s.query = d, q
			}
		}
		rows.Close()
		a.mu.Lock()
		a.samples = append(a.samples, s)
		a.mu.Unlock()
		fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\n", s.at.UTC().Format("15:04:05.000"), s.active, formatWaits(s.waits),
			s.longest.Milliseconds(), strings.Join(strings.Fields(s.query), " "))
	}
}

func formatWaits(m map[string]int) string {
	keys := byCount(m)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// byCount returns m's keys, the largest value first (ties by key).
func byCount[V int | float64](m map[string]V) []string {
	keys := slices.Sorted(maps.Keys(m))
	slices.SortStableFunc(keys, func(a, b string) int { return cmp.Compare(m[b], m[a]) })
	return keys
}

// within sums the samples taken in [from, to): the mean backends on each
// wait event, and the longest statement seen.
func (a *activity) within(from, to time.Time) (n int, waits map[string]float64, longest time.Duration, query string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	waits = map[string]float64{}
	for _, s := range a.samples {
		if s.at.Before(from) || !s.at.Before(to) {
			continue
		}
		n++
		for k, v := range s.waits {
			waits[k] += float64(v)
		}
		if s.longest > longest {
			longest, query = s.longest, s.query
		}
	}
	for k := range waits {
		waits[k] /= float64(max(n, 1))
	}
	return n, waits, longest, query
}

// stalls prints the seconds of the load in which the fleet started the
// fewest steps (at most 10, each under half the run's median), with what
// the activity sampler saw in them: a stall of the whole fleet shows
// there, and so does what every backend was waiting for.
func (r *reporter) stalls(ctx context.Context, a *activity, from, to time.Time) {
	rows, err := r.pool.Query(ctx, fmt.Sprintf(`
SELECT date_trunc('second', started_at), count(*) FROM %s.instances
WHERE status = 'done' AND updated_at >= $1 AND started_at >= $1 AND started_at < $2 GROUP BY 1`, r.schema), from, to)
	if err != nil {
		fmt.Println("stalls:", err)
		return
	}
	starts := map[int64]int64{}
	for rows.Next() {
		var at time.Time
		var n int64
		if err := rows.Scan(&at, &n); err != nil {
			rows.Close()
			fmt.Println("stalls:", err)
			return
		}
		starts[at.Unix()] = n
	}
	rows.Close()
	type second struct {
		at time.Time
		n  int64
	}
	var secs []second
	for t := from.Truncate(time.Second).Add(time.Second); t.Add(time.Second).Before(to); t = t.Add(time.Second) {
		secs = append(secs, second{t, starts[t.Unix()]})
	}
	if len(secs) == 0 {
		return
	}
	sorted := make([]int64, len(secs))
	for i, s := range secs {
		sorted[i] = s.n
	}
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	median := sorted[len(sorted)/2]
	var low []second
	for _, s := range secs {
		if s.n < median/2 {
			low = append(low, s)
		}
	}
	fmt.Printf("seconds of the load with fewer than half the median step starts (%d/s): %d of %d\n", median, len(low), len(secs))
	_, base, _, _ := a.within(from, to)
	fmt.Printf("  whole run, mean backends per wait: %s\n", formatMeans(base))
	sort.Slice(low, func(i, j int) bool { return low[i].n < low[j].n })
	for _, s := range low[:min(len(low), 10)] {
		n, waits, longest, q := a.within(s.at, s.at.Add(time.Second))
		fmt.Printf("  %s  %d starts  %d samples  %s  longest %v: %s\n", s.at.UTC().Format("15:04:05"), s.n, n, formatMeans(waits),
			longest.Round(time.Millisecond), truncate(strings.Join(strings.Fields(q), " "), 120))
	}
}

func formatMeans(m map[string]float64) string {
	keys := byCount(m)
	parts := make([]string, 0, len(keys))
	for _, k := range keys[:min(len(keys), 6)] {
		parts = append(parts, fmt.Sprintf("%s %.1f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
