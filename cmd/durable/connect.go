package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
)

// dbFlags are the connection flags every command takes.
type dbFlags struct {
	url    string
	schema string
	// fs is the command's flag set, which tells the flags the user gave.
	fs *flag.FlagSet
}

func addDBFlags(fs *flag.FlagSet) *dbFlags {
	d := &dbFlags{fs: fs}
	fs.StringVar(&d.url, "database-url", "", "PostgreSQL connection string (default $DATABASE_URL)")
	fs.StringVar(&d.schema, "schema", postgres.DefaultSchema, "schema holding the tables")
	return d
}

// connectTimeout bounds how long a command waits for the server to answer.
const connectTimeout = 10 * time.Second

// pool opens a small pool and checks that the server answers, turning the
// usual failures into errors an operator can act on.
func (d *dbFlags) pool(ctx context.Context) (*pgxpool.Pool, error) {
	url := d.url
	if url == "" {
		url = envDatabaseURL()
	}
	if url == "" {
		return nil, errors.New("no database: pass -database-url or set DATABASE_URL")
	}
	if err := postgres.ValidateSchema(d.schema); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx redacts the password from its parse errors.
		return nil, fmt.Errorf("bad database URL: %w", err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.ConnectTimeout = connectTimeout
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "durable-cli"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bad database URL: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		where := fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("cannot use PostgreSQL at %s as %s: %s (SQLSTATE %s)", where, cfg.ConnConfig.User, pe.Message, pe.Code)
		}
		return nil, fmt.Errorf("cannot reach PostgreSQL at %s: %w", where, err)
	}
	return pool, nil
}

// open connects and opens the store, telling the user to migrate when the
// schema is missing or behind this build.
func (d *dbFlags) open(ctx context.Context) (*postgres.Store, func(), error) {
	pool, err := d.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	applied, err := postgres.AppliedVersions(ctx, pool, d.schema)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	ms, err := postgres.Migrations()
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	switch {
	case len(applied) == 0:
		pool.Close()
		return nil, nil, fmt.Errorf("schema %q has no godurable tables: run `%s` first", d.schema, d.command("migrate"))
	case len(applied) < len(ms):
		pool.Close()
		return nil, nil, fmt.Errorf("schema %q is at version %d, this build needs %d: run `%s`",
			d.schema, len(applied), len(ms), d.command("migrate"))
	case len(applied) > len(ms):
		pool.Close()
		return nil, nil, fmt.Errorf("schema %q is at version %d, newer than this build of durable knows (%d): upgrade the CLI",
			d.schema, len(applied), len(ms))
	}
	st, err := postgres.New(ctx, pool, postgres.Options{Schema: d.schema})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return st, func() { _ = st.Close(); pool.Close() }, nil
}

// explainErr rewrites store errors an operator may hit into plain words.
func explainErr(id string, err error) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("no instance %s (check the id and -schema)", id)
	case errors.Is(err, store.ErrTerminal):
		return fmt.Errorf("instance %s is terminal (done, failed or canceled): %w", id, err)
	}
	return err
}

// envDatabaseURL is $DATABASE_URL.
func envDatabaseURL() string { return os.Getenv("DATABASE_URL") }

// command returns the durable command line args as the user can paste it:
// args, then the global flags the user gave this command (-database-url,
// -schema; before or after the command), each word quoted for a POSIX
// shell where it needs it. A flag the user left to its default (or to
// $DATABASE_URL) is left out, so the command means the same in the same
// shell.
func (d *dbFlags) command(args ...string) string {
	words := []string{"durable"}
	for _, a := range args {
		words = append(words, shellQuote(a))
	}
	d.fs.Visit(func(f *flag.Flag) {
		if globalFlags[f.Name] {
			words = append(words, "-"+f.Name, shellQuote(f.Value.String()))
		}
	})
	return strings.Join(words, " ")
}

// shellQuote returns s as one word of a POSIX shell: as it is when it has
// only characters no shell treats specially, else in single quotes.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,:/@%+=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
