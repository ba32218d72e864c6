package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/godurable/godurable/store"
	"github.com/stretchr/testify/require"
)

// TestClaimReadsNoBacklogItCannotRun: a claim restricted to the workflow
// versions its worker runs does not read the ready rows of another
// workflow, or of another version of its workflow, that stand ahead of its
// own in the queue (a rolling deploy's backlog of a workflow or version no
// running worker registers yet), keyless or keyed, on a table
// analyzed or not, with custom and generic plans: the window's reads of
// the pick indexes remove no row by their filter and read no more rows
// than the window (not every runnable row either), and the claim still
// takes its rows in claim order.
func TestClaimReadsNoBacklogItCannotRun(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	const backlog, runnable, limit = 20_000, 2_000, 40
	ins := make([]store.NewInstance, 0, backlog+runnable)
	add := func(workflow string, version, n int) {
		for i := range n {
			key := ""
			if i%2 == 0 {
				key = fmt.Sprintf("acct:%s-%d-%d", workflow, version, i) // K = 1, one row each: all ready
			}
			ins = append(ins, store.NewInstance{ID: store.NewInstanceID(), Workflow: workflow, Version: version, Queue: "q", Step: "s",
				State: json.RawMessage(`{}`), Key: key})
		}
	}
	// Ahead of every runnable row (inserted first): another workflow's
	// rows and those of the next version of the worker's.
	add("next", 1, backlog/2)
	add("now", 2, backlog/2)
	add("now", 1, runnable)
	_, err := s.Insert(ctx, ins)
	require.NoError(t, err)

	pickScan := regexp.MustCompile(`(?:Bitmap )?Index Scan (?:using|on) (?:instances_pick_free|instances_pick_keyed)\b.* rows=(\d+) loops=1`)
	removed := regexp.MustCompile(`Rows Removed by Filter: (\d+)`)
	check := func(label string) {
		for _, mode := range []string{"auto", "force_generic_plan"} {
			plan := explainAnalyzed(t, s, mode, sqlClaimCandidates,
				[]any{"q", nil, []string{"now", "absent"}, 64, 32, int64(1), []int32{1, 1}}, label)
			text := strings.Join(plan, "\n")
			scans := 0
			for i, l := range plan {
				m := pickScan.FindStringSubmatch(l)
				if m == nil {
					continue
				}
				scans++
				read, _ := strconv.Atoi(m[1])
				require.LessOrEqual(t, read, 64, "%s (%s): the window read more rows than it holds:\n%s", label, mode, text)
				indent := len(l) - len(strings.TrimLeft(l, " ->"))
				for _, d := range plan[i+1:] {
					if len(d)-len(strings.TrimLeft(d, " ")) < indent || strings.Contains(d, "->") {
						break
					}
					if m := removed.FindStringSubmatch(d); m != nil {
						n, _ := strconv.Atoi(m[1])
						require.Zero(t, n, "%s (%s): the window read rows it cannot claim:\n%s", label, mode, text)
					}
				}
			}
			require.Equal(t, 2, scans, "%s (%s): the window reads both pick indexes:\n%s", label, mode, text)
		}
	}
	check("never analyzed")
	_, err = s.pool.Exec(ctx, "ANALYZE "+s.schema+".instances")
	require.NoError(t, err)
	check("analyzed")

	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: limit, Workflows: []store.WorkflowVersion{{Workflow: "now", Version: 1}}})
	require.NoError(t, err)
	var got, want []string
	for _, c := range res.Claimed {
		got = append(got, c.ID)
	}
	for _, in := range ins[backlog : backlog+limit] {
		want = append(want, in.ID)
	}
	require.Equal(t, want, got, "the runnable rows, in claim order")
}

// explainAnalyzed returns the plan of statement sql with args, run under
// EXPLAIN ANALYZE, prepared (so that plan_cache_mode = mode applies) in a
// transaction of its own with sqlNoSeqScan, rolled back.
func explainAnalyzed(t *testing.T, s *Store, mode, sql string, args []any, name string) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }() // the statement may lock rows
	_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, sqlNoSeqScan)
	require.NoError(t, err)
	sd, err := tx.Prepare(ctx, "", "EXPLAIN (ANALYZE, COSTS OFF) "+s.q(sql))
	require.NoError(t, err, name)
	rows, err := tx.Query(ctx, sd.SQL, args...)
	require.NoError(t, err, name)
	return planLines(t, rows, name)
}
