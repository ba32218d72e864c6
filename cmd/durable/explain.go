package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/explain"
)

// explanation is the JSON form of `durable explain -json`.
type (
	explanation = explain.Explanation
	limitCheck  = explain.LimitCheck
)

// explainCmd prints who holds a key's slots, who waits and why.
func explainCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, 1, 0, "KEY")
	if err != nil {
		return err
	}
	key := pos[0]
	if k, err := gate.Parse(key); err != nil || k.IsZero() {
		return usagef("explain: %q is not a concurrency key: want name:id (for example account:42)", key)
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("explain: %w", err)
	}
	defer closeStore()
	x, err := explain.Key(ctx, st, key, time.Now().UTC())
	if err != nil {
		return fmt.Errorf("explain: %w", err)
	}
	if *asJSON {
		return writeJSON(stdout, x)
	}
	printExplanation(stdout, x)
	return nil
}

func printExplanation(w io.Writer, x explanation) {
	fmt.Fprintf(w, "key %s (name %q)\n\n", x.Key, x.Name)
	if len(x.Holders) == 0 {
		fmt.Fprintln(w, "holders: none")
	} else {
		fmt.Fprintf(w, "holders: %d\n", len(x.Holders))
		tw := table(w)
		fmt.Fprintln(tw, "  INSTANCE\tWORKFLOW\tSTEP\tATTEMPT\tWORKER\tSINCE\tLEASE EXPIRES")
		for _, h := range x.Holders {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\t%s\n", h.ID, h.Workflow, h.Step, h.Attempt, h.Worker,
				when(h.Since, x.At), when(h.LeaseExpiresAt, x.At))
		}
		tw.Flush()
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "waiting: %d (%d blocked)\n", x.Waiting.Count, x.Waiting.Blocked)
	if o := x.Waiting.Oldest; o != nil {
		fmt.Fprintf(w, "  oldest:       %s %s/%s, %s, waiting since %s\n", o.ID, o.Workflow, o.Step, o.Status, when(o.RunAt, x.At))
	}
	if n := x.Waiting.Next; n != nil {
		fmt.Fprintf(w, "  next in line: %s %s/%s, %s, priority %d, queue %s\n", n.ID, n.Workflow, n.Step, n.Status, n.Priority, n.Queue)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "limits:")
	tw := table(w)
	for _, l := range x.Limits {
		use, state := "-", "not configured"
		if l.Applies {
			use = fmt.Sprintf("%d/%d in use", l.InUse, l.Limit)
			state = "ok"
		}
		if l.Blocking {
			state = "BLOCKING"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", l.Kind, use, state, l.Detail)
	}
	tw.Flush()
	fmt.Fprintln(w)
	blocking := x.Blocking
	if blocking == "" {
		blocking = "none"
	}
	fmt.Fprintf(w, "blocking now: %s\n%s\n", blocking, wrap(x.Verdict, 100))
}

// wrap breaks s into lines of at most width characters at spaces.
func wrap(s string, width int) string {
	var b strings.Builder
	line := 0
	for i, word := range strings.Fields(s) {
		if i > 0 {
			if line+1+len(word) > width {
				b.WriteByte('\n')
				line = 0
			} else {
				b.WriteByte(' ')
				line++
			}
		}
		b.WriteString(word)
		line += len(word)
	}
	return b.String()
}
