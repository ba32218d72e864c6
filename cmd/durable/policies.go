package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/godurable/godurable/store"
)

// policiesFile is the file `durable policies sync` reads (this object or
// a bare JSON array of policies: policiesShape) and `policies ls -json`
// writes: a namespace's queue policies.
type policiesFile struct {
	// Policies are {"queue", "max_active", "max_active_per_key"}.
	Policies []store.ConcurrencyPolicy `json:"policies"`
}

// policies dispatches `policies ls` and `policies sync FILE`.
func policies(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return lsOrSync(ctx, "policies", args, stdout, stderr, policiesList, policiesSync)
}

func policiesList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("policies ls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args, 0, 0, ""); err != nil {
		return err
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("policies ls: %w", err)
	}
	defer closeStore()
	ps, err := st.ListConcurrencyPolicies(ctx)
	if err != nil {
		return fmt.Errorf("policies ls: %w", err)
	}
	if *asJSON {
		return writeJSON(stdout, policiesFile{Policies: ps})
	}
	if len(ps) == 0 {
		fmt.Fprintln(stdout, "no queue policies: each worker's executors are the only limit of a queue")
		return nil
	}
	tw := table(stdout)
	fmt.Fprintln(tw, "QUEUE\tNAMESPACE\tMAX ACTIVE\tMAX ACTIVE PER KEY")
	for _, p := range ps {
		perKey := "-"
		if p.MaxActivePerKey > 0 {
			perKey = fmt.Sprint(p.MaxActivePerKey)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", p.Queue, p.Namespace, p.MaxActive, perKey)
	}
	return tw.Flush()
}

func policiesSync(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("policies sync", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	namespace := fs.String("namespace", store.DefaultNamespace, "the namespace that owns the policies")
	keep := fs.Bool("keep-omitted", false, "keep the namespace's policies the file omits (default: delete them)")
	dry := fs.Bool("dry-run", false, "print what would be stored, store nothing")
	pos, err := parse(fs, args, 1, 0, "FILE")
	if err != nil {
		return err
	}
	b, err := readInput(pos[0])
	if err != nil {
		return fmt.Errorf("policies sync: %w", err)
	}
	var f policiesFile
	if err := decodeObjectOrArray(b, &f, &f.Policies); err != nil {
		return fmt.Errorf("policies sync: %s: %w; want %s", pos[0], err, policiesShape)
	}
	if err := store.ValidatePolicies(*namespace, f.Policies); err != nil {
		return fmt.Errorf("policies sync: %s: %w", pos[0], err)
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("policies sync: %w", err)
	}
	defer closeStore()
	got, err := st.SyncConcurrencyPolicies(ctx, *namespace, f.Policies, store.SyncOptions{KeepOmitted: *keep, DryRun: *dry})
	if err != nil {
		return fmt.Errorf("policies sync: %w", err)
	}
	verb := "synced"
	if *dry {
		verb = "would store (dry run)"
	}
	fmt.Fprintf(stdout, "policies of namespace %q %s: %d\n", *namespace, verb, len(got))
	for _, p := range got {
		fmt.Fprintf(stdout, "  %s: max active %d, per key %d\n", p.Queue, p.MaxActive, p.MaxActivePerKey)
	}
	fmt.Fprintln(stdout, "every worker applies them from its next claim")
	return nil
}
