package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/jackc/pgx/v5"
)

type scenario struct {
	name string
	run  func(ctx context.Context, b *bench) (*result, error)
}

var allScenarios = []scenario{
	{"plain no-key 1-step", scenarioPlain},
	{"K=1, 500 keys, 1 ms steps", scenarioK1},
	{"gate limit 10, one key, 1 ms", scenarioGate10},
	{"gate limit 1000/10 shards, 1 ms", scenarioGate1000},
	{"no-key work behind a K=1 backlog", scenarioBacklog},
	{"pick cost, small vs large ready set", scenarioPick},
	{"3 steps, await + signal between", scenarioThree},
	{"batch insert", scenarioInsert},
	{"idle insert→start latency", scenarioIdle},
	{"fleet sharing one gate (utilisation)", scenarioFleet},
	{"several keys: K=1 of 500 + gate 10 of 20", scenarioSeveralKeys},
}

// scaled is n × -n, at least min.
func (b *bench) scaled(n, least int) int { return max(least, int(float64(n)*b.o.scale)) }

// workload is what a burn-down or continuous run inserts and counts.
type workload struct {
	name   string
	limits []gate.Limit
	keys   int // keys the concurrency recorder tracks
	k      int // K every tracked key must respect (0: no check)
	// n counted instances made by gen, and a backlog of backlogN (not
	// counted) made by backlogGen; made in chunks as they are inserted, so
	// that the harness holds none of them while the engines run.
	n          int
	gen        func(i int) durable.InsertRequest
	backlogN   int
	backlogGen func(i int) durable.InsertRequest
	workflow   string // the counted rows' workflow
	stepsPer   int
	// backlogAfter inserts the backlog after the counted rows (scenario 6).
	backlogAfter bool
	// keyK is, for rows of several keys (state.M), K per key name: the
	// recorder counts their steps under every key they hold, and each key
	// of a name must respect its K.
	keyK map[string]int
}

// plainReq is counted instance i (-1: not counted) of the no-key one-step workflow.
func plainReq(i int) durable.InsertRequest {
	return req("noop", state{I: i, K: -1}, gate.ConcurrencyKey{})
}

func req(workflow string, s state, key gate.ConcurrencyKey) durable.InsertRequest {
	return durable.InsertRequest{Workflow: workflow, State: s, Options: durable.InsertOptions{Key: key}}
}

// measure runs a workload in the configured mode.
func (b *bench) measure(ctx context.Context, w workload) (*result, error) {
	e, err := b.newEnv(ctx, w.name, w.n, max(w.keys, 1), w.limits)
	if err != nil {
		return nil, err
	}
	defer e.close(ctx)
	if !w.backlogAfter {
		if err := e.insertGen(ctx, 0, w.backlogN, w.backlogGen, 5000); err != nil {
			return nil, fmt.Errorf("insert backlog: %w", err)
		}
	}
	n := w.n
	continuous := b.o.mode == "continuous"
	if !continuous {
		if err := e.insertGen(ctx, 0, n, w.gen, 1000); err != nil {
			return nil, fmt.Errorf("insert: %w", err)
		}
	}
	if w.backlogAfter {
		if err := e.insertGen(ctx, 0, w.backlogN, w.backlogGen, 5000); err != nil {
			return nil, fmt.Errorf("insert backlog: %w", err)
		}
	}
	runtime.GC()
	b.tracer.reset()
	if b.profile != nil {
		if err := b.profile.reset(ctx); err != nil {
			return nil, fmt.Errorf("server profile: %w", err)
		}
	}
	if err := b.obs.start(ctx); err != nil {
		return nil, err
	}
	if b.o.holdSnapshot {
		release, err := e.holdSnapshot(ctx)
		if err != nil {
			return nil, fmt.Errorf("hold a snapshot: %w", err)
		}
		defer release()
	}
	if err := e.start(ctx); err != nil {
		return nil, err
	}
	var stopSampling chan struct{}
	sampled := make(chan []int32, 1)
	if b.o.timeline > 0 {
		stopSampling = make(chan struct{})
		go e.rec.sampleRunning(stopSampling, sampled)
	}
	inserted := make(chan error, 1)
	if continuous {
		go func() { inserted <- e.insertAtRate(ctx, n, w.gen, b.o.rate) }()
	} else {
		inserted <- nil
	}
	at, failed, err := e.waitTerminal(ctx, w.workflow, n, 10*time.Minute)
	obs := b.obs.stop()
	var samples []int32
	if stopSampling != nil {
		close(stopSampling)
		samples = <-sampled
	}
	if err != nil {
		return nil, err
	}
	if err := <-inserted; err != nil {
		return nil, err
	}
	r := &result{N: n, Steps: int64(n * w.stepsPer), Elapsed: at.Sub(e.t0DB), Failed: failed, Unit: "steps/s",
		K: w.k, MaxPerKey: e.rec.maxPerKey(), Obs: obs}
	r.Rate = float64(r.Steps) / r.Elapsed.Seconds()
	if w.keyK != nil {
		r.KeyMax = keyMaxes(e.rec.maxPerName(), w.keyK)
	}
	floor := e.t0
	if continuous {
		floor = time.Time{}
	}
	lat := e.rec.latencies(n, floor)
	r.P50, r.P99 = percentile(lat, 0.5), percentile(lat, 0.99)
	if b.profile != nil {
		if err := b.reportRun(ctx, w.name, e.schema, r); err != nil {
			return nil, fmt.Errorf("server profile: %w", err)
		}
	}
	if stopSampling != nil {
		b.reportTimeline(w.name, samples)
	}
	return r, nil
}

// runOut is where a measured run's own lines go (-server-profile,
// -timeline): beside the results, or on stderr when they go out as JSON.
func (b *bench) runOut() io.Writer {
	if b.o.jsonOut {
		return os.Stderr
	}
	return b.w
}

// reportRun prints one measured run's rate, CPU per step and server
// statements (-server-profile).
func (b *bench) reportRun(ctx context.Context, name, schema string, r *result) error {
	w := b.runOut()
	fmt.Fprintf(w, "  run %s: %.0f %s; %s\n", name, r.Rate, r.Unit, r.cpuPerStep())
	return b.profile.report(ctx, w, name, schema, r.Steps)
}

// holdSnapshot opens a REPEATABLE READ transaction on a connection of its
// own and takes its snapshot (-hold-snapshot): until release, PostgreSQL
// keeps every row version that snapshot may see, the ones the engines'
// claims and outcomes leave behind included.
func (e *env) holdSnapshot(ctx context.Context) (release func(), err error) {
	conn, err := pgx.Connect(ctx, e.b.dbURL)
	if err != nil {
		return nil, err
	}
	release = func() { _ = conn.Close(context.Background()) } // closing it ends the transaction
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err == nil {
		var n int
		err = tx.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{e.schema, "limits"}.Sanitize()).Scan(&n)
	}
	if err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// reportTimeline prints a measured run's timeline (-timeline).
func (b *bench) reportTimeline(name string, samples []int32) {
	fmt.Fprintf(b.runOut(), "  timeline of %s, steps running per %v from the engines' start: %s\n",
		name, b.o.timeline, strings.Trim(fmt.Sprint(timeline(samples, b.o.timeline)), "[]"))
}

// insertAtRate inserts n instances made by gen at rate per second, in a
// batch every 10 ms.
func (e *env) insertAtRate(ctx context.Context, n int, gen func(int) durable.InsertRequest, rate float64) error {
	start := time.Now()
	done := 0
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for done < n {
		due := min(n, int(time.Since(start).Seconds()*rate)+1)
		if due > done {
			if err := e.insertGen(ctx, done, due, gen, due-done); err != nil {
				return err
			}
			done = due
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

func scenarioPlain(ctx context.Context, b *bench) (*result, error) {
	return b.measure(ctx, plainWorkload(b, "s1"))
}

// plainWorkload is scenario 1's: 20,000 no-key one-step instances.
func plainWorkload(b *bench, name string) workload {
	return workload{name: name, workflow: "noop", stepsPer: 1, n: b.scaled(20000, 100), gen: plainReq}
}

func scenarioK1(ctx context.Context, b *bench) (*result, error) {
	w := k1Workload(b, "s2", time.Millisecond)
	r, err := b.measure(ctx, w)
	if r != nil {
		r.Note = fmt.Sprintf("%d instances per key", w.n/w.keys)
	}
	return r, err
}

// k1Workload is scenario 2's: 5,000 steps of d (1 ms there) over 500
// K = 1 keys.
func k1Workload(b *bench, name string, d time.Duration) workload {
	n, keys := b.scaled(5000, 100), 500
	return workload{name: name, workflow: "work", stepsPer: 1, keys: keys, k: 1, n: n,
		gen: func(i int) durable.InsertRequest {
			k := i % keys
			return req("work", state{I: i, K: k, D: d}, gate.Identity("acct", strconv.Itoa(k)))
		}}
}

// scenarioSeveralKeys compares rows holding two keys, scenario 2's K = 1
// key and a gate key (20 keys of 10 slots, or of -s11-limit), with
// scenario 2's rows holding the K = 1 key alone, in alternating rounds. A
// step runs only when both of its keys have room; the recorder counts it
// under each. The same rows holding the gate key alone run in the same
// rounds as a reference, not part of the ratio: a row of both keys does
// all that a row of the gate key does and more, so that run's rate is
// what the several-keys side could reach with every cost of its own
// removed.
//
// A second pair, also not part of the ratio, guards the other shape of
// the same rows: one hot account, its steps one at a time, with a gate
// that has room (hotAccount). Which key a row of several keys executes
// under trades one shape for the other (docs/design/multikey.md, "Tried").
func scenarioSeveralKeys(ctx context.Context, b *bench) (*result, error) {
	base := k1Workload(b, "s11a", b.o.s11Step)
	accts, apis := base.keys, 20
	api := gate.Limit{Name: "api", Limit: b.o.s11Limit}
	rows := func(name string, keys func(i int) []gate.ConcurrencyKey) workload {
		return workload{name: name, workflow: "work", stepsPer: 1, n: base.n,
			limits: []gate.Limit{api}, keyK: map[string]int{"acct": 1, "api": api.Limit},
			gen: func(i int) durable.InsertRequest {
				return durable.InsertRequest{Workflow: "work", State: state{I: i, K: -1, D: b.o.s11Step, M: true},
					Options: durable.InsertOptions{Keys: keys(i)}}
			}}
	}
	apiKey := func(i int) gate.ConcurrencyKey { return gate.Gate("api", fmt.Sprint(i%apis)) }
	several := rows("s11b", func(i int) []gate.ConcurrencyKey {
		return []gate.ConcurrencyKey{gate.Identity("acct", fmt.Sprint(i%accts)), apiKey(i)}
	})
	gateAlone := rows("s11c", func(i int) []gate.ConcurrencyKey { return []gate.ConcurrencyKey{apiKey(i)} })
	r, err := b.compare(ctx, base, several, gateAlone)
	if err != nil {
		return nil, err
	}
	r.Note = fmt.Sprintf("%d rows of acct:i%%%d (K=1) + api:i%%%d (gate %d), steps of %v, vs the acct key alone; %s",
		several.n, accts, apis, api.Limit, b.o.s11Step, r.Note)
	r.Name = fmt.Sprintf("several keys: K=1 of %d + gate %d of %d", accts, api.Limit, apis)
	if b.o.s11Step != s11IssueStep {
		r.Name += fmt.Sprintf(", %v steps", b.o.s11Step)
	}
	h, err := b.hotAccount(ctx)
	if err != nil {
		return nil, err
	}
	r.Note += "; " + h.Note
	r.KeyMax = mergeKeyMax(r.KeyMax, h.KeyMax)
	if h.K > 0 && h.MaxPerKey-h.K > r.MaxPerKey-r.K {
		r.K, r.MaxPerKey = h.K, h.MaxPerKey
	}
	return r, nil
}

// hotAccount compares rows of one K = 1 key (acct:0) and a gate with room
// to spare (wide:0, limit 1,000) with the same rows holding acct:0 alone,
// in alternating rounds: the account's steps run one at a time either way,
// and a row of both keys should pass the account's slot to the next one as
// a row of the account alone does (by hand-off), not wait for a claim.
func (b *bench) hotAccount(ctx context.Context) (*result, error) {
	n := b.scaled(500, 100)
	wide := gate.Limit{Name: "wide", Limit: 1000}
	alone := workload{name: "s11d", workflow: "work", stepsPer: 1, keys: 1, k: 1, n: n,
		gen: func(i int) durable.InsertRequest {
			return req("work", state{I: i, K: 0, D: time.Millisecond}, gate.Identity("acct", "0"))
		}}
	both := workload{name: "s11e", workflow: "work", stepsPer: 1, n: n,
		limits: []gate.Limit{wide}, keyK: map[string]int{"acct": 1, "wide": wide.Limit},
		gen: func(i int) durable.InsertRequest {
			return durable.InsertRequest{Workflow: "work", State: state{I: i, K: -1, D: time.Millisecond, M: true},
				Options: durable.InsertOptions{Keys: []gate.ConcurrencyKey{gate.Identity("acct", "0"), gate.Gate("wide", "0")}}}
		}}
	h, err := b.compare(ctx, alone, both)
	if err != nil {
		return nil, err
	}
	h.Note = fmt.Sprintf("one hot account, %d rows of acct:0 + wide:0 (gate %d) vs acct:0 alone: ratio %.2f, %s",
		n, wide.Limit, h.Ratio, h.Note)
	return h, nil
}

// mergeKeyMax adds the names of b to a, each with the larger maximum.
func mergeKeyMax(a, b []keyMax) []keyMax {
	for _, m := range b {
		i := slices.IndexFunc(a, func(x keyMax) bool { return x.Name == m.Name })
		if i < 0 {
			a = append(a, m)
			continue
		}
		a[i].Max = max(a[i].Max, m.Max)
	}
	slices.SortFunc(a, func(x, y keyMax) int { return cmp.Compare(x.Name, y.Name) })
	return a
}

// keyMaxes is the recorder's most steps at once per key name against
// each name's K (1 for a name without one), sorted by name.
func keyMaxes(seen, k map[string]int) []keyMax {
	out := []keyMax{}
	for name, kk := range k {
		out = append(out, keyMax{Name: name, Max: seen[name], K: kk})
	}
	for name, m := range seen {
		if _, ok := k[name]; !ok {
			out = append(out, keyMax{Name: name, Max: m, K: 1})
		}
	}
	slices.SortFunc(out, func(x, y keyMax) int { return cmp.Compare(x.Name, y.Name) })
	return out
}

// gateWorkload is n steps of d each through one gate of limit (in shards).
func gateWorkload(b *bench, name string, n, limit, shards int, d time.Duration) workload {
	return workload{name: name, workflow: "work", stepsPer: 1, keys: 1, k: limit, n: n,
		limits: []gate.Limit{{Name: "api", Limit: limit, Shards: shards}},
		gen: func(i int) durable.InsertRequest {
			return req("work", state{I: i, K: 0, D: d}, gate.Gate("api", "1"))
		}}
}

func scenarioGate10(ctx context.Context, b *bench) (*result, error) {
	return b.measure(ctx, gateWorkload(b, "s3", b.scaled(5000, 100), 10, 1, time.Millisecond))
}

// scenarioGate1000 compares a roomy sharded gate with scenario 1's plain
// work, in alternating rounds like scenarios 5 and 6: one run of plain work
// varies by a quarter on this kind of machine, more than the gap the ratio
// measures, so the two sides are measured side by side.
func scenarioGate1000(ctx context.Context, b *bench) (*result, error) {
	r, err := b.compare(ctx, plainWorkload(b, "s4a"), gateWorkload(b, "s4b", b.scaled(20000, 100), 1000, 10, time.Millisecond))
	if err != nil {
		return nil, err
	}
	if b.o.engines*b.o.executors < 1000 {
		r.Note = fmt.Sprintf("the gate admits up to 1000; the engines run at most %d at once; %s", b.o.engines*b.o.executors, r.Note)
	}
	return r, nil
}

func scenarioBacklog(ctx context.Context, b *bench) (*result, error) {
	n, hot := b.scaled(10000, 100), b.scaled(100000, 1000)
	plain := workload{name: "s5a", workflow: "noop", stepsPer: 1, keys: 1, k: 1, n: n, gen: plainReq}
	loaded := plain
	loaded.name, loaded.backlogN = "s5b", hot
	loaded.backlogGen = func(int) durable.InsertRequest {
		return req("work", state{I: -1, K: 0, D: time.Millisecond}, gate.Identity("hot", "1"))
	}
	r, err := b.compare(ctx, plain, loaded)
	if err != nil {
		return nil, err
	}
	r.Note = fmt.Sprintf("%d no-key instances behind %d of key hot:1 (K=1, 1 ms) vs. alone; %s", n, hot, r.Note)
	return r, nil
}

// compare measures base and other alternately -rounds times and returns
// other's median round, with Ratio the median of other's rates over the
// median of base's (alternating spreads the machine's drift over both).
// A key over its K in any round of either side shows in the result's
// check, not only one in the median round (K and MaxPerKey are then the
// round's furthest over); KeyMax (rows of several keys) is the most of
// every round of other. Each of refs runs in every round after other, as
// a reference: its median and its ratio to base's are added to the note,
// and a key over its K in one of its rounds fails the result as well.
func (b *bench) compare(ctx context.Context, base, other workload, refs ...workload) (*result, error) {
	var baseRates, otherRates []float64
	refRates := make([][]float64, len(refs))
	var rs, all []*result
	for i := 0; i < max(b.o.rounds, 1); i++ {
		rb, err := b.measure(ctx, base)
		if err != nil {
			return nil, err
		}
		ro, err := b.measure(ctx, other)
		if err != nil {
			return nil, err
		}
		baseRates, otherRates = append(baseRates, rb.Rate), append(otherRates, ro.Rate)
		rs, all = append(rs, ro), append(all, rb, ro)
		for j, ref := range refs {
			rr, err := b.measure(ctx, ref)
			if err != nil {
				return nil, err
			}
			refRates[j] = append(refRates[j], rr.Rate)
			all = append(all, rr)
		}
	}
	slices.SortFunc(rs, func(x, y *result) int { return cmp.Compare(x.Rate, y.Rate) })
	r := rs[len(rs)/2]
	over := func(x *result) int {
		if x.K == 0 {
			return 0
		}
		return x.MaxPerKey - x.K
	}
	for _, x := range all {
		if over(x) > max(over(r), 0) {
			r.K, r.MaxPerKey = x.K, x.MaxPerKey
		}
		if x != r {
			r.KeyMax = mergeKeyMax(r.KeyMax, x.KeyMax)
		}
	}
	mb, mo := median(baseRates), median(otherRates)
	r.Ratio = mo / mb
	r.Note = fmt.Sprintf("median of %d alternating rounds: %.0f vs %.0f steps/s (rounds: %s vs %s)", len(rs), mo, mb,
		fmtRates(otherRates), fmtRates(baseRates))
	for j, ref := range refs {
		m := median(refRates[j])
		r.Note += fmt.Sprintf("; reference %s: %.0f steps/s, ratio %.2f (rounds: %s)", ref.name, m, m/mb, fmtRates(refRates[j]))
	}
	return r, nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fmtRates(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(parts, "/")
}

func scenarioPick(ctx context.Context, b *bench) (*result, error) {
	n := b.scaled(10000, 100)
	run := func(name string, total int) workload {
		return workload{name: name, workflow: "noop", stepsPer: 1, backlogAfter: true, n: n, gen: plainReq,
			backlogN: total - n, backlogGen: func(int) durable.InsertRequest { return plainReq(-1) }}
	}
	big := max(b.o.pickRows, n)
	r, err := b.compare(ctx, run("s6a", n), run("s6b", big))
	if err != nil {
		return nil, err
	}
	r.Note = fmt.Sprintf("%d steps with %d ready rows vs %d (heap max of the bench process %.0f MB); %s",
		n, big, n, r.Obs.HeapMaxMB, r.Note)
	return r, nil
}

func scenarioThree(ctx context.Context, b *bench) (*result, error) {
	n := b.scaled(5000, 100)
	w := workload{name: "s7", workflow: "three", stepsPer: 3, n: n,
		gen: func(i int) durable.InsertRequest { return req("three", state{I: i, K: -1}, gate.ConcurrencyKey{}) }}
	r, err := b.measure(ctx, w)
	if r != nil {
		r.Note = fmt.Sprintf("%d signals sent by 16 client goroutines while the steps ran", 2*n)
	}
	return r, err
}

func scenarioInsert(ctx context.Context, b *bench) (*result, error) {
	n := b.scaled(50000, 1000)
	e, err := b.newEnv(ctx, "s8", n, 1, nil)
	if err != nil {
		return nil, err
	}
	defer e.close(ctx)
	reqs := make([]durable.InsertRequest, n)
	for i := range reqs {
		reqs[i] = req("noop", state{I: i, K: -1}, gate.ConcurrencyKey{})
	}
	if err := b.obs.start(ctx); err != nil {
		return nil, err
	}
	batch := b.o.insertBatch
	var lat []time.Duration
	t0 := time.Now()
	for from := 0; from < n; from += batch {
		t := time.Now()
		if _, err := e.client.InsertMany(ctx, reqs[from:min(from+batch, n)]); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t))
	}
	elapsed := time.Since(t0)
	obs := b.obs.stop()
	// One at a time, for comparison.
	singles := min(1000, n)
	t1 := time.Now()
	for i := 0; i < singles; i++ {
		if _, err := e.client.Insert(ctx, "noop", state{I: -1, K: -1}, durable.InsertOptions{}); err != nil {
			return nil, err
		}
	}
	single := time.Since(t1)
	slices.Sort(lat)
	return &result{N: n, Steps: int64(n), Elapsed: elapsed, Rate: float64(n) / elapsed.Seconds(), Unit: "rows/s",
		P50: percentile(lat, 0.5), P99: percentile(lat, 0.99), Obs: obs,
		Note: fmt.Sprintf("batches of %d rows (p50/p99 are per batch); one row per call: %.0f rows/s", batch,
			float64(singles)/single.Seconds())}, nil
}

func scenarioIdle(ctx context.Context, b *bench) (*result, error) {
	n := b.scaled(200, 50)
	e, err := b.newEnv(ctx, "s9", n, 1, nil)
	if err != nil {
		return nil, err
	}
	defer e.close(ctx)
	if err := e.start(ctx); err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond) // idle: every pick loop is waiting
	b.tracer.reset()
	if err := b.obs.start(ctx); err != nil {
		return nil, err
	}
	t0 := time.Now()
	for i := 0; i < n; i++ {
		at := time.Now()
		e.rec.inserted(i, i+1, at)
		if _, err := e.client.Insert(ctx, "noop", state{I: i, K: -1}, durable.InsertOptions{}); err != nil {
			return nil, err
		}
		deadline := time.Now().Add(10 * time.Second)
		for e.rec.finished.Load() < int64(i+1) {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("instance %d did not start within 10s", i)
			}
			time.Sleep(100 * time.Microsecond)
		}
		// Let the outcome commit and the engine go idle again.
		time.Sleep(time.Duration(5+rand.IntN(10)) * time.Millisecond)
	}
	elapsed := time.Since(t0)
	obs := b.obs.stop()
	lat := e.rec.latencies(n, time.Time{})
	return &result{N: n, Steps: int64(n), Elapsed: elapsed, Unit: "", P50: percentile(lat, 0.5),
		P99: percentile(lat, 0.99), Obs: obs,
		Note: "one insert at a time into idle engines; latency from before the Insert call to the step body"}, nil
}

// fleetCell is one cell of scenario 10: engines × executors sharing one gate
// of limit, whose steps each sleep for step.
type fleetCell struct {
	engines, executors, limit int
	step                      time.Duration
}

// fleetCells are scenario 10's cells: a few engines against a narrow gate at
// two step lengths, and a wider gate.
var fleetCells = []fleetCell{
	{1, 16, 5, 15 * time.Millisecond}, {3, 4, 5, 15 * time.Millisecond}, {6, 4, 5, 15 * time.Millisecond},
	{1, 16, 5, 50 * time.Millisecond}, {3, 4, 5, 50 * time.Millisecond}, {6, 4, 5, 50 * time.Millisecond},
	{3, 16, 20, 20 * time.Millisecond},
}

// String names the cell in the report.
func (c fleetCell) String() string {
	return fmt.Sprintf("%d×%d gate %d, %d ms", c.engines, c.executors, c.limit, c.step.Milliseconds())
}

// ideal is how long n steps take through the gate if it is never idle.
func (c fleetCell) ideal(n int) time.Duration {
	return time.Duration(n) * c.step / time.Duration(c.limit)
}

// scenarioFleet measures how full a fleet of engines keeps the gate they
// share: each cell's utilisation is its ideal time over its wall time, as
// the median of -rounds runs (the cells interleaved, so the machine's drift
// falls on all of them), and the headline is the lowest cell median.
func scenarioFleet(ctx context.Context, b *bench) (*result, error) {
	runs := make([][]*result, len(fleetCells))
	for round := 0; round < max(b.o.rounds, 1); round++ {
		for i, c := range fleetCells {
			// The cell's engines and executors, in burn-down mode; every other setting is the library's default.
			cb := *b
			cb.o.engines, cb.o.executors, cb.o.mode = c.engines, c.executors, "burn"
			// Five seconds of ideal work, as the peers' util scenario has
			// (500 steps of 50 ms through a gate of 5): a fleet's start
			// (its engines' first claims, their listeners) is a fixed cost
			// of a few hundred milliseconds that would otherwise weigh as
			// much as the steady state measured here.
			perSec := float64(c.limit) / c.step.Seconds()
			n := b.scaled(int(5*perSec), int(3*perSec))
			r, err := cb.measure(ctx, gateWorkload(&cb, fmt.Sprintf("s10_%d", i), n, c.limit, 1, c.step))
			if err != nil {
				return nil, fmt.Errorf("cell %s: %w", c, err)
			}
			r.Util = c.ideal(n).Seconds() / r.Elapsed.Seconds()
			runs[i] = append(runs[i], r)
		}
	}
	var head *result
	var violation *result
	lines := []string{fmt.Sprintf("utilisation = ideal (n × step ÷ limit) ÷ wall; per cell the median (range) over %d round(s); "+
		"engines × executors are the cell's (not -engines/-executors); the figures above are the lowest cell's median round",
		len(runs[0]))}
	for i, c := range fleetCells {
		rs := slices.Clone(runs[i])
		slices.SortFunc(rs, func(x, y *result) int { return cmp.Compare(x.Util, y.Util) })
		utils, most := make([]float64, len(rs)), 0
		for j, r := range rs {
			utils[j], most = r.Util, max(most, r.MaxPerKey)
			if r.MaxPerKey > r.K && (violation == nil || r.MaxPerKey-r.K > violation.MaxPerKey-violation.K) {
				violation = r
			}
		}
		med := median(utils)
		check := fmt.Sprintf("max concurrency %d ≤ gate %d", most, c.limit)
		if most > c.limit {
			check = fmt.Sprintf("VIOLATION: max concurrency %d > gate %d", most, c.limit)
		}
		lines = append(lines, fmt.Sprintf("%-20s n=%-5d ideal %.2fs  utilisation %.2f (%.2f–%.2f)  %s",
			c.String()+":", rs[0].N, c.ideal(rs[0].N).Seconds(), med, utils[0], utils[len(utils)-1], check))
		if head == nil || med < head.Util {
			head = rs[len(rs)/2]
			head.Util = med
		}
	}
	if violation != nil {
		head.K, head.MaxPerKey = violation.K, violation.MaxPerKey
	}
	head.Note = strings.Join(lines, "\n    ")
	return head, nil
}
