package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/godurable/godurable/store"
)

// queues dispatches `queues ls`, `queues pause QUEUE` and `queues resume
// QUEUE`. A pause is stored, so it holds fleet-wide, for engines started
// later and across restarts, until a resume.
func queues(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("queues: want a subcommand: ls, pause QUEUE or resume QUEUE")
	}
	switch args[0] {
	case "ls":
		return queuesList(ctx, args[1:], stdout, stderr)
	case "pause":
		return queuePause(ctx, "queues pause", true, args[1:], stdout, stderr)
	case "resume":
		return queuePause(ctx, "queues resume", false, args[1:], stdout, stderr)
	default:
		return usagef("queues: unknown subcommand %q: want ls, pause QUEUE or resume QUEUE", args[0])
	}
}

// queueEntry is one queue of `queues ls -json`: its health (zero counts
// for a paused queue without rows) and its pause.
type queueEntry struct {
	store.QueueHealth
	Paused   bool       `json:"paused"`
	PausedAt *time.Time `json:"paused_at"`
}

func queuesList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("queues ls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON (per queue: store.QueueHealth, paused and paused_at)")
	if _, err := parse(fs, args, 0, 0, ""); err != nil {
		return err
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("queues ls: %w", err)
	}
	defer closeStore()
	now := time.Now().UTC().Truncate(time.Microsecond)
	h, err := st.Health(ctx, now)
	if err != nil {
		return fmt.Errorf("queues ls: %w", err)
	}
	paused, err := st.PausedQueues(ctx)
	if err != nil {
		return fmt.Errorf("queues ls: %w", err)
	}
	entries := queueEntries(h.Queues, paused)
	if *asJSON {
		return writeJSON(stdout, entries)
	}
	if len(entries) == 0 {
		fmt.Fprintln(stdout, "no queues (a queue is listed once it has live rows, a policy or a pause)")
		return nil
	}
	tw := table(stdout)
	fmt.Fprintln(tw, "QUEUE\tSTATE\tREADY\tSCHEDULED\tBLOCKED\tEXECUTING\tAWAITING\tFAILED\tOLDEST READY")
	for _, q := range entries {
		state := "active"
		if q.Paused {
			state = "paused " + when(*q.PausedAt, now)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", q.Queue, state, q.Ready, q.Scheduled, q.Blocked,
			q.Executing, q.Awaiting, failedCount(q.QueueHealth), age(q.OldestReady))
	}
	tw.Flush()
	for _, q := range entries {
		if q.Paused {
			fmt.Fprintf(stdout, "resume %s: %s\n", q.Queue, db.command("queues", "resume", q.Queue))
		}
	}
	return nil
}

// queueEntries merges the queues of Health with the paused ones, sorted by
// queue.
func queueEntries(qs []store.QueueHealth, paused []store.QueuePause) []queueEntry {
	at := map[string]time.Time{}
	for _, p := range paused {
		at[p.Queue] = p.PausedAt
	}
	out := []queueEntry{}
	seen := map[string]bool{}
	add := func(q store.QueueHealth) {
		e := queueEntry{QueueHealth: q}
		if t, ok := at[q.Queue]; ok {
			e.Paused, e.PausedAt = true, &t
		}
		seen[q.Queue] = true
		out = append(out, e)
	}
	for _, q := range qs {
		add(q)
	}
	for _, p := range paused {
		if !seen[p.Queue] {
			add(store.QueueHealth{Queue: p.Queue})
		}
	}
	slices.SortFunc(out, func(a, b queueEntry) int { return strings.Compare(a.Queue, b.Queue) })
	return out
}

func queuePause(ctx context.Context, name string, paused bool, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	pos, err := parse(fs, args, 1, 0, "QUEUE")
	if err != nil {
		return err
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer closeStore()
	q := pos[0]
	changed, err := st.PauseQueue(ctx, q, paused, time.Time{})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	switch {
	case paused && !changed:
		fmt.Fprintf(stdout, "queue %q was paused already; resume it with `%s`\n", q, db.command("queues", "resume", q))
	case paused:
		fmt.Fprintf(stdout, "queue %q paused: engines start no step of it from their next claim (steps running now finish);\n"+
			"its rows wait, listed by `%s`; resume it with `%s`\n", q, db.command("queues", "ls"), db.command("queues", "resume", q))
	case !changed:
		fmt.Fprintf(stdout, "queue %q was not paused\n", q)
	default:
		fmt.Fprintf(stdout, "queue %q resumed: engines claim its rows again from their next claim\n", q)
	}
	return nil
}
