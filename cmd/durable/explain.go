package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
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
		// A holder of several keys shows the others in a last column,
		// there only when one does.
		others := slices.ContainsFunc(x.Holders, func(h explain.Holder) bool { return len(h.OtherKeys) > 0 })
		tw := table(w)
		header := "  INSTANCE\tWORKFLOW\tSTEP\tATTEMPT\tWORKER\tSINCE\tLEASE EXPIRES"
		if others {
			header += "\tALSO HOLDS"
		}
		fmt.Fprintln(tw, header)
		for _, h := range x.Holders {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\t%s", h.ID, h.Workflow, h.Step, h.Attempt, h.Worker,
				when(h.Since, x.At), when(h.LeaseExpiresAt, x.At))
			if others {
				fmt.Fprintf(tw, "\t%s", orDash(strings.Join(h.OtherKeys, ",")))
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "waiting: %d (%d blocked)", x.Waiting.Count, x.Waiting.Blocked)
	if n := x.Waiting.Elsewhere; n > 0 {
		fmt.Fprintf(w, "; %d more that also need %s wait for another of their keys", n, x.Key)
	}
	fmt.Fprintln(w)
	if o := x.Waiting.Oldest; o != nil {
		fmt.Fprintf(w, "  oldest:       %s %s/%s, %s, waiting since %s%s\n", o.ID, o.Workflow, o.Step, o.Status, when(o.RunAt, x.At), waiterKeys(o))
	}
	if n := x.Waiting.Next; n != nil {
		fmt.Fprintf(w, "  next in line: %s %s/%s, %s, priority %d, queue %s%s\n", n.ID, n.Workflow, n.Step, n.Status, n.Priority, n.Queue, waiterKeys(n))
	}
	if on := x.Waiting.ElsewhereOn; len(on) > 0 {
		parts := make([]string, len(on))
		for i, c := range on {
			parts[i] = fmt.Sprintf("%s (%d)", c.Key, c.Count)
		}
		fmt.Fprintf(w, "  elsewhere:    blocked on %s\n", strings.Join(parts, ", "))
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

// waiterKeys is what a waiter of several keys adds to its line: its other
// keys and, blocked, the key it waits for ("" for a row of one key).
func waiterKeys(v *explain.Waiter) string {
	if len(v.OtherKeys) == 0 {
		return ""
	}
	s := ", also needs " + strings.Join(v.OtherKeys, ",")
	if v.BlockedOn != "" {
		s += ", blocked on " + v.BlockedOn
	}
	return s
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
