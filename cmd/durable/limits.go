package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// limitsFile is the file `durable limits sync` reads: either this object
// or a bare JSON array of limits (limitsShape).
type limitsFile struct {
	// Limits are the named key limits (gates): {"name", "limit", "shards"};
	// a "name" that is a full key ("stripe:acct_big") is a per-key limit.
	Limits []gate.Limit `json:"limits"`
	// RateLimits are the rate limits by key name: {"name", "limit",
	// "period" ("1s", "1m"), "burst", "per_key"}. When the file has this
	// field, sync makes the namespace's rate limits equal to it too;
	// without it they are left alone.
	RateLimits []gate.RateLimit `json:"rate_limits,omitempty"`
}

// limits dispatches `limits ls [NAME|KEY]`, `limits sync FILE`, `limits set NAME
// LIMIT` and `limits unset NAME`.
func limits(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const want = "ls [NAME|KEY], sync FILE, set NAME LIMIT or unset NAME"
	if len(args) == 0 {
		return usagef("limits: want a subcommand: %s", want)
	}
	switch args[0] {
	case "set":
		return limitsSet(ctx, args[1:], stdout, stderr)
	case "unset":
		return limitsUnset(ctx, args[1:], stdout, stderr)
	case "ls", "sync":
		return lsOrSync(ctx, "limits", args, stdout, stderr, limitsList, limitsSync)
	}
	return usagef("limits: unknown subcommand %q: want %s", args[0], want)
}

// limitsOneHelp is the help of `limits set` and `limits unset`: what they
// change and how that meets namespace ownership.
const limitsOneHelp = `
set and unset change one stored limit and leave every other as it is (a sync
with KeepOmitted). NAME is a key name ("stripe": K for each of its keys) or a
full key ("stripe:acct_big": a per-key limit, that key's K over its name's;
its name must have a limit). The entry belongs to -namespace (default
"default", as for limits sync): an entry another namespace owns is refused,
name that namespace instead. An engine whose Config.Limits is set syncs its
namespace's limits at Start and deletes that namespace's entries it omits:
set a per-key limit under a namespace no engine syncs (-namespace ops), or
put it in the engines' Config.Limits. A name's limit cannot be unset while
per-key limits of its keys remain: unset those first.`

// withOneHelp prints limitsOneHelp after the flags when err answers -h.
func withOneHelp(err error, stderr io.Writer) error {
	if strings.Contains(err.Error(), "usage: durable") {
		fmt.Fprintln(stderr, limitsOneHelp)
	}
	return err
}

// limitsSet stores one limit: `limits set NAME LIMIT [-shards N]`.
func limitsSet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("limits set", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	namespace := fs.String("namespace", store.DefaultNamespace, "the namespace that owns the limit")
	shards := fs.Int("shards", 1, "counter rows per key (at most LIMIT; see gate.ShardsFor)")
	dry := fs.Bool("dry-run", false, "report the change, store nothing")
	pos, err := parse(fs, args, 2, 0, "NAME|KEY LIMIT")
	if err != nil {
		return withOneHelp(err, stderr)
	}
	n, err := strconv.Atoi(pos[1])
	if err != nil {
		return usagef("limits set: LIMIT %q is not a number", pos[1])
	}
	l := gate.Limit{Name: pos[0], Limit: n, Shards: *shards}
	if err := l.Validate(); err != nil {
		return fmt.Errorf("limits set: %w", err)
	}
	return limitsChange(ctx, db, "limits set", *namespace, []gate.Limit{l}, store.SyncOptions{KeepOmitted: true, DryRun: *dry}, stdout)
}

// limitsUnset deletes one limit: `limits unset NAME`.
func limitsUnset(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("limits unset", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	namespace := fs.String("namespace", store.DefaultNamespace, "the namespace that owns the limit")
	dry := fs.Bool("dry-run", false, "report the change, store nothing")
	pos, err := parse(fs, args, 1, 0, "NAME|KEY")
	if err != nil {
		return withOneHelp(err, stderr)
	}
	if err := (&gate.Limit{Name: pos[0], Limit: 1}).Validate(); err != nil {
		return fmt.Errorf("limits unset: %w", err)
	}
	o := store.SyncOptions{KeepOmitted: true, DryRun: *dry, RemoveLimits: []string{pos[0]}}
	return limitsChange(ctx, db, "limits unset", *namespace, []gate.Limit{}, o, stdout)
}

// limitsChange syncs want into namespace with o and prints what changed.
func limitsChange(ctx context.Context, db *dbFlags, cmd, namespace string, want []gate.Limit, o store.SyncOptions, stdout io.Writer) error {
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	defer closeStore()
	res, err := st.SyncKeyLimits(ctx, namespace, store.KeyLimits{Limits: want}, o)
	if err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	verb := "changed"
	if o.DryRun {
		verb = "would change (dry run, nothing stored)"
	}
	fmt.Fprintf(stdout, "%s: %d %s\n", cmd, len(res.Changes), verb)
	printChanges(stdout, res)
	return nil
}

// perKeyShown is how many per-key limits of one name `limits ls` prints
// when no NAME is given: a fleet may store one for each of many thousand
// tenants.
const perKeyShown = 20

// limitsList prints the stored limits: `limits ls [NAME|KEY] [-json]`.
// With a name, that name's limit and every per-key limit of its keys; with
// a key, its name's limit and its own.
func limitsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("limits ls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	asJSON := fs.Bool("json", false, "print every limit as JSON (the format limits sync reads)")
	pos, err := parse(fs, args, 0, 1, "[NAME|KEY]")
	if err != nil {
		return err
	}
	filter, name := "", "" // a NAME or a KEY, and its name
	if len(pos) == 1 {
		filter, name = pos[0], gate.NameOf(pos[0])
		if *asJSON {
			// A sync deletes what its file omits: a file of one name's
			// limits would delete every other limit of the namespace.
			return usagef("limits ls: -json prints every limit (the file limits sync reads, which deletes what it omits), not one NAME's")
		}
		if err := (&gate.Limit{Name: filter, Limit: 1}).Validate(); err != nil {
			return fmt.Errorf("limits ls: %w", err)
		}
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("limits ls: %w", err)
	}
	defer closeStore()
	ls, err := st.Limits(ctx)
	if err != nil {
		return fmt.Errorf("limits ls: %w", err)
	}
	rates, err := st.RateLimits(ctx)
	if err != nil {
		return fmt.Errorf("limits ls: %w", err)
	}
	if *asJSON {
		if ls == nil {
			ls = []gate.Limit{}
		}
		return writeJSON(stdout, limitsFile{Limits: ls, RateLimits: rates})
	}
	if filter != "" {
		ls = slices.DeleteFunc(ls, func(l gate.Limit) bool {
			if filter == name { // a name: it and its keys' own
				return gate.NameOf(l.Name) != name
			}
			return l.Name != name && l.Name != filter // a key: its name's and its own
		})
		rates = slices.DeleteFunc(rates, func(r gate.RateLimit) bool { return r.Name != name })
	}
	switch {
	case len(ls) == 0 && filter == "":
		fmt.Fprintln(stdout, "no limits: every key runs at K = 1 (strict mutual exclusion per key)")
	case len(ls) == 0:
		fmt.Fprintf(stdout, "no limit for %s: its keys run at K = 1 (strict mutual exclusion per key)\n", name)
	default:
		tw := table(stdout)
		fmt.Fprintln(tw, "NAME\tLIMIT (K PER KEY)\tSHARDS")
		shown, hidden := map[string]int{}, map[string]int{} // per-key limits by name
		for _, l := range ls {
			label := l.Name
			if l.PerKey() {
				n := gate.NameOf(l.Name)
				if filter == "" && shown[n] == perKeyShown {
					hidden[n]++
					continue
				}
				shown[n]++
				label = "  " + l.Name + " (this key only)"
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\n", label, l.Limit, l.Shards)
		}
		tw.Flush()
		for _, n := range slices.Sorted(maps.Keys(hidden)) {
			fmt.Fprintf(stdout, "%d more per-key limits of %s: durable limits ls %s\n", hidden[n], n, n)
		}
		if len(shown) > 0 {
			fmt.Fprintln(stdout, "a key with its own limit runs at it; the other keys of its name at the name's")
		}
		if filter == "" {
			fmt.Fprintln(stdout, "keys of any other name run at K = 1")
		} else if filter != name && !slices.ContainsFunc(ls, func(l gate.Limit) bool { return l.Name == filter }) {
			fmt.Fprintf(stdout, "%s has no limit of its own: it runs at its name's\n", filter)
		}
	}
	if len(rates) > 0 {
		fmt.Fprintln(stdout)
		tw := table(stdout)
		fmt.Fprintln(tw, "RATE LIMIT\tRATE\tBURST\tBUCKET PER")
		for _, r := range rates {
			scope := "name"
			if r.PerKey {
				scope = "key"
			}
			fmt.Fprintf(tw, "%s\t%d per %s\t%d\t%s\n", r.Name, r.Limit, r.Period, r.Burst, scope)
		}
		tw.Flush()
	}
	return nil
}

func limitsSync(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("limits sync", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	namespace := fs.String("namespace", store.DefaultNamespace, "the namespace that owns the limits")
	pos, err := parse(fs, args, 1, 0, "FILE")
	if err != nil {
		return err
	}
	file, err := readLimits(pos[0])
	if err != nil {
		return fmt.Errorf("limits sync: %w", err)
	}
	want := file.Limits
	if want == nil {
		want = []gate.Limit{} // the file is the whole desired state: no limits removes them
	}
	if _, err := gate.NewLimits(want); err != nil {
		return fmt.Errorf("limits sync: %s: %w", pos[0], err)
	}
	if _, err := gate.NewRateLimits(file.RateLimits); err != nil {
		return fmt.Errorf("limits sync: %s: %w", pos[0], err)
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("limits sync: %w", err)
	}
	defer closeStore()
	var res store.LimitsResult
	if file.RateLimits != nil || *namespace != store.DefaultNamespace {
		rates := file.RateLimits
		if rates == nil {
			rates = []gate.RateLimit{}
		}
		res, err = st.SyncKeyLimits(ctx, *namespace, store.KeyLimits{Limits: want, RateLimits: rates}, store.SyncOptions{})
	} else {
		res, err = st.SyncLimits(ctx, want)
	}
	if err != nil {
		return fmt.Errorf("limits sync: %w", err)
	}
	fmt.Fprintf(stdout, "limits synced: %d stored, %d changed\n", len(want), len(res.Changes))
	printChanges(stdout, res)
	fmt.Fprintln(stdout, "note: an engine started with Config.Limits stores its own limits at Start, replacing these")
	return nil
}

// printChanges prints a sync's changes, one line each, with a warning
// where live instances hold the keys whose K changed.
func printChanges(stdout io.Writer, res store.LimitsResult) {
	for _, c := range res.Changes {
		from, to := "K = 1 (no limit)", "K = 1 (no limit)"
		if strings.Contains(c.Name, ":") { // a per-key limit: without one, the key has its name's K
			from, to = fmt.Sprintf("K = %d (its name's limit)", c.OldK), fmt.Sprintf("K = %d (its name's limit)", c.NewK)
		}
		if c.OldSet {
			from = fmt.Sprintf("K = %d", c.OldK)
		}
		if c.NewSet {
			to = fmt.Sprintf("K = %d", c.NewK)
		}
		line := fmt.Sprintf("  %s: %s -> %s", c.Name, from, to)
		if n := res.Live[c.Name]; n > 0 {
			what := "keys of this name"
			if strings.Contains(c.Name, ":") {
				what = "this key"
			}
			line += fmt.Sprintf("  WARNING: %s live instance(s) hold %s and change semantics", gate.LiveCount(n), what)
		}
		fmt.Fprintln(stdout, line)
	}
	for _, c := range res.RateChanges {
		w := c.LiveWarning(res.Live[c.Name])
		line := "  " + w.Message
		if res.Live[c.Name] > 0 {
			line = "  WARNING: " + w.Message
		}
		fmt.Fprintln(stdout, line)
	}
}

// limitsShape and policiesShape are the JSON shapes the sync commands
// read, named in their errors.
const (
	limitsShape = `{"limits": [{"name": "api", "limit": 4, "shards": 1}], "rate_limits": [{"name": "api", "limit": 10, "period": "1m", "burst": 2, "per_key": true}]}` +
		` or a bare array of limits [{"name": "api", "limit": 4}]`
	policiesShape = `{"policies": [{"queue": "mail", "max_active": 20, "max_active_per_key": 3}]}` +
		` or a bare array of policies [{"queue": "mail", "max_active": 20}]`
)

// readLimits reads a limits file ("-": stdin): the object or a bare array.
func readLimits(path string) (limitsFile, error) {
	b, err := readInput(path)
	if err != nil {
		return limitsFile{}, err
	}
	var f limitsFile
	if err := decodeObjectOrArray(b, &f, &f.Limits); err != nil {
		return limitsFile{}, fmt.Errorf("%s: %w; want %s", path, err, limitsShape)
	}
	return f, nil
}

// decodeObjectOrArray decodes JSON b into obj, or into list when b is a
// bare array, refusing unknown fields, with errors that name JSON, not Go.
func decodeObjectOrArray(b []byte, obj, list any) error {
	b = bytes.TrimSpace(b)
	into := obj
	if len(b) > 0 && b[0] == '[' {
		into = list
	}
	if len(b) == 0 {
		return errors.New("the file is empty")
	}
	return jsonError(decodeStrict(b, into))
}

// jsonError rewrites a decoding error in terms of the JSON document: where
// it went wrong and what kind of value was found, never a Go type.
func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &syn):
		return fmt.Errorf("not valid JSON at byte %d: %s", syn.Offset, strings.TrimPrefix(syn.Error(), "json: "))
	case errors.As(err, &typ):
		where := "the document"
		if typ.Field != "" {
			where = fmt.Sprintf("field %q", typ.Field)
		}
		return fmt.Errorf("%s: unexpected JSON %s at byte %d", where, typ.Value, typ.Offset)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("the JSON ends too early")
	}
	// Unknown fields ("json: unknown field \"x\"") and the value errors of
	// the limit types (a bad period) name only JSON.
	return errors.New(strings.TrimPrefix(err.Error(), "json: "))
}

// lsOrSync dispatches the `ls` and `sync FILE` subcommands of command name.
func lsOrSync(ctx context.Context, name string, args []string, stdout, stderr io.Writer,
	ls, sync func(ctx context.Context, args []string, stdout, stderr io.Writer) error) error {
	if len(args) == 0 {
		return usagef("%s: want a subcommand: ls or sync FILE", name)
	}
	switch args[0] {
	case "ls":
		return ls(ctx, args[1:], stdout, stderr)
	case "sync":
		return sync(ctx, args[1:], stdout, stderr)
	default:
		return usagef("%s: unknown subcommand %q: want ls or sync FILE", name, args[0])
	}
}

// readInput reads the file at path, or standard input when path is "-".
func readInput(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(path)
}

// decodeStrict decodes JSON b into v, refusing unknown fields.
func decodeStrict(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode(v)
}
