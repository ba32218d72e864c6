package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/transitions"
)

var statuses = []store.Status{store.StatusReady, store.StatusBlocked, store.StatusExecuting, store.StatusAwaiting,
	store.StatusChildren, store.StatusDone, store.StatusFailed, store.StatusCanceled}

// list prints instances matching the filters, one page at a time.
func list(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	var f store.ListFilter
	var status string
	fs.StringVar(&f.Workflow, "workflow", "", "only instances of this workflow")
	fs.StringVar(&status, "status", "", "only instances in this status (ready includes scheduled rows)")
	fs.StringVar(&f.Key, "key", "", "only instances holding this concurrency key (name:id)")
	fs.StringVar(&f.Queue, "queue", "", "only instances on this queue")
	fs.StringVar(&f.AfterID, "after", "", "page: only instances inserted before this one (the last id of the previous page)")
	fs.IntVar(&f.Limit, "limit", 50, "page size")
	fs.IntVar(&f.ScanLimit, "scan", 10_000, "with a filter, the most instances one page looks at (0: no bound; a rare key, queue or status otherwise reads the table)")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args, 0, 0, ""); err != nil {
		return err
	}
	if status != "" {
		f.Status = store.Status(status)
		if !slices.Contains(statuses, f.Status) {
			return usagef("ls: unknown status %q: want one of %v", status, statuses)
		}
	}
	if f.Limit < 1 {
		return usagef("ls: -limit must be at least 1")
	}
	if f.ScanLimit < 0 {
		return usagef("ls: -scan must be 0 or more")
	}
	if f.Workflow == "" && f.Status == "" && f.Key == "" && f.Queue == "" {
		f.ScanLimit = 0 // unfiltered: every row matches, a page reads a page
	}
	if f.AfterID != "" {
		if err := checkID("ls: -after", f.AfterID); err != nil {
			return err
		}
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("ls: %w", err)
	}
	defer closeStore()
	// Newest first by id (time-ordered, see store.NewInstanceID), which
	// never changes, so that pages neither repeat nor skip rows while
	// instances change status.
	f.Newest = true
	// One more than the page tells whether there is a next page.
	page := f
	page.Limit = f.Limit + 1
	p, err := st.ListPage(ctx, page)
	if err != nil {
		return fmt.Errorf("ls: %w", err)
	}
	ins := p.Rows
	next := ""
	switch {
	case len(ins) > f.Limit:
		ins = ins[:f.Limit]
		next = ins[len(ins)-1].ID
	case p.ScanStopped:
		next = p.Next
	}
	if *asJSON {
		out := struct {
			Instances []instanceView `json:"instances"`
			// Next is the -after of the next page ("" on the last page).
			Next string `json:"next_after"`
			// ScanStopped is true when the page stopped after looking at
			// -scan instances: older ones may match past next_after.
			ScanStopped bool `json:"scan_stopped"`
		}{Instances: []instanceView{}, Next: next, ScanStopped: p.ScanStopped && len(p.Rows) <= f.Limit}
		for _, in := range ins {
			out.Instances = append(out.Instances, viewOf(in))
		}
		return writeJSON(stdout, out)
	}
	printList(stdout, ins, time.Now())
	stopped := p.ScanStopped && len(p.Rows) <= f.Limit
	switch {
	case stopped:
		if len(ins) == 0 {
			fmt.Fprintln(stdout, "(no instances match among these)")
		}
		fmt.Fprintf(stdout, "looked at %d instances; older ones may match: %s\n", f.ScanLimit, db.command(pageArgs(f, next)...))
	case len(ins) == 0:
		fmt.Fprintln(stdout, "(no instances match)")
	case next != "":
		fmt.Fprintf(stdout, "more: %s\n", db.command(pageArgs(f, next)...))
	}
	return nil
}

// printList prints a page of instances as a table. KEY lists every key of
// a row (comma-separated, its first key first); a page holding a blocked
// row of several keys gets a last column, BLOCKED ON, the key each such
// row waits for.
func printList(w io.Writer, ins []store.Instance, now time.Time) {
	blockedOn := slices.ContainsFunc(ins, func(in store.Instance) bool { return blockedOnText(in) != "-" })
	tw := table(w)
	header := "ID\tSTATUS\tWORKFLOW\tSTEP\tATTEMPT\tQUEUE\tKEY\tUPDATED"
	if blockedOn {
		header += "\tBLOCKED ON"
	}
	fmt.Fprintln(tw, header)
	for _, in := range ins {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s", in.ID, in.Status, in.Workflow, in.Step, in.Attempt,
			in.Queue, keyColumn(in.KeyList()), age(now.Sub(in.UpdatedAt))+" ago")
		if blockedOn {
			fmt.Fprintf(tw, "\t%s", blockedOnText(in))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// pageArgs is the ls command line of the page after next: f's filters
// and page size, and -after next.
func pageArgs(f store.ListFilter, next string) []string {
	args := []string{"ls"}
	for _, kv := range [][2]string{{"workflow", f.Workflow}, {"status", string(f.Status)}, {"key", f.Key}, {"queue", f.Queue}} {
		if kv[1] != "" {
			args = append(args, "-"+kv[0], kv[1])
		}
	}
	if f.Limit != 50 {
		args = append(args, "-limit", fmt.Sprint(f.Limit))
	}
	if f.ScanLimit != 10_000 && (f.Workflow != "" || f.Status != "" || f.Key != "" || f.Queue != "") {
		args = append(args, "-scan", fmt.Sprint(f.ScanLimit))
	}
	return append(args, "-after", next)
}

// showReport is the JSON form of `durable show`.
type showReport struct {
	Instance instanceView  `json:"instance"`
	History  []historyView `json:"history"`
}

// show prints one instance and the step runs recorded for it.
func show(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("show", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, 1, 0, "ID")
	if err != nil {
		return err
	}
	id := pos[0]
	if err := checkID("show", id); err != nil {
		return err
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("show: %w", err)
	}
	defer closeStore()
	in, err := st.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("show: %w", explainErr(id, err))
	}
	hist, err := st.History(ctx, id)
	if err != nil {
		return fmt.Errorf("show: %w", err)
	}
	if *asJSON {
		rep := showReport{Instance: viewOf(in), History: []historyView{}}
		for _, h := range hist {
			var started, finished *time.Time
			if !h.StartedAt.IsZero() {
				started = &h.StartedAt
			}
			if !h.FinishedAt.IsZero() {
				finished = &h.FinishedAt
			}
			rep.History = append(rep.History, historyView{Step: h.Step, Attempt: h.Attempt, Key: h.Key, Also: append([]string{}, h.Also...), Worker: h.Worker,
				StartedAt: started, FinishedAt: finished, Outcome: h.Outcome, Error: h.Error})
		}
		return writeJSON(stdout, rep)
	}
	printInstance(stdout, in, hist, time.Now())
	return nil
}

// printInstance prints one instance and its history, as `durable show`
// does. A row of one key prints it as "key"; a row of several prints them
// all as "keys", each with its intent (and, executing, the shard it
// holds), and when blocked the key it waits for as "blocked on".
func printInstance(stdout io.Writer, in store.Instance, hist []store.HistoryEntry, now time.Time) {
	tw := table(stdout)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("id", in.ID)
	row("workflow", fmt.Sprintf("%s (version %d)", in.Workflow, in.Version))
	row("status", string(in.Status))
	row("step", in.Step)
	row("attempt", fmt.Sprint(in.Attempt))
	row("queue", fmt.Sprintf("%s (priority %d)", in.Queue, in.Priority))
	if len(in.Also) == 0 {
		key := orDash(in.Key)
		if in.KeyIntent != "" {
			key += fmt.Sprintf(" (%s)", in.KeyIntent)
		}
		row("key", key)
	} else {
		row("keys", severalKeysText(in))
		if in.Status == store.StatusBlocked {
			row("blocked on", fmt.Sprintf("%s: it runs once %s has room, and each of its other keys too", orDash(in.BlockedOn), orDash(in.BlockedOn)))
		}
	}
	switch in.Status {
	case store.StatusReady, store.StatusBlocked:
		row("run at", when(in.RunAt, now))
		if !in.ReadySince.IsZero() {
			row("handed back", fmt.Sprintf("waiting since %s: the workers that claimed it run %s version %d "+
				"without its step %s; deploy one that has it", when(in.ReadySince, now), in.Workflow, in.Version, in.Step))
		}
	case store.StatusExecuting:
		row("worker", in.Worker)
		row("started", when(in.StartedAt, now))
		row("lease expires", when(in.LeaseExpiresAt, now))
		if in.CancelRequested {
			row("cancel", "requested: canceled when this step returns")
		}
	case store.StatusAwaiting:
		row("awaiting", orDash(in.AwaitSignal))
		row("times out", when(in.TimeoutAt, now))
	case store.StatusChildren:
		row("children left", fmt.Sprint(in.PendingChildren))
	}
	if in.LastError != "" {
		label := "last error"
		if n := len(hist); n > 0 && hist[n-1].Outcome == transitions.KindStop.String() && in.Status == store.StatusFailed {
			label = "stop reason"
		}
		row(label, in.LastError)
	}
	if in.ParentID != "" {
		row("parent", in.ParentID)
	}
	row("created", when(in.CreatedAt, now))
	row("updated", when(in.UpdatedAt, now))
	tw.Flush()
	fmt.Fprintf(stdout, "\nstate:\n%s\n", indentJSON(in.State))
	if len(in.Result) > 0 {
		fmt.Fprintf(stdout, "\nresult:\n%s\n", indentJSON(in.Result))
	}
	fmt.Fprintln(stdout)
	if len(hist) == 0 {
		fmt.Fprintln(stdout, "history: none recorded (workers record it with postgres.Options.History)")
		return
	}
	fmt.Fprintln(stdout, "history:")
	tw = table(stdout)
	fmt.Fprintln(tw, "  STEP\tATTEMPT\tKEYS\tOUTCOME\tWORKER\tSTARTED\tTOOK\tERROR")
	for _, h := range hist {
		took := "-"
		if !h.StartedAt.IsZero() && !h.FinishedAt.IsZero() {
			took = age(h.FinishedAt.Sub(h.StartedAt))
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Step, h.Attempt, keyColumn(h.KeyList()), h.Outcome, orDash(h.Worker),
			h.StartedAt.UTC().Format(time.RFC3339), took, orDash(firstLine(h.Error)))
	}
	tw.Flush()
}

// severalKeysText is the keys of a row of several keys, its first key
// first, each with its intent and, while the row executes, the shard of
// the key's counters it holds ("account:1 (identity), stripe:t (gate,
// shard 0)").
func severalKeysText(in store.Instance) string {
	refs := append([]store.KeyRef{{Key: in.Key, Intent: in.KeyIntent}}, in.Also...)
	shards := append([]int{in.KeyShard}, in.AlsoShards...)
	parts := make([]string, len(refs))
	for i, r := range refs {
		var about []string
		if r.Intent != "" {
			about = append(about, string(r.Intent))
		}
		if in.Status == store.StatusExecuting && i < len(shards) && shards[i] >= 0 {
			about = append(about, fmt.Sprintf("shard %d", shards[i]))
		}
		parts[i] = r.Key
		if len(about) > 0 {
			parts[i] += " (" + strings.Join(about, ", ") + ")"
		}
	}
	return strings.Join(parts, ", ")
}

// indentJSON formats a stored state or result for reading, with the keys
// of every object sorted by name: PostgreSQL keeps JSON as jsonb, which
// does not keep the order in which a workflow wrote the keys (it orders
// them by length first), so the stored order is not there to print, and
// sorted keys read the same every time. Numbers keep their stored text.
func indentJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "  null"
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("  ", "  ")
	if err := dec.Decode(&v); err != nil || enc.Encode(v) != nil {
		b.Reset()
		if err := json.Indent(&b, raw, "  ", "  "); err != nil {
			return "  " + string(raw)
		}
	}
	return "  " + strings.TrimRight(b.String(), "\n")
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}

// sendSignal stores a signal for an instance, waking it if it awaits that name.
func sendSignal(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("signal", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	dedup := fs.String("dedup", "", "dedup key: a second signal with the same key is a no-op")
	pos, err := parse(fs, args, 2, 1, "ID NAME [JSON]")
	if err != nil {
		return err
	}
	id, name := pos[0], pos[1]
	if err := checkID("signal", id); err != nil {
		return err
	}
	var payload json.RawMessage
	if len(pos) == 3 {
		if !json.Valid([]byte(pos[2])) {
			return usagef("signal: the payload %q is not valid JSON (quote strings: '\"text\"')", pos[2])
		}
		payload = json.RawMessage(pos[2])
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("signal: %w", err)
	}
	defer closeStore()
	before, err := st.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("signal: %w", explainErr(id, err))
	}
	res, err := st.Signal(ctx, store.SignalRequest{InstanceID: id, Name: name, Payload: payload, DedupKey: *dedup})
	if err != nil {
		return fmt.Errorf("signal: %w", explainErr(id, err))
	}
	switch {
	case res.Duplicate:
		fmt.Fprintf(stdout, "signal %s to %s: duplicate dedup key %q, nothing sent\n", name, id, *dedup)
	case res.Woke:
		fmt.Fprintf(stdout, "signal %s sent to %s: it was awaiting it and is ready again\n", name, id)
	default:
		fmt.Fprintf(stdout, "signal %s stored for %s: delivered at its next await of %s\n", name, id, name)
		// Stored, not delivered: a signal may arrive before its await, but
		// a misspelt name would wait forever, so say what the instance
		// waits for.
		if before.Status == store.StatusAwaiting && before.AwaitSignal != name {
			fmt.Fprintf(stderr, "warning: %s awaits %q, not %q: this signal stays stored until a step awaits %q\n",
				id, before.AwaitSignal, name, name)
		} else if before.Status != store.StatusAwaiting {
			fmt.Fprintf(stderr, "warning: %s is not awaiting a signal (it is %s): this signal will be delivered to its first await of %q\n",
				id, before.Status, name)
		}
	}
	return nil
}

// checkID refuses an instance id that is not a UUID before any query, so
// that a typo reads as one rather than as a missing instance.
func checkID(what, id string) error {
	if _, err := uuid.Parse(id); err != nil {
		return usagef("%s: %q is not an instance id (a UUID)", what, id)
	}
	return nil
}

// cancel cancels a non-terminal instance.
func cancel(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cancel", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	children := fs.Bool("children", false, "cancel its descendants too (the children it spawned, theirs, ...), parents first")
	pos, err := parse(fs, args, 1, 0, "ID")
	if err != nil {
		return err
	}
	id := pos[0]
	if err := checkID("cancel", id); err != nil {
		return err
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("cancel: %w", err)
	}
	defer closeStore()
	before, err := st.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("cancel: %w", explainErr(id, err))
	}
	if *children {
		return cancelTree(ctx, st, before, stdout)
	}
	if err := st.Cancel(ctx, id, time.Time{}); err != nil {
		return fmt.Errorf("cancel: %w", explainErr(id, err))
	}
	msg := fmt.Sprintf("canceled %s (was %s at step %s)", id, before.Status, before.Step)
	if before.Status == store.StatusExecuting {
		msg = fmt.Sprintf("cancel requested for %s (executing step %s on worker %s): the worker is told at once; "+
			"the step keeps its key until it returns or its lease expires, then the instance is canceled", id, before.Step, before.Worker)
	}
	fmt.Fprintln(stdout, msg)
	return nil
}

// cancelTree cancels root and its descendants (store.CancelTree) and
// prints what it did to each.
func cancelTree(ctx context.Context, st store.Store, root store.Instance, stdout io.Writer) error {
	ids, err := store.CancelTree(ctx, st, root.ID, time.Time{})
	for _, id := range ids {
		in, gerr := st.Get(ctx, id)
		switch {
		case gerr != nil:
			fmt.Fprintf(stdout, "canceled %s\n", id)
		case in.Status == store.StatusExecuting:
			fmt.Fprintf(stdout, "cancel requested for %s (%s, executing step %s on worker %s): canceled when the step returns\n",
				id, in.Workflow, in.Step, in.Worker)
		default:
			fmt.Fprintf(stdout, "canceled %s (%s at step %s)\n", id, in.Workflow, in.Step)
		}
	}
	if err != nil {
		return fmt.Errorf("cancel -children: %w", explainErr(root.ID, err))
	}
	switch {
	case len(ids) == 0:
		fmt.Fprintf(stdout, "nothing to cancel: %s (%s) and its descendants are all terminal\n", root.ID, root.Status)
	case ids[0] != root.ID:
		fmt.Fprintf(stdout, "%s was %s already; %d descendant(s) canceled\n", root.ID, root.Status, len(ids))
	default:
		fmt.Fprintf(stdout, "%d instance(s) canceled: %s and %d descendant(s)\n", len(ids), root.ID, len(ids)-1)
	}
	return nil
}

// retry makes a failed or canceled instance ready again at its step.
func retry(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("retry", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	pos, err := parse(fs, args, 1, 0, "ID")
	if err != nil {
		return err
	}
	id := pos[0]
	if err := checkID("retry", id); err != nil {
		return err
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("retry: %w", err)
	}
	defer closeStore()
	before, err := st.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("retry: %w", explainErr(id, err))
	}
	if err := st.Retry(ctx, id, time.Time{}); err != nil {
		if !before.Status.Terminal() || before.Status == store.StatusDone {
			return fmt.Errorf("retry: instance %s is %s: only failed or canceled instances can be retried", id, before.Status)
		}
		if errors.Is(err, store.ErrDuplicate) {
			return fmt.Errorf("retry: %s: another live instance holds its unique key: %w", id, err)
		}
		return fmt.Errorf("retry: %w", explainErr(id, err))
	}
	fmt.Fprintf(stdout, "retrying %s (was %s): ready at step %s, attempt 0\n", id, before.Status, before.Step)
	return nil
}
