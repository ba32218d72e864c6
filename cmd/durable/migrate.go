package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/store/postgres"
)

// migrate brings the schema up to the latest version, or with -down N
// reverts it to version N (0 removes every table). It first says what each
// pending migration locks (see postgres.Migration.Locks); with -plan it
// stops there.
func migrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	down := fs.Int("down", -1, "revert to this version instead of migrating up (0 removes every table)")
	plan := fs.Bool("plan", false, "only say what the pending migrations would lock, and apply nothing")
	if _, err := parse(fs, args, 0, 0, ""); err != nil {
		return err
	}
	pool, err := db.pool(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer pool.Close()

	if err := migratePlan(ctx, pool, db.schema, *down, stdout); err != nil {
		return err
	}
	if *plan {
		return nil
	}
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

// migratePlan prints, for each migration a run to version down (-1: the
// latest) would apply, whether it runs in the run's transaction and what
// it locks.
func migratePlan(ctx context.Context, pool *pgxpool.Pool, schema string, down int, w io.Writer) error {
	if err := postgres.ValidateSchema(schema); err != nil {
		return err
	}
	ms, err := postgres.Migrations()
	if err != nil {
		return err
	}
	applied, err := postgres.AppliedVersions(ctx, pool, schema)
	if err != nil {
		return err
	}
	current := len(applied)
	var steps []postgres.Migration
	reverting := down >= 0
	if reverting {
		for v := current; v > down && v >= 1 && v <= len(ms); v-- {
			steps = append(steps, ms[v-1])
		}
	} else {
		steps = ms[min(current, len(ms)):]
	}
	for _, m := range steps {
		how := "in the run's transaction, holding its locks until it commits"
		switch {
		case current == 0:
			how = "in the run's transaction (a new schema: indexes built without CONCURRENTLY, nothing else uses it yet)"
		case m.NoTransaction(reverting):
			how = "without a transaction, each lock held for its statement only"
		}
		fmt.Fprintf(w, "migration %d (%s), %s:\n", m.Version, m.Name, how)
		locks := m.Locks(reverting)
		if current == 0 {
			locks = nil // its tables are new
		}
		if len(locks) == 0 {
			fmt.Fprintf(w, "  locks no existing table\n")
		}
		for _, l := range locks {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
	return nil
}
