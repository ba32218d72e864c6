package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one versioned schema change.
type Migration struct {
	// Version orders migrations; versions start at 1 and have no gaps.
	Version int
	// Name is the descriptive part of the file name.
	Name string
	up   string
	down string
}

var migrationName = regexp.MustCompile(`^(\d+)_([a-z0-9_]+)\.(up|down)\.sql$`)

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) { return loadMigrations(migrationFiles, "migrations") }

func loadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %q: want NNN_name.up.sql or NNN_name.down.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		mig := byVersion[v]
		if mig == nil {
			mig = &Migration{Version: v, Name: m[2]}
			byVersion[v] = mig
		} else if mig.Name != m[2] {
			return nil, fmt.Errorf("migration %d has two names: %q and %q", v, mig.Name, m[2])
		}
		if m[3] == "up" {
			mig.up = string(body)
		} else {
			mig.down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.up == "" || m.down == "" {
			return nil, fmt.Errorf("migration %d (%s) needs both an up and a down file", m.Version, m.Name)
		}
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration versions must be 1..n without gaps; found %d at position %d", m.Version, i+1)
		}
	}
	return out, nil
}

// Migrate brings schema up to the latest embedded migration and returns the
// versions it applied (none when already current). It creates the schema if
// needed. Concurrent calls on the same schema are serialized by an advisory
// lock and the whole run is one transaction: either every pending migration
// is applied and recorded, or none is.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int, error) {
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	return migrateTo(ctx, pool, schema, ms, len(ms))
}

// MigrateDown reverts schema to toVersion (0 removes every table the
// migrations created) and returns the versions it reverted, newest first.
// Like Migrate it runs in one transaction under the schema's migration lock.
func MigrateDown(ctx context.Context, pool *pgxpool.Pool, schema string, toVersion int) ([]int, error) {
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	if toVersion < 0 || toVersion > len(ms) {
		return nil, fmt.Errorf("migrate down: target version %d outside 0..%d", toVersion, len(ms))
	}
	return migrateTo(ctx, pool, schema, ms, toVersion)
}

// AppliedVersions returns the versions recorded in schema, ascending (none
// when the schema has never been migrated).
func AppliedVersions(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	var exists bool
	if err := pool.QueryRow(ctx, sqlMigrationsTableExists, schema).Scan(&exists); err != nil {
		return nil, fmt.Errorf("applied versions: %w", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := pool.Query(ctx, render(sqlMigrationsApplied, schema))
	if err != nil {
		return nil, fmt.Errorf("applied versions: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

func migrateTo(ctx context.Context, pool *pgxpool.Pool, schema string, ms []Migration, target int) ([]int, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	var done []int
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlMigrationLock, lockSalt(schema, saltMigrate)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, render(sqlMigrationsInit, schema)); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, render(sqlMigrationsApplied, schema))
		if err != nil {
			return err
		}
		applied, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return err
		}
		current := 0
		for i, v := range applied {
			if v != i+1 {
				return fmt.Errorf("schema %s records versions %v: not a prefix of 1..n", schema, applied)
			}
			current = v
		}
		if current > len(ms) {
			return fmt.Errorf("schema %s is at version %d, newer than this build knows (%d)", schema, current, len(ms))
		}
		for v := current + 1; v <= target; v++ {
			m := ms[v-1]
			if _, err := tx.Exec(ctx, render(m.up, schema)); err != nil {
				return fmt.Errorf("migration %d (%s) up: %w", m.Version, m.Name, err)
			}
			if _, err := tx.Exec(ctx, render(sqlMigrationRecord, schema), m.Version, m.Name); err != nil {
				return err
			}
			done = append(done, v)
		}
		for v := current; v > target; v-- {
			m := ms[v-1]
			if _, err := tx.Exec(ctx, render(m.down, schema)); err != nil {
				return fmt.Errorf("migration %d (%s) down: %w", m.Version, m.Name, err)
			}
			if _, err := tx.Exec(ctx, render(sqlMigrationForget, schema), m.Version); err != nil {
				return err
			}
			done = append(done, v)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrate schema %s: %w", schema, err)
	}
	return done, nil
}

// schemaPattern is what ValidateSchema accepts.
var schemaPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ErrInvalidSchema is wrapped by ValidateSchema's errors.
var ErrInvalidSchema = errors.New("invalid schema name")

// ValidateSchema reports whether schema is an acceptable schema name: a
// lower-case letter or '_' followed by at most 62 lower-case letters, digits
// or '_', and not a name reserved by PostgreSQL (pg_*).
func ValidateSchema(schema string) error {
	if !schemaPattern.MatchString(schema) {
		return fmt.Errorf("%w %q: want [a-z_][a-z0-9_]{0,62}", ErrInvalidSchema, schema)
	}
	if strings.HasPrefix(schema, "pg_") {
		return fmt.Errorf("%w %q: the pg_ prefix is reserved", ErrInvalidSchema, schema)
	}
	return nil
}

// render puts the quoted schema into a statement.
func render(sql, schema string) string {
	return strings.ReplaceAll(sql, "{schema}", pgx.Identifier{schema}.Sanitize())
}
