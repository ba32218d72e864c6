package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// stmtTracer counts round trips and statements and sums the time each
// statement took, as seen by the client. It is a pgx QueryTracer and
// BatchTracer: a query outside a batch is one round trip, a batch (all its
// statements pipelined) is one round trip.
type stmtTracer struct {
	names      sync.Map // sql -> name
	mu         sync.Mutex
	roundTrips int64
	stats      map[string]*stmtStat
}

type stmtStat struct {
	name  string
	n     int64
	total time.Duration
}

type traceStartKey struct{}

func newStmtTracer() *stmtTracer { return &stmtTracer{stats: map[string]*stmtStat{}} }

func (t *stmtTracer) record(sql string, d time.Duration) {
	var name string
	if v, ok := t.names.Load(sql); ok {
		name = v.(string)
	} else {
		name = stmtName(sql)
		t.names.Store(sql, name)
	}
	t.mu.Lock()
	s := t.stats[name]
	if s == nil {
		s = &stmtStat{name: name}
		t.stats[name] = s
	}
	s.n++
	s.total += d
	t.mu.Unlock()
}

// TraceQueryStart implements pgx.QueryTracer.
func (t *stmtTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceStartKey{}, traceStart{sql: data.SQL, at: time.Now()})
}

type traceStart struct {
	sql string
	at  time.Time
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *stmtTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	st, ok := ctx.Value(traceStartKey{}).(traceStart)
	if !ok {
		return
	}
	t.mu.Lock()
	t.roundTrips++
	t.mu.Unlock()
	t.record(st.sql, time.Since(st.at))
}

// TraceBatchStart implements pgx.BatchTracer.
func (t *stmtTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.mu.Lock()
	t.roundTrips++
	t.mu.Unlock()
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (t *stmtTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	d := time.Duration(0)
	if !data.ReadStartTime.IsZero() {
		d = time.Since(data.ReadStartTime)
	}
	t.record(data.SQL, d)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (t *stmtTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// reset clears the counters.
func (t *stmtTracer) reset() {
	t.mu.Lock()
	t.roundTrips = 0
	t.stats = map[string]*stmtStat{}
	t.mu.Unlock()
}

// snapshot returns the round trips and the statements, most time first.
func (t *stmtTracer) snapshot() (int64, []stmtStat) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]stmtStat, 0, len(t.stats))
	for _, s := range t.stats {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].total > out[j].total })
	return t.roundTrips, out
}

// report prints the statements of a scenario, per step.
func (t *stmtTracer) report(w io.Writer, steps int64) {
	rt, stats := t.snapshot()
	if steps <= 0 {
		steps = 1
	}
	var n int64
	for _, s := range stats {
		n += s.n
	}
	fmt.Fprintf(w, "    round trips/step %.3f, statements/step %.3f\n", float64(rt)/float64(steps), float64(n)/float64(steps))
	for i, s := range stats {
		if i == 12 {
			break
		}
		fmt.Fprintf(w, "    %8d × %-58s total %8.1f ms  mean %7.3f ms\n", s.n, s.name,
			float64(s.total)/1e6, float64(s.total)/1e6/float64(max(s.n, 1)))
	}
}

// stmtName is a short, stable name for a statement: its first data-changing
// or reading clause after any WITH prelude, without the schema, and a hash of
// the whole text so that statements with the same start stay apart.
func stmtName(sql string) string {
	s := strings.Join(strings.Fields(sql), " ")
	s = schemaRE.ReplaceAllString(s, "")
	h := fnv.New32a()
	h.Write([]byte(s))
	start := 0
	if strings.HasPrefix(s, "WITH ") {
		best := -1
		for _, kw := range []string{"UPDATE ", "INSERT INTO ", "DELETE FROM "} {
			if i := strings.Index(s, kw); i >= 0 && (best < 0 || i < best) {
				best = i
			}
		}
		if best >= 0 {
			start = best
		}
	}
	s = s[start:]
	if len(s) > 48 {
		s = s[:48]
	}
	return fmt.Sprintf("%s #%04x", s, h.Sum32()&0xffff)
}

var schemaRE = regexp.MustCompile(`"bench_[a-z0-9_]+"\.`)
