package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/godurable/godurable/store"
)

// healthReport is the JSON form of `durable health`: the store's Health
// (see store.Health for every field) and the time it was taken.
type healthReport struct {
	At time.Time `json:"at"`
	store.Health
	// Schedules are the stored schedules: next fire time, paused, late.
	Schedules []store.ScheduleHealth `json:"schedules"`
	// UnworkedQueues are the queues nobody works (see store.UnworkedQueues).
	UnworkedQueues []store.UnworkedQueue `json:"unworked_queues"`
	// PausedQueues are the paused queues with their waiting rows (see
	// store.PausedQueues).
	PausedQueues []store.PausedQueue `json:"paused_queues"`
}

// health prints queue and gate pressure and the prefix-capture warnings.
func health(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON (the fields of store.Health, and at)")
	if _, err := parse(fs, args, 0, 0, ""); err != nil {
		return err
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	defer closeStore()
	now := time.Now().UTC().Truncate(time.Microsecond)
	h, err := st.Health(ctx, now)
	if err != nil {
		return err
	}
	scs, err := st.ListSchedules(ctx)
	if err != nil {
		return err
	}
	sh := store.SchedulesHealth(scs, now)
	worked, err := st.WorkedQueues(ctx, now)
	if err != nil {
		return err
	}
	unworked := store.UnworkedQueues(h.Queues, worked)
	pauses, err := st.PausedQueues(ctx)
	if err != nil {
		return err
	}
	paused := store.PausedQueues(h.Queues, pauses)
	if *asJSON {
		return writeJSON(stdout, healthReport{At: now, Health: h, Schedules: sh, UnworkedQueues: unworked, PausedQueues: paused})
	}
	printHealth(stdout, h)
	printUnworked(stdout, unworked, now, db)
	printPaused(stdout, paused, now, db)
	if len(scs) > 0 {
		fmt.Fprintln(stdout)
		printSchedules(stdout, scs, sh, now)
	}
	return nil
}

// failedCount is a queue's failed rows as Health counts them: up to
// store.HealthScanLimit, with a "+" when the queue has more.
func failedCount(q store.QueueHealth) string {
	if q.FailedCapped {
		return fmt.Sprintf("%d+", q.Failed)
	}
	return fmt.Sprint(q.Failed)
}

func printHealth(w io.Writer, h store.Health) {
	tw := table(w)
	fmt.Fprintln(tw, "QUEUE\tREADY\tSCHEDULED\tBLOCKED\tEXECUTING\tAWAITING\tFAILED\tOLDEST READY\tACTIVE/MAX")
	for _, q := range h.Queues {
		maxActive := "-"
		if q.MaxActive > 0 {
			maxActive = fmt.Sprint(q.MaxActive)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%d/%s\n", q.Queue, q.Ready, q.Scheduled, q.Blocked,
			q.Executing, q.Awaiting, failedCount(q), age(q.OldestReady), q.Active, maxActive)
	}
	if len(h.Queues) == 0 {
		fmt.Fprintln(tw, "(no live rows)")
	}
	tw.Flush()

	printPolicies(w, h.Queues)

	fmt.Fprintln(w)
	tw = table(w)
	fmt.Fprintln(tw, "GATE\tLIMIT\tSHARDS\tACTIVE\tBLOCKED\tSATURATED KEYS\tHIGHEST KEY ACTIVE")
	for _, g := range h.Gates {
		sat := fmt.Sprint(g.SaturatedKeys)
		if g.SaturatedKeysCapped {
			sat += "+"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%d\n", g.Name, g.Limit, g.Shards, g.Active, g.BlockedReady, sat, g.HighestKeyActive)
	}
	if len(h.Gates) == 0 {
		fmt.Fprintln(tw, "(no limits configured: every key runs at K = 1)")
	}
	tw.Flush()

	if len(h.BlockedBy) > 0 {
		fmt.Fprintln(w)
		tw = table(w)
		fmt.Fprintln(tw, "BLOCKED ON KEY NAME\tROWS")
		for _, b := range h.BlockedBy {
			fmt.Fprintf(tw, "%s\t%d\n", b.Name, b.Count)
		}
		tw.Flush()
		fmt.Fprintln(w, "  a row of several keys counts under the key that blocked it; `durable explain KEY` says why a key's rows wait")
	}

	if len(h.RateLimits) > 0 {
		fmt.Fprintln(w)
		tw = table(w)
		fmt.Fprintln(tw, "RATE LIMIT	RATE	BURST	SCOPE	BUCKETS	EMPTY (THROTTLED)")
		for _, r := range h.RateLimits {
			scope, buckets, empty := "name", fmt.Sprint(r.Buckets), fmt.Sprint(r.EmptyBuckets)
			if r.Limit.PerKey {
				scope = "key"
			}
			if r.BucketsCapped {
				buckets, empty = buckets+"+", empty+"+"
			}
			fmt.Fprintf(tw, "%s	%d per %s	%d	%s	%s	%s\n", r.Limit.Name, r.Limit.Limit, r.Limit.Period, r.Limit.Burst, scope, buckets, empty)
		}
		tw.Flush()
	}

	if len(h.HandedBack) > 0 {
		fmt.Fprintln(w)
		tw = table(w)
		fmt.Fprintln(tw, "HANDED BACK\tVERSION\tINSTANCES")
		for i, hb := range h.HandedBack {
			n := fmt.Sprint(hb.Count)
			if h.HandedBackCapped && i == len(h.HandedBack)-1 {
				n += "+"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\n", hb.Workflow, hb.Version, n)
		}
		tw.Flush()
		fmt.Fprintln(w, "  the workers that claimed these run that workflow version without the step these are at")
		fmt.Fprintln(w, "  (rows of a version no running worker registers are not claimed, and are counted as ready);")
		fmt.Fprintln(w, "  they wait, aged in OLDEST READY, until a worker that does runs them")
	}

	printSnapshot(w, h.OldestSnapshot)

	fmt.Fprintln(w)
	if len(h.Warnings) == 0 {
		fmt.Fprintln(w, "warnings: none")
		return
	}
	fmt.Fprintln(w, "WARNINGS")
	for _, wn := range h.Warnings {
		fmt.Fprintf(w, "  %s %s: %s\n", wn.Kind, wn.Name, wn.Message)
	}
}

// printSnapshot prints the oldest snapshot kept alive in the database, if
// any, and a note on claims once it is old (store.SnapshotHealth.Old).
func printSnapshot(w io.Writer, s store.SnapshotHealth) {
	if s.Holder == "" {
		return
	}
	open := "open for an unknown time"
	if s.Open > 0 {
		open = "open " + age(s.Open)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "oldest snapshot: %s, %s, %d transactions ago\n", s.Holder, open, s.Transactions)
	if s.Old() {
		fmt.Fprintln(w, "  claims read past the rows changed since it was taken and slow down until it ends (README, Operating it)")
	}
}

// printPolicies prints the pressure of each queue policy (nothing when no
// queue has one): its MaxActive, active rows, the ready rows a full
// MaxActive holds back (bounded: ">100" when store.BlockedReadyLimit rows
// were counted),
// its MaxActivePerKey and the keys at that budget with work waiting.
func printPolicies(w io.Writer, queues []store.QueueHealth) {
	var tw *tabwriter.Writer
	for _, q := range queues {
		if q.MaxActive == 0 {
			continue
		}
		if tw == nil {
			fmt.Fprintln(w)
			tw = table(w)
			fmt.Fprintln(tw, "POLICY\tMAX ACTIVE\tACTIVE\tBLOCKED READY\tMAX PER KEY\tSATURATED KEYS")
		}
		blocked := fmt.Sprint(q.BlockedReady)
		if q.BlockedReady >= store.BlockedReadyLimit {
			blocked = fmt.Sprintf(">%d", store.BlockedReadyLimit-1)
		}
		perKey, sat := "-", "-"
		if q.MaxActivePerKey > 0 {
			perKey, sat = fmt.Sprint(q.MaxActivePerKey), fmt.Sprint(q.SaturatedKeys)
			if q.SaturatedKeysCapped {
				sat += "+"
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", q.Queue, q.MaxActive, q.Active, blocked, perKey, sat)
	}
	if tw != nil {
		tw.Flush()
	}
}

// printUnworked prints the queues nobody works (nothing when there are
// none), each with the command that lists its waiting rows.
func printUnworked(w io.Writer, qs []store.UnworkedQueue, now time.Time, db *dbFlags) {
	if len(qs) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "QUEUES NOBODY WORKS: no engine has claimed from them in the last %s; their rows wait until an engine\n", store.QueueWorkedWithin)
	fmt.Fprintln(w, "whose Config.Queues has the queue runs")
	tw := table(w)
	fmt.Fprintln(tw, "  QUEUE\tREADY\tSCHEDULED\tBLOCKED\tOLDEST READY\tLAST WORKED")
	for _, q := range qs {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%s\t%s\n", q.Queue, q.Ready, q.Scheduled, q.Blocked, age(q.OldestReady), lastWorked(q.LastWorked, now))
	}
	tw.Flush()
	for _, q := range qs {
		fmt.Fprintf(w, "  list %s's rows: %s\n", q.Queue, db.command("ls", "-queue", q.Queue))
	}
}

// lastWorked is when an engine last worked a queue, or "never".
func lastWorked(t *time.Time, now time.Time) string {
	if t == nil {
		return "never"
	}
	return when(*t, now)
}

// printPaused prints the paused queues (nothing when there are none), each
// with its waiting rows and the command that resumes it.
func printPaused(w io.Writer, qs []store.PausedQueue, now time.Time, db *dbFlags) {
	if len(qs) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "PAUSED QUEUES: no engine starts a step of them; their rows wait for a resume")
	tw := table(w)
	fmt.Fprintln(tw, "  QUEUE\tPAUSED\tREADY\tSCHEDULED\tBLOCKED\tSTILL RUNNING\tOLDEST READY")
	for _, q := range qs {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%d\t%d\t%s\n", q.Queue, when(q.PausedAt, now), q.Ready, q.Scheduled, q.Blocked, q.Executing, age(q.OldestReady))
	}
	tw.Flush()
	for _, q := range qs {
		fmt.Fprintf(w, "  resume %s: %s\n", q.Queue, db.command("queues", "resume", q.Queue))
	}
}
