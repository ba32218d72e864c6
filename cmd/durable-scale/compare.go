package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/transitions"
)

// absent is a workflow no engine of a drain registers: with the next
// version of workflowA, the backlog a rolling deploy leaves at the head of
// a queue.
const absent = "absent"

// A drain runs -drain-rows instances of one kind, inserted before the
// fleet starts, with -engines engine processes, and measures the fleet's
// rate between 10 % and 90 % of the rows done (so that neither the
// fleet's start nor its last rows count). The engines count their steps
// themselves (-progress), so that following a drain reads nothing from
// the table.
type drainCase struct {
	name   string
	schema string
	keyed  bool // each row with its own K = 1 key (gate.Identity("acct", i))
	empty  bool // the schema's instances are deleted before the drain
	absent int  // rows no engine runs inserted first, at the head (see drain)
}

// compare runs the drains of -compare: plain and keyed rows on an empty
// table and on one holding -rows terminal rows, and plain rows behind a
// backlog no engine runs, each -rounds times,
// the cases alternating within a round; it prints each drain's rate and
// the ratios of the cases' medians.
func compare(ctx context.Context, o options) error {
	url, done, err := prepare(ctx, &o)
	if err != nil {
		return err
	}
	defer done()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	base := fmt.Sprintf("scale_%d", time.Now().Unix())
	empty, big, behind := base+"_empty", base+"_big", base+"_behind"
	for _, s := range []string{empty, big, behind} {
		if _, err := postgres.Migrate(ctx, pool, s); err != nil {
			return err
		}
	}
	fmt.Printf("durable-scale -compare: schemas %s_{empty,big,behind}, logs in %s\n", base, o.dir)
	t0 := time.Now()
	if err := loadTerminal(ctx, pool, big, o.rows, 0, 0); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf("VACUUM ANALYZE %s.instances", big)); err != nil {
		return err
	}
	fmt.Printf("loaded %d terminal rows into %s and vacuumed them in %v\n", o.rows, big, time.Since(t0).Round(time.Second))

	cases := []drainCase{
		{name: "plain, empty table", schema: empty, empty: true},
		{name: "plain, " + millions(o.rows) + " rows", schema: big},
		{name: fmt.Sprintf("plain behind %d rows no engine runs", o.absentRows), schema: behind, empty: true, absent: o.absentRows},
		{name: "keyed, empty table", schema: empty, keyed: true, empty: true},
		{name: "keyed, " + millions(o.rows) + " rows", schema: big, keyed: true},
	}
	rates := make([][]float64, len(cases))
	fmt.Printf("%d rows a drain, %d engines of %d executors, steps of %v; a keyed row has its own K = 1 key\n",
		o.drainRows, o.engines, o.executors, o.step)
	for round := range o.rounds {
		for i, c := range cases {
			r, err := drain(ctx, pool, url, c, o)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			rates[i] = append(rates[i], r)
			fmt.Printf("  round %d  %-48s %8.0f rows/s\n", round+1, c.name, r)
		}
	}
	med := make([]float64, len(cases))
	for i := range cases {
		med[i] = median(rates[i])
	}
	fmt.Println("medians and ratios:")
	for i, c := range cases {
		fmt.Printf("  %-48s %8.0f rows/s\n", c.name, med[i])
	}
	fmt.Printf("  plain at %s rows / empty:          %.2f×\n", millions(o.rows), med[1]/med[0])
	fmt.Printf("  keyed at %s rows / empty:          %.2f×\n", millions(o.rows), med[4]/med[3])
	fmt.Printf("  keyed / plain, empty table:      %.2f×\n", med[3]/med[0])
	fmt.Printf("  keyed / plain, %s rows:          %.2f×\n", millions(o.rows), med[4]/med[1])
	fmt.Printf("  plain behind a backlog no engine runs / plain: %.2f×\n", med[2]/med[0])
	return nil
}

// drain runs one drain of c (see drainCase) and returns its rate.
func drain(ctx context.Context, pool *pgxpool.Pool, url string, c drainCase, o options) (float64, error) {
	if c.empty {
		if _, err := pool.Exec(ctx, fmt.Sprintf("TRUNCATE %s.instances CASCADE", c.schema)); err != nil {
			return 0, err
		}
	}
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: c.schema})
	if err != nil {
		return 0, err
	}
	ctl, err := durable.New(durable.Config{Store: st, WorkerID: "scale-controller"})
	if err != nil {
		return 0, err
	}
	defs := workflows(o.step, true, nil)
	defs = append(defs, durable.NewWorkflow[struct{}](absent, "run", durable.WorkflowOptions{}).
		Step("run", func(steps.Context, struct{}) (transitions.Transition, error) { return transitions.Done(true), nil }))
	if err := ctl.Register(defs...); err != nil {
		return 0, err
	}
	// The backlog no engine runs: half of it a workflow none registers,
	// half the next version of the one they run, inserted by an engine
	// that registers that version as its latest.
	next, err := durable.New(durable.Config{Store: st, WorkerID: "scale-next-version"})
	if err != nil {
		return 0, err
	}
	if err := next.Register(durable.NewWorkflow[struct{}](workflowA, "run", durable.WorkflowOptions{Version: 2}).
		Step("run", func(steps.Context, struct{}) (transitions.Transition, error) { return transitions.Done(true), nil })); err != nil {
		return 0, err
	}
	if err := insertMany(ctx, ctl, c.absent/2, func(int) durable.InsertRequest {
		return durable.InsertRequest{Workflow: absent, State: struct{}{}}
	}); err != nil {
		return 0, err
	}
	if err := insertMany(ctx, next, c.absent-c.absent/2, func(int) durable.InsertRequest {
		return durable.InsertRequest{Workflow: workflowA, State: struct{}{}}
	}); err != nil {
		return 0, err
	}
	// A fresh key range per drain, so that a keyed drain on the table that
	// keeps its rows never meets the keys of the one before.
	keyBase := time.Now().UnixNano()
	if err := insertMany(ctx, ctl, o.drainRows, func(i int) durable.InsertRequest {
		r := durable.InsertRequest{Workflow: workflowA, State: struct{}{}}
		if c.keyed {
			r.Options.Key = gate.Identity("acct", fmt.Sprintf("%d-%d", keyBase, i))
		}
		return r
	}); err != nil {
		return 0, err
	}

	var (
		mu       sync.Mutex
		counts   = make([]int64, o.engines)
		t10, t90 time.Time
		finished = make(chan struct{})
	)
	total := int64(o.drainRows)
	record := func(i int, n int64) {
		mu.Lock()
		defer mu.Unlock()
		counts[i] = n
		var sum int64
		for _, x := range counts {
			sum += x
		}
		now := time.Now()
		if t10.IsZero() && sum*10 >= total {
			t10 = now
		}
		if t90.IsZero() && sum*10 >= total*9 {
			t90 = now
		}
		if sum >= total {
			select {
			case <-finished:
			default:
				close(finished)
			}
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			_ = p.Wait()
		}
	}()
	for i := range o.engines {
		cmd := exec.Command(exe, append(workerArgs(url, c.schema, fmt.Sprintf("drain-%d", i), o.executors, o.step, true), "-progress")...)
		logf, err := os.OpenFile(filepath.Join(o.dir, fmt.Sprintf("drain-engine-%d.log", i)), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return 0, err
		}
		defer logf.Close()
		cmd.Stderr = logf
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		procs = append(procs, cmd)
		go func() {
			s := bufio.NewScanner(out)
			for s.Scan() {
				if n, ok := strings.CutPrefix(s.Text(), "progress "); ok {
					if v, err := strconv.ParseInt(n, 10, 64); err == nil {
						record(i, v)
					}
				}
			}
		}()
	}
	select {
	case <-finished:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(o.drainTimeout):
		return 0, fmt.Errorf("not drained after %v", o.drainTimeout)
	}
	mu.Lock()
	defer mu.Unlock()
	return float64(total*8/10) / t90.Sub(t10).Seconds(), nil
}

// insertMany inserts n requests made by req in batches.
func insertMany(ctx context.Context, ctl *durable.Engine, n int, req func(i int) durable.InsertRequest) error {
	const batch = 5_000
	reqs := make([]durable.InsertRequest, 0, batch)
	for i := range n {
		reqs = append(reqs, req(i))
		if len(reqs) == batch || i == n-1 {
			if _, err := ctl.InsertMany(ctx, reqs); err != nil {
				return err
			}
			reqs = reqs[:0]
		}
	}
	return nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func millions(n int) string {
	if n >= 1_000_000 && n%100_000 == 0 {
		return strconv.FormatFloat(float64(n)/1e6, 'f', -1, 64) + "M"
	}
	return strconv.Itoa(n)
}
