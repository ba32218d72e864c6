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
	"github.com/jackc/pgx/v5/pgconn"
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

// noTxMarker, as the first line of a migration file, makes the runner
// apply that file outside a transaction, one statement at a time: what
// CREATE INDEX CONCURRENTLY and DROP INDEX CONCURRENTLY need, so that an
// index is built on a big table without blocking its writes. Such a file
// holds plain statements, each ending its last line with ';', and must be
// safe to run again from its start (a failed CREATE INDEX CONCURRENTLY
// leaves an invalid index behind, so the file drops the index IF EXISTS
// first): a run that fails part way has recorded nothing of it.
const noTxMarker = "-- godurable:no-transaction"

// NoTransaction reports whether the migration's up file (down: its down
// file) runs outside a transaction, one statement at a time (see Migrate).
func (m Migration) NoTransaction(down bool) bool {
	return strings.HasPrefix(m.file(down), noTxMarker)
}

func (m Migration) file(down bool) string {
	if down {
		return m.down
	}
	return m.up
}

// statements splits a no-transaction migration file into its statements:
// each ends with a line ending in ';'; comment lines are dropped.
func statements(file string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(file) {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(t, ";") {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		}
	}
	if t := strings.TrimSpace(cur.String()); t != "" {
		out = append(out, t)
	}
	return out
}

// concurrently matches the CONCURRENTLY of CREATE INDEX and DROP INDEX.
var concurrently = regexp.MustCompile(`(?i)\s+CONCURRENTLY\b`)

// Locks describes, one line per statement that locks an existing table,
// what applying the migration's up file (down: its down file) locks and
// for how long; `durable migrate` prints it before it applies anything.
// A migration in a transaction holds its locks until that transaction
// commits (see Migrate); a no-transaction one holds each only for its
// statement.
func (m Migration) Locks(down bool) []string {
	var out []string
	for _, st := range statements(m.file(down)) {
		if l := lockOf(st); l != "" {
			out = append(out, l)
		}
	}
	return out
}

var (
	lockCreateIndex = regexp.MustCompile(`(?is)^CREATE\s+(UNIQUE\s+)?INDEX\s+(CONCURRENTLY\s+)?(IF\s+NOT\s+EXISTS\s+)?(\w+)\s+ON\s+\{schema\}\.(\w+)`)
	lockDropIndex   = regexp.MustCompile(`(?is)^DROP\s+INDEX\s+(CONCURRENTLY\s+)?(IF\s+EXISTS\s+)?\{schema\}\.(\w+)`)
	lockStorage     = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+\{schema\}\.(\w+)\s+(SET|RESET)\s*\(\s*(autovacuum_|toast\.|fillfactor)`)
	lockTable       = regexp.MustCompile(`(?is)^(ALTER\s+TABLE|DROP\s+TABLE|UPDATE|DELETE\s+FROM|INSERT\s+INTO)\s+(IF\s+EXISTS\s+)?\{schema\}\.(\w+)`)
)

// lockOf describes the table lock statement st takes ("" when it takes
// none on an existing table: it creates something new).
func lockOf(st string) string {
	if m := lockCreateIndex.FindStringSubmatch(st); m != nil {
		if m[2] != "" {
			return fmt.Sprintf("%s: SHARE UPDATE EXCLUSIVE while index %s builds (reads and writes go on)", m[5], m[4])
		}
		return fmt.Sprintf("%s: SHARE while index %s builds (writes wait)", m[5], m[4])
	}
	if m := lockDropIndex.FindStringSubmatch(st); m != nil {
		if m[1] != "" {
			return fmt.Sprintf("the table of index %s: SHARE UPDATE EXCLUSIVE while the index is dropped (reads and writes go on)", m[3])
		}
		return fmt.Sprintf("the table of index %s: ACCESS EXCLUSIVE (reads and writes wait)", m[3])
	}
	if m := lockStorage.FindStringSubmatch(st); m != nil {
		return fmt.Sprintf("%s: SHARE UPDATE EXCLUSIVE while its storage parameters change (reads and writes go on)", m[1])
	}
	if m := lockTable.FindStringSubmatch(st); m != nil {
		switch strings.ToUpper(strings.Fields(m[1])[0]) {
		case "ALTER", "DROP":
			return fmt.Sprintf("%s: ACCESS EXCLUSIVE (reads and writes wait)", m[3])
		default:
			return fmt.Sprintf("%s: ROW EXCLUSIVE, and the rows it writes", m[3])
		}
	}
	return ""
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
// lock held for the whole run. Pending migrations run in one transaction:
// either every one is applied and recorded, or none is; except that a
// migration marked to run without a transaction (Migration.NoTransaction:
// an index built CONCURRENTLY on a table that may be big) commits the
// migrations before it, then runs statement by statement and is recorded
// after its last statement. A run that starts from an empty schema, whose
// tables nothing uses yet, applies every migration in its one
// transaction, building those indexes without CONCURRENTLY.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int, error) {
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	return migrateTo(ctx, pool, schema, ms, len(ms))
}

// MigrateDown reverts schema to toVersion (0 removes every table the
// migrations created) and returns the versions it reverted, newest first.
// It runs under the schema's migration lock, in one transaction but for
// down files marked to run without one (see Migrate).
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
	done, err := migrateLocked(ctx, pool, schema, ms, target)
	if err != nil {
		return done, fmt.Errorf("migrate schema %s: %w", schema, err)
	}
	return done, nil
}

// migrateLocked is migrateTo on one connection that holds the schema's
// migration lock (a session lock, since a no-transaction migration
// commits part way) for the whole run.
func migrateLocked(ctx context.Context, pool *pgxpool.Pool, schema string, ms []Migration, target int) (done []int, err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	salt := lockSalt(schema, saltMigrate)
	if _, err := conn.Exec(ctx, sqlMigrationLock, salt); err != nil {
		return nil, err
	}
	defer func() {
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), sqlMigrationUnlock, salt); uerr != nil {
			// Ending the session releases its lock.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
			err = errors.Join(err, uerr)
		}
	}()
	if _, err := conn.Exec(ctx, render(sqlMigrationsInit, schema)); err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, render(sqlMigrationsApplied, schema))
	if err != nil {
		return nil, err
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, err
	}
	current := 0
	for i, v := range applied {
		if v != i+1 {
			return nil, fmt.Errorf("schema %s records versions %v: not a prefix of 1..n", schema, applied)
		}
		current = v
	}
	if current > len(ms) {
		return nil, fmt.Errorf("schema %s is at version %d, newer than this build knows (%d)", schema, current, len(ms))
	}
	type step struct {
		m    Migration
		down bool
	}
	var steps []step
	for v := current + 1; v <= target; v++ {
		steps = append(steps, step{ms[v-1], false})
	}
	for v := current; v > target; v-- {
		steps = append(steps, step{ms[v-1], true})
	}
	fresh := current == 0
	record := func(q interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, st step) error {
		var err error
		if st.down {
			_, err = q.Exec(ctx, render(sqlMigrationForget, schema), st.m.Version)
		} else {
			_, err = q.Exec(ctx, render(sqlMigrationRecord, schema), st.m.Version, st.m.Name)
		}
		return err
	}
	for len(steps) > 0 {
		if st := steps[0]; st.m.NoTransaction(st.down) && !fresh {
			for _, fileStmt := range statements(st.m.file(st.down)) {
				if err := execMigration(ctx, conn, schema, st.m, st.down, fileStmt); err != nil {
					return done, err
				}
			}
			if err := record(conn, st); err != nil {
				return done, err
			}
			done = append(done, st.m.Version)
			steps = steps[1:]
			continue
		}
		// The migrations up to the next no-transaction one, in one transaction.
		n := 1
		for n < len(steps) && (fresh || !steps[n].m.NoTransaction(steps[n].down)) {
			n++
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			for _, st := range steps[:n] {
				fileSQL := st.m.file(st.down)
				if st.m.NoTransaction(st.down) {
					// A fresh schema: nothing writes to its tables yet.
					fileSQL = concurrently.ReplaceAllString(fileSQL, "")
				}
				if err := execMigration(ctx, tx, schema, st.m, st.down, fileSQL); err != nil {
					return err
				}
				if err := record(tx, st); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return done, err
		}
		for _, st := range steps[:n] {
			done = append(done, st.m.Version)
		}
		steps = steps[n:]
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

// execMigration runs stmt, text of migration m's file (up, or down), in
// schema.
func execMigration(ctx context.Context, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, schema string, m Migration, down bool, stmt string) error {
	dir := "up"
	if down {
		dir = "down"
	}
	if _, err := q.Exec(ctx, render(stmt, schema)); err != nil {
		return fmt.Errorf("migration %d (%s) %s: %w", m.Version, m.Name, dir, err)
	}
	return nil
}
