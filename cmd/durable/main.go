// Command durable is the godurable operator CLI.
//
//	durable migrate [-database-url URL] [-schema durable] [-down N]
//
// migrate brings the schema up to the latest version, or with -down N
// reverts it to version N (0 removes every table). The database URL comes
// from -database-url or, when that is empty, DATABASE_URL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/godurable/godurable/store/postgres"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "durable:", err)
		os.Exit(1)
	}
}

const usage = `usage: durable <command> [flags]

commands:
  migrate   apply (or with -down N, revert) the schema migrations
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command")
	}
	switch args[0] {
	case "migrate":
		return migrate(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

func migrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("database-url", "", "PostgreSQL connection string (default $DATABASE_URL)")
	schema := fs.String("schema", postgres.DefaultSchema, "schema holding the tables")
	down := fs.Int("down", -1, "revert to this version instead of migrating up (0 removes every table)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("migrate: unexpected argument %q", fs.Arg(0))
	}
	if *url == "" {
		*url = os.Getenv("DATABASE_URL")
	}
	if *url == "" {
		return errors.New("migrate: no database: pass -database-url or set DATABASE_URL")
	}
	pool, err := pgxpool.New(ctx, *url)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer pool.Close()

	var done []int
	if *down >= 0 {
		done, err = postgres.MigrateDown(ctx, pool, *schema, *down)
	} else {
		done, err = postgres.Migrate(ctx, pool, *schema)
	}
	if err != nil {
		return err
	}
	applied, err := postgres.AppliedVersions(ctx, pool, *schema)
	if err != nil {
		return err
	}
	verb := "applied"
	if *down >= 0 {
		verb = "reverted"
	}
	if len(done) == 0 {
		fmt.Fprintf(stdout, "schema %s: nothing to do, at version %d\n", *schema, len(applied))
		return nil
	}
	fmt.Fprintf(stdout, "schema %s: %s %v, now at version %d\n", *schema, verb, done, len(applied))
	return nil
}
