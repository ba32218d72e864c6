package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/godurable/godurable/store/postgres"
)

// migrate brings the schema up to the latest version, or with -down N
// reverts it to version N (0 removes every table).
func migrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	down := fs.Int("down", -1, "revert to this version instead of migrating up (0 removes every table)")
	if _, err := parse(fs, args, 0, 0, ""); err != nil {
		return err
	}
	pool, err := db.pool(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer pool.Close()

	var done []int
	if *down >= 0 {
		done, err = postgres.MigrateDown(ctx, pool, db.schema, *down)
	} else {
		done, err = postgres.Migrate(ctx, pool, db.schema)
	}
	if err != nil {
		return err
	}
	applied, err := postgres.AppliedVersions(ctx, pool, db.schema)
	if err != nil {
		return err
	}
	verb := "applied"
	if *down >= 0 {
		verb = "reverted"
	}
	if len(done) == 0 {
		fmt.Fprintf(stdout, "schema %s: nothing to do, at version %d\n", db.schema, len(applied))
		return nil
	}
	fmt.Fprintf(stdout, "schema %s: %s %v, now at version %d\n", db.schema, verb, done, len(applied))
	return nil
}
