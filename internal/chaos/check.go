package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/godurable/godurable/gate"
)

// instanceRow is an instance as the final check reads it.
type instanceRow struct {
	ID, Workflow, Status, ParentID, LastError string
	Result                                    []byte
}

// historyRow is a committed step run as the history table has it.
type historyRow struct {
	Instance, Step, Worker, Outcome, Error string
	Attempt                                int
	Started, Finished                      time.Time
}

// counterRow is one gate counter and the executing rows it holds.
type counterRow struct {
	Key                string
	Shard              int
	Capacity, Avail, N int
}

// logEvent is one line of a worker's JSON log.
type logEvent struct {
	Proc, Msg, Level, Instance string
	Time                       time.Time
	Attrs                      map[string]any
}

// stateCarrying are the history outcomes of runs that committed a state
// (every run of the workload appends its token to the state it returns).
var stateCarrying = map[string]bool{"next": true, "retry": true, "await": true, "sleep": true, "spawn": true, "done": true}

// rateSlack is the most a recorded start may trail its claim (the rate
// limit is charged at the claim).
const rateSlack = 500 * time.Millisecond

var tokenInError = regexp.MustCompile(`token=([0-9a-f]{16})`)

// readLogs parses the JSON logs of every process in dir and counts key-id
// leaks in every log and output file.
func readLogs(dir string) (events []logEvent, leaks int, err error) {
	files, err := filepath.Glob(filepath.Join(dir, "log-*.json"))
	if err != nil {
		return nil, 0, err
	}
	for _, name := range files {
		proc := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(name), "log-"), ".json")
		f, err := os.Open(name)
		if err != nil {
			return nil, 0, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Bytes()
			leaks += strings.Count(string(line), KeyIDMarker)
			var m map[string]any
			if json.Unmarshal(line, &m) != nil {
				continue
			}
			ev := logEvent{Proc: proc, Attrs: m}
			ev.Msg, _ = m["msg"].(string)
			ev.Level, _ = m["level"].(string)
			ev.Instance, _ = m["instance"].(string)
			if ts, ok := m["time"].(string); ok {
				ev.Time, _ = time.Parse(time.RFC3339Nano, ts)
			}
			events = append(events, ev)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, 0, err
		}
	}
	outs, _ := filepath.Glob(filepath.Join(dir, "out-*.log"))
	for _, name := range outs {
		b, err := os.ReadFile(name)
		if err == nil {
			leaks += strings.Count(string(b), KeyIDMarker)
		}
	}
	return events, leaks, nil
}

// runClass is what became of a recorded run.
type runClass int

const (
	runCommitted runClass = iota + 1
	runKilledMidStep
	runLostWithProcess
	runStale
	runUnexplained
)

// analysis is the verdict over the records and the database.
type analysis struct {
	report     *Report
	violations []string
}

func (a *analysis) fail(format string, args ...any) {
	a.violations = append(a.violations, fmt.Sprintf(format, args...))
}

// check runs every final check and fills the report's figures.
//
// survivors are the processes that lived through the database restart
// (from before it went down until well after it was back at dbUp): each must
// have logged the outage exactly once, its end exactly once, and committed
// work after it without being restarted.
func check(rep *Report, recs *Records, deaths map[string]int64, graceful map[string]bool, limits gate.Limits,
	insts []instanceRow, hist []historyRow, counters []counterRow, events []logEvent, leaks int, parents int,
	survivors map[string]bool, dbUp int64) []string {
	a := &analysis{report: rep}
	rep.Runs = len(recs.Runs)
	for _, r := range recs.Runs {
		if strings.Contains(r.Key, ",") {
			rep.SeveralKeyRuns++
		}
	}
	rep.TornLines = recs.Torn
	if recs.Torn > 0 {
		a.fail("%d recorder lines could not be parsed", recs.Torn)
	}
	for _, b := range recs.Bad {
		a.fail("a step body found: %s", b)
	}

	// Committed runs: the chains of the results, and the error runs the
	// history kept (their token is in the error text).
	committed := map[string]string{} // token -> instance
	byID := map[string]instanceRow{}
	results := map[string]State{}
	children := map[string]int{}
	for _, in := range insts {
		byID[in.ID] = in
		if in.ParentID != "" {
			children[in.ParentID]++
		}
		if in.Status != "done" {
			a.fail("instance %s (%s) ended %s: %s", in.ID, in.Workflow, in.Status, in.LastError)
			continue
		}
		var s State
		if err := json.Unmarshal(in.Result, &s); err != nil {
			a.fail("instance %s: result %s does not decode: %v", in.ID, in.Result, err)
			continue
		}
		results[in.ID] = s
		for _, tok := range s.Chain {
			committed[tok] = in.ID
		}
	}
	rep.Instances = len(insts)
	for _, n := range children {
		rep.Children += n
	}
	rep.Done = len(results)
	if got := len(insts) - rep.Children; got != parents {
		a.fail("%d parent instances inserted, %d found", parents, got)
	}
	histBy := map[string][]historyRow{}
	for _, h := range hist {
		histBy[h.Instance] = append(histBy[h.Instance], h)
		if h.Outcome == "error" || h.Outcome == "panic" {
			m := tokenInError.FindStringSubmatch(h.Error)
			if m == nil {
				a.fail("instance %s: a committed %s has no token: %q", h.Instance, h.Outcome, h.Error)
				continue
			}
			committed[m[1]] = h.Instance
		}
	}

	// Expected results: each chain is exactly the runs that continued one
	// another, as the recorder saw them.
	for id, s := range results {
		if s.Steps != s.Max || len(s.Chain) != s.Max {
			a.fail("instance %s: result has %d steps and a chain of %d, want %d", id, s.Steps, len(s.Chain), s.Max)
		}
		for i, tok := range s.Chain {
			r := recs.Runs[tok]
			switch {
			case r == nil:
				a.fail("instance %s: committed run %s was never recorded", id, tok)
				continue
			case r.Instance != id:
				a.fail("instance %s: committed run %s was recorded for %s", id, tok, r.Instance)
			case r.Index != i:
				a.fail("instance %s: run %s at chain position %d saw position %d", id, tok, i, r.Index)
			case r.End == 0:
				a.fail("instance %s: committed run %s never ended", id, tok)
			}
			if want := prevOf(s.Chain, i); r.Prev != want {
				a.fail("instance %s: run %s continued %q, not the committed %q (a stale state committed)", id, tok, r.Prev, want)
			}
			if i > 0 {
				if p := recs.Runs[s.Chain[i-1]]; p != nil && p.End > r.Start {
					a.fail("instance %s: committed runs %s and %s overlap", id, p.Token, tok)
				}
			}
		}
		if in := byID[id]; in.ParentID == "" && children[id] != s.Kids {
			a.fail("instance %s spawned %d children, %d found", id, s.Kids, children[id])
		}
	}

	// No stale outcome committed: the history (written only by committed
	// outcomes) has one state-carrying row per chain element, and no two
	// committed runs of one instance overlap in time.
	for id, rows := range histBy {
		n := 0
		for _, h := range rows {
			if stateCarrying[h.Outcome] {
				n++
			}
		}
		if s, ok := results[id]; ok && n != len(s.Chain) {
			a.fail("instance %s: %d state-carrying outcomes committed, its chain holds %d (a stale outcome committed?)", id, n, len(s.Chain))
		}
		sort.Slice(rows, func(i, j int) bool { return rows[i].Started.Before(rows[j].Started) })
		for i := 1; i < len(rows); i++ {
			if rows[i].Started.Before(rows[i-1].Finished) {
				a.fail("instance %s: committed runs overlap: %s/%s %s..%s and %s/%s %s..%s", id,
					rows[i-1].Step, rows[i-1].Worker, rows[i-1].Started.Format(time.StampMicro), rows[i-1].Finished.Format(time.StampMicro),
					rows[i].Step, rows[i].Worker, rows[i].Started.Format(time.StampMicro), rows[i].Finished.Format(time.StampMicro))
			}
		}
		rep.HistoryRows += len(rows)
	}

	// Logs: stale outcomes, outages, reclaims, reaps, repairs.
	type staleEv struct {
		proc, instance string
		at             int64
	}
	var stale []staleEv
	unavailable, available := map[string]int{}, map[string]int{}
	for _, ev := range events {
		switch {
		case strings.HasPrefix(ev.Msg, "stale outcome discarded"):
			stale = append(stale, staleEv{ev.Proc, ev.Instance, ev.Time.UnixNano()})
		case strings.HasPrefix(ev.Msg, "store unavailable"):
			unavailable[ev.Proc]++
			rep.OutageLines++
		case ev.Msg == "store available again":
			available[ev.Proc]++
			rep.RecoveryLines++
		case strings.HasPrefix(ev.Msg, "store conflict"):
			rep.Conflicts++
		case strings.HasPrefix(ev.Msg, "reclaimed claims"):
			rep.Reclaimed += intAttr(ev, "n")
		case strings.HasPrefix(ev.Msg, "reaped expired leases"):
			rep.Reaped += intAttr(ev, "n")
		case ev.Msg == "reconciled":
			rep.CountersRepaired += intAttr(ev, "counters_repaired")
			rep.Drift += intAttr(ev, "drift")
			rep.ReconcilerPromoted += intAttr(ev, "promoted")
		case strings.HasPrefix(ev.Msg, "outcome refused"):
			a.fail("process %s: %s: %v", ev.Proc, ev.Msg, ev.Attrs["err"])
		case ev.Msg == "step panicked":
			rep.Panics++
		}
	}
	for proc, n := range unavailable {
		if n > rep.DBRestarts {
			a.fail("process %s logged %d outages for %d database restarts (once per outage expected)", proc, n, rep.DBRestarts)
		}
		if available[proc] > n {
			a.fail("process %s logged %d recoveries for %d outages", proc, available[proc], n)
		}
	}
	rep.Survivors = len(survivors)
	for proc := range survivors {
		if unavailable[proc] != 1 || available[proc] != 1 {
			a.fail("process %s lived through the database restart and logged %d outages and %d recoveries (want 1 and 1)",
				proc, unavailable[proc], available[proc])
		}
		resumed := false
		for tok, r := range recs.Runs {
			if _, ok := committed[tok]; ok && r.Proc == proc && r.Start > dbUp {
				resumed = true
				break
			}
		}
		if !resumed {
			a.fail("process %s committed no work after the database came back", proc)
		}
	}
	rep.KeyValuesInLogs = leaks
	if leaks > 0 {
		a.fail("%d key values found in logs above debug level", leaks)
	}

	// Classify every run.
	class := map[string]runClass{}
	byProcInst := map[[2]string][]*StepRun{}
	for tok, r := range recs.Runs {
		if _, ok := committed[tok]; ok {
			class[tok] = runCommitted
			if r.End == 0 {
				a.fail("run %s of %s committed but never ended", tok, r.Instance)
			}
			continue
		}
		byProcInst[[2]string{r.Proc, r.Instance}] = append(byProcInst[[2]string{r.Proc, r.Instance}], r)
	}
	for _, ev := range stale {
		// The stale outcome is that of the latest uncommitted run of the
		// instance in that process that had ended by the time of the log.
		var best *StepRun
		for _, r := range byProcInst[[2]string{ev.proc, ev.instance}] {
			if r.End > 0 && r.End <= ev.at && class[r.Token] == 0 && (best == nil || r.End > best.End) {
				best = r
			}
		}
		if best == nil {
			a.fail("process %s discarded a stale outcome of %s that matches no uncommitted run", ev.proc, ev.instance)
			continue
		}
		class[best.Token] = runStale
	}
	rep.StaleOutcomes = len(stale)
	for tok, r := range recs.Runs {
		if class[tok] != 0 {
			continue
		}
		death, killed := deaths[r.Proc]
		switch {
		case r.End == 0 && killed:
			class[tok] = runKilledMidStep
			r.End = death
		case killed && r.End <= death:
			class[tok] = runLostWithProcess
		default:
			class[tok] = runUnexplained
			a.fail("run %s of %s in process %s (graceful exit: %v) neither committed nor died with its process nor was discarded as stale",
				tok, r.Instance, r.Proc, graceful[r.Proc])
		}
	}
	for _, c := range class {
		switch c {
		case runCommitted:
			rep.Committed++
		case runKilledMidStep:
			rep.KilledMidStep++
		case runLostWithProcess:
			rep.LostWithProcess++
		case runStale:
			rep.StaleRuns++
		}
	}

	// No key over its K at any moment: a sweep over every counted run.
	rep.MaxByName = map[string]int{}
	rep.KByName = map[string]int{}
	for _, o := range sweep(recs, limits, func(tok string, r *StepRun) bool { return class[tok] != runStale && r.End != 0 }) {
		name := gate.NameOf(o.key)
		rep.KByName[name] = o.k
		rep.MaxByName[name] = max(rep.MaxByName[name], o.max)
		rep.Keys++
		if o.over != nil {
			rep.KViolations++
			toks := make([]string, len(o.over.running))
			for i, t := range o.over.running {
				r := recs.Runs[t]
				toks[i] = fmt.Sprintf("%s(%s %s %s)", t, r.Proc, r.Instance, classNames[class[t]])
			}
			a.fail("key %s ran %d at once (K = %d) at %s: %s", o.key, o.over.n, o.k,
				time.Unix(0, o.over.at).Format(time.StampMicro), strings.Join(toks, ", "))
		}
	}
	// The same sweep with the stale runs counted too: the overlaps that
	// fences, not admission, made harmless (reported, not a violation).
	for _, o := range sweep(recs, limits, func(tok string, r *StepRun) bool { return r.End != 0 }) {
		if o.over != nil {
			rep.StaleOverlapKeys++
		}
	}

	// The rate limit: admitted claims of "bulk" keys never outrun the bucket,
	// so neither do the starts of their bodies, give or take the time from
	// claim to start (rateSlack).
	var starts []int64
	for _, r := range recs.Runs {
		if r.Key != "" && slices.ContainsFunc(strings.Split(r.Key, ","), func(k string) bool { return gate.NameOf(k) == "bulk" }) {
			starts = append(starts, r.Start)
		}
	}
	slices.Sort(starts)
	rep.BulkStarts = len(starts)
	bestExcess := math.Inf(-1)
windows:
	for j := range starts {
		for i := 0; i <= j; i++ {
			n := j - i + 1
			span := time.Duration(starts[j] - starts[i])
			bound := float64(BulkRate)*(span+rateSlack).Seconds() + BulkBurst
			if excess := float64(n) - bound; excess > bestExcess {
				bestExcess = excess
				rep.BulkPeak = fmt.Sprintf("%d starts in %s (bound %.1f)", n, span.Round(time.Millisecond), bound)
			}
			if float64(n) > bound {
				a.fail("rate limit: %d bulk steps started within %s, more than %d/s × (%s + %s slack) + burst %d",
					n, span, BulkRate, span, rateSlack, BulkBurst)
				break windows // one report is enough
			}
		}
	}

	// Gate counters at the end: equal to the truth (nothing executing).
	for _, c := range counters {
		if c.Avail != c.Capacity-c.N {
			a.fail("counter of %s shard %d: %d free of %d with %d executing at the end", gate.NameOf(c.Key), c.Shard, c.Avail, c.Capacity, c.N)
		}
	}
	rep.Counters = len(counters)
	return a.violations
}

// keyOverlap is what a sweep found for one key.
type keyOverlap struct {
	key    string
	k, max int
	// over is the first moment more than k ran at once (nil: none).
	over *moment
}

type moment struct {
	at      int64
	n       int
	running []string
}

// sweep walks the start and end of every run include accepts, per key, in
// time order (an end before a start at the same instant), and reports the
// most that ran at once and the first moment over K.
func sweep(recs *Records, limits gate.Limits, include func(tok string, r *StepRun) bool) []keyOverlap {
	type edge struct {
		at    int64
		delta int
		tok   string
	}
	edges := map[string][]edge{}
	for tok, r := range recs.Runs {
		if r.Key == "" || !include(tok, r) {
			continue
		}
		for _, k := range strings.Split(r.Key, ",") { // a run holds every key it recorded
			edges[k] = append(edges[k], edge{r.Start, +1, tok}, edge{r.End, -1, tok})
		}
	}
	keys := make([]string, 0, len(edges))
	for k := range edges {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]keyOverlap, 0, len(keys))
	for _, key := range keys {
		es := edges[key]
		sort.Slice(es, func(i, j int) bool {
			if es[i].at != es[j].at {
				return es[i].at < es[j].at
			}
			return es[i].delta < es[j].delta
		})
		o := keyOverlap{key: key, k: limits.K(key)}
		cur := 0
		running := map[string]bool{}
		for _, e := range es {
			cur += e.delta
			if e.delta > 0 {
				running[e.tok] = true
			} else {
				delete(running, e.tok)
			}
			o.max = max(o.max, cur)
			if cur > o.k && o.over == nil {
				m := &moment{at: e.at, n: cur}
				for t := range running {
					m.running = append(m.running, t)
				}
				sort.Strings(m.running)
				o.over = m
			}
		}
		out = append(out, o)
	}
	return out
}

var classNames = map[runClass]string{runCommitted: "committed", runKilledMidStep: "killed mid-step",
	runLostWithProcess: "lost with its process", runStale: "stale", runUnexplained: "unexplained"}

func prevOf(chain []string, i int) string {
	if i == 0 {
		return ""
	}
	return chain[i-1]
}

func intAttr(ev logEvent, name string) int {
	switch v := ev.Attrs[name].(type) {
	case float64:
		return int(v)
	case string:
		var n int
		fmt.Sscan(v, &n)
		return n
	}
	return 0
}
