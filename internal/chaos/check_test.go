package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
)

// world builds the inputs of check for hand-made scenarios: each scenario
// breaks one promise (or bends one rule the checker must allow) and the
// checker must say so (or not).
type world struct {
	t        *testing.T
	recs     *Records
	deaths   map[string]int64
	graceful map[string]bool
	insts    []instanceRow
	hist     []historyRow
	events   []logEvent
	counters []counterRow
	leaks    int
	parents  int
	restarts int
	// survivors lived through a database restart that ended at 1000 ms.
	survivors map[string]bool
}

func newWorld(t *testing.T) *world {
	return &world{t: t, recs: &Records{Runs: map[string]*StepRun{}}, deaths: map[string]int64{}, graceful: map[string]bool{}}
}

const t0 = int64(1_000_000_000_000)

func ms(n int) int64 { return t0 + int64(n)*int64(time.Millisecond) }

// run records a step body of instance inst under key in process proc from
// start to end (ms; end < 0: no end line).
func (w *world) run(token, proc, inst, key string, index int, prev string, start, end int, label string) {
	r := &StepRun{Token: token, Proc: proc, Instance: inst, Key: key, Index: index, Prev: prev, Start: ms(start), Step: "work", Label: label}
	if end >= 0 {
		r.End = ms(end)
	}
	w.recs.Runs[token] = r
}

// done adds a done parent whose chain is tokens, with one history row per
// token (times from the recorder).
func (w *world) done(id string, tokens ...string) {
	s := State{Steps: len(tokens), Max: len(tokens), Chain: tokens}
	b, _ := json.Marshal(s)
	w.insts = append(w.insts, instanceRow{ID: id, Workflow: ParentWorkflow, Status: "done", Result: b})
	w.parents++
	for i, tok := range tokens {
		r := w.recs.Runs[tok]
		outcome := "next"
		if i == len(tokens)-1 {
			outcome = "done"
		}
		w.hist = append(w.hist, historyRow{Instance: id, Step: "work", Worker: r.Proc, Outcome: outcome,
			Started: time.Unix(0, r.Start), Finished: time.Unix(0, r.End)})
	}
}

func (w *world) check() (*Report, []string) {
	limits, err := gate.NewLimits(Limits)
	require.NoError(w.t, err)
	rep := &Report{DBRestarts: w.restarts}
	v := check(rep, w.recs, w.deaths, w.graceful, limits, w.insts, w.hist, w.counters, w.events, w.leaks, w.parents, w.survivors, ms(1000))
	return rep, v
}

func joined(v []string) string { return strings.Join(v, "\n") }

func TestCheckPassesACleanRun(t *testing.T) {
	w := newWorld(t)
	w.run("a1", "p1", "i1", "acct:x", 0, "", 0, 10, "next")
	w.run("a2", "p1", "i1", "acct:x", 1, "a1", 20, 30, "done")
	w.run("b1", "p2", "i2", "acct:x", 0, "", 10, 20, "done") // touches a1's end and a2's start: no overlap
	w.run("c1", "p2", "i3", "api:y", 0, "", 0, 50, "done")
	w.run("d1", "p1", "i4", "api:y", 0, "", 5, 45, "done")
	w.run("e1", "p2", "i5", "api:y", 0, "", 6, 40, "done")
	w.done("i1", "a1", "a2")
	w.done("i2", "b1")
	w.done("i3", "c1")
	w.done("i4", "d1")
	w.done("i5", "e1")
	rep, v := w.check()
	assert.Empty(t, v)
	assert.Equal(t, 6, rep.Committed)
	assert.Equal(t, 3, rep.MaxByName["api"], "three at once under a gate of 3")
	assert.Equal(t, 1, rep.MaxByName["acct"])
}

// A run of several keys counts under each of them: here it is the second
// holder of acct:x although acct:x is not its first key, and it takes one
// of api:y's three slots.
func TestCheckCountsARunUnderEveryKey(t *testing.T) {
	w := newWorld(t)
	w.run("a1", "p1", "i1", "acct:x", 0, "", 0, 10, "done")
	w.run("b1", "p2", "i2", "api:y,acct:x", 0, "", 9, 20, "done")
	w.run("c1", "p2", "i3", "api:y", 0, "", 0, 30, "done")
	w.done("i1", "a1")
	w.done("i2", "b1")
	w.done("i3", "c1")
	rep, v := w.check()
	require.Len(t, v, 1)
	assert.Contains(t, v[0], "key acct:x ran 2 at once (K = 1)")
	assert.Equal(t, 2, rep.MaxByName["api"])
	assert.Equal(t, 1, rep.SeveralKeyRuns)
}

func TestCheckFindsTwoHoldersOfAK1Key(t *testing.T) {
	w := newWorld(t)
	w.run("a1", "p1", "i1", "acct:x", 0, "", 0, 10, "done")
	w.run("b1", "p2", "i2", "acct:x", 0, "", 9, 20, "done")
	w.done("i1", "a1")
	w.done("i2", "b1")
	rep, v := w.check()
	require.Len(t, v, 1)
	assert.Contains(t, v[0], "acct:x ran 2 at once (K = 1)")
	assert.Equal(t, 1, rep.KViolations)
}

func TestCheckFindsAGateOverItsLimit(t *testing.T) {
	w := newWorld(t)
	for i, tok := range []string{"g1", "g2", "g3", "g4"} {
		w.run(tok, "p1", "i"+tok, "api:y", 0, "", i, 100, "done")
		w.done("i"+tok, tok)
	}
	_, v := w.check()
	assert.Contains(t, joined(v), "api:y ran 4 at once (K = 3)")
}

// A SIGKILLed step has no end line: it counts until its process died, so a
// replacement that started after the death is fine and one that started
// before is a violation.
func TestCheckCountsKilledStepsUntilTheirProcessDied(t *testing.T) {
	w := newWorld(t)
	w.run("k1", "p1", "i1", "acct:x", 0, "", 0, -1, "")
	w.deaths["p1"] = ms(50)
	w.run("r1", "p2", "i1", "acct:x", 0, "", 60, 70, "done") // the row, reclaimed after the death
	w.done("i1", "r1")
	rep, v := w.check()
	assert.Empty(t, v)
	assert.Equal(t, 1, rep.KilledMidStep)

	w.run("x1", "p3", "i2", "acct:x", 0, "", 40, 45, "done") // before p1 died
	w.done("i2", "x1")
	_, v = w.check()
	assert.Contains(t, joined(v), "acct:x ran 2 at once")
}

// A stale step (its lease expired while it ran; the engine discarded its
// outcome and logged it) may overlap its replacement: fences, not the
// admission rules, keep it from committing.
func TestCheckExcludesOnlyTheStaleRun(t *testing.T) {
	w := newWorld(t)
	w.run("s1", "p1", "i1", "acct:x", 0, "", 0, 100, "next")
	w.run("r1", "p2", "i1", "acct:x", 0, "", 50, 60, "done")
	w.done("i1", "r1")
	w.events = append(w.events, logEvent{Proc: "p1", Msg: "stale outcome discarded: the claim was reaped or cancelled", Instance: "i1", Time: time.Unix(0, ms(110))})
	rep, v := w.check()
	assert.Empty(t, v)
	assert.Equal(t, 1, rep.StaleRuns)
	assert.Equal(t, 1, rep.StaleOutcomes)
	assert.Equal(t, 1, rep.StaleOverlapKeys, "counted, the stale run would put acct:x over K")

	w.events = nil // the same overlap without the engine's word that it was stale
	_, v = w.check()
	assert.Contains(t, joined(v), "acct:x ran 2 at once")
	assert.Contains(t, joined(v), "neither committed nor died")
}

// A stale outcome that committed shows as a chain whose run did not
// continue the committed state, and as overlapping committed runs.
func TestCheckFindsAStaleOutcomeThatCommitted(t *testing.T) {
	w := newWorld(t)
	w.run("a1", "p1", "i1", "", 0, "", 0, 10, "next")
	w.run("old", "p1", "i1", "", 1, "a1", 20, 80, "next") // lost its claim, yet committed
	w.run("new", "p2", "i1", "", 1, "a1", 40, 50, "next")
	w.run("a3", "p2", "i1", "", 2, "old", 90, 95, "done")
	w.done("i1", "a1", "old", "a3")
	w.hist = append(w.hist, historyRow{Instance: "i1", Step: "work", Worker: "p2", Outcome: "next",
		Started: time.Unix(0, ms(40)), Finished: time.Unix(0, ms(50))})
	_, v := w.check()
	all := joined(v)
	assert.Contains(t, all, "4 state-carrying outcomes committed, its chain holds 3")
	assert.Contains(t, all, "committed runs overlap")
}

func TestCheckFindsWrongResultsAndLostInstances(t *testing.T) {
	w := newWorld(t)
	w.run("a1", "p1", "i1", "", 0, "", 0, 10, "next")
	w.run("a2", "p1", "i1", "", 0, "", 20, 30, "done") // saw position 0 again: a lost state
	w.done("i1", "a1", "a2")
	w.insts = append(w.insts, instanceRow{ID: "i2", Workflow: ParentWorkflow, Status: "failed", LastError: "boom"})
	w.parents = 3 // i1, i2, and one that never made it to the table
	_, v := w.check()
	all := joined(v)
	assert.Contains(t, all, "saw position 0")
	assert.Contains(t, all, `continued "", not the committed "a1"`)
	assert.Contains(t, all, "ended failed: boom")
	assert.Contains(t, all, "3 parent instances inserted, 2 found")
}

func TestCheckFindsLogProblemsAndCounterDrift(t *testing.T) {
	w := newWorld(t)
	w.restarts = 1
	for range 2 {
		w.events = append(w.events, logEvent{Proc: "p1", Msg: "store unavailable; retrying with backoff until it is back"})
	}
	w.leaks = 3
	w.survivors = map[string]bool{"p2": true}
	w.run("late", "p2", "i9", "", 0, "", 1500, 1510, "done")
	w.done("i9", "late")
	w.counters = []counterRow{{Key: "api:y", Shard: 0, Capacity: 2, Avail: 1}}
	_, v := w.check()
	all := joined(v)
	assert.Contains(t, all, "logged 2 outages for 1 database restarts")
	assert.Contains(t, all, "3 key values found in logs")
	assert.Contains(t, all, "counter of api shard 0: 1 free of 2 with 0 executing")
	assert.Contains(t, all, "process p2 lived through the database restart and logged 0 outages and 0 recoveries")
	assert.NotContains(t, all, "p2 committed no work", "p2 committed a run after the restart")
	w.survivors = map[string]bool{"p1": true}
	_, v = w.check()
	assert.Contains(t, joined(v), "process p1 committed no work after the database came back")
}

func TestRecorderFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	rec, err := OpenRecorder(dir, "p7")
	require.NoError(t, err)
	rec.Start("00112233445566aa", "inst", "acct:"+KeyIDMarker+"1", 2, "work", "", 0)
	rec.End("00112233445566aa", "next")
	rec.Start("00112233445566bb", "inst", "", 0, "joined", "00112233445566aa", 1)
	rec.Bad("00112233445566bb", "something\nodd")
	require.NoError(t, rec.Close())
	f, err := os.OpenFile(filepath.Join(dir, "rec-p7.log"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("S torn")
	require.NoError(t, err)
	require.NoError(t, f.Close())

	recs, err := ReadRecords(dir)
	require.NoError(t, err)
	require.Len(t, recs.Runs, 2)
	a := recs.Runs["00112233445566aa"]
	assert.Equal(t, "p7", a.Proc)
	assert.Equal(t, "acct:"+KeyIDMarker+"1", a.Key)
	assert.Equal(t, 2, a.Attempt)
	assert.Equal(t, "next", a.Label)
	assert.NotZero(t, a.End)
	b := recs.Runs["00112233445566bb"]
	assert.Equal(t, "", b.Key)
	assert.Equal(t, "00112233445566aa", b.Prev)
	assert.Zero(t, b.End, "no end line")
	require.Len(t, recs.Bad, 1)
	assert.Contains(t, recs.Bad[0], "something odd")
	assert.Equal(t, 1, recs.Torn, "the torn line is counted, not parsed")
}

func TestCheckFindsStartsBeyondTheRateLimit(t *testing.T) {
	w := newWorld(t)
	gap := 2000 / BulkRate // ms between starts: half the rate
	for i := range 8 {     // within the burst and the rate
		tok := fmt.Sprintf("r%015d", i)
		w.run(tok, "p1", "i"+tok, "bulk:a", 0, "", i*gap, i*gap+1, "done")
		w.done("i"+tok, tok)
	}
	rep, v := w.check()
	assert.Empty(t, v)
	assert.Equal(t, 8, rep.BulkStarts)

	// More starts within 60 ms than BulkRate × (0.06 s + slack) + BulkBurst.
	over := int(float64(BulkRate)*(0.06+rateSlack.Seconds())) + BulkBurst + 2
	for i := range over {
		tok := fmt.Sprintf("s%015d", i)
		at := 60000 + i*60/over
		w.run(tok, "p2", "i"+tok, "bulk:b", 0, "", at, at+1, "done")
		w.done("i"+tok, tok)
	}
	_, v = w.check()
	assert.Contains(t, joined(v), "bulk steps started within")
}

// TestSettleInserts: an insert whose call failed, and whose first row was
// not found right after, is counted once the run is over, all or nothing:
// a batch found whole was inserted (its COMMIT landed after the call gave
// up), one found nowhere was not, and one found in part is a violation.
func TestSettleInserts(t *testing.T) {
	r := &runner{rep: &Report{}, parents: 5}
	r.rep.Inserted = 5
	r.unsettled = [][]string{{"a1", "a2"}, {"b1", "b2", "b3"}, {"c1", "c2"}}
	insts := []instanceRow{{ID: "a1"}, {ID: "a2"}, {ID: "c2"}, {ID: "other"}}
	r.settleInserts(insts)
	assert.Equal(t, 7, r.parents, "a's two rows counted")
	assert.Equal(t, 7, r.rep.Inserted)
	assert.Equal(t, 1, r.rep.InsertsSettledLate)
	assert.Equal(t, []string{"an insert batch of 2 committed in part: 1 rows found"}, r.failures)
	assert.Empty(t, r.unsettled)
}
