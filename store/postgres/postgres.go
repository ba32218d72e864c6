// Package postgres is the PostgreSQL backend of godurable, on pgx/v5.
//
// Every rule of store.Store is enforced inside PostgreSQL transactions, so
// that any number of engines sharing one database can never over-admit a
// key: a second executing row of a K = 1 key is rejected by a unique partial
// index, and a gate's slot counters carry a CHECK (0 <= available <=
// capacity), debited in the claim's transaction.
//
// The tables live in one schema (Options.Schema, default "durable"), created
// and upgraded by Migrate (or `durable migrate`). All SQL is in sql.go; the
// admission rules are in admission.go.
//
// Operating notes:
//   - Every method that takes a time uses it as "now" in SQL
//     (coalesce($now, now())); a zero time is the database clock.
//   - Workers are woken through LISTEN/NOTIFY on the channel Channel(schema),
//     with the queue name as payload. Listen holds one connection of its own.
//   - A claim holds one advisory lock per distinct K = 1 key in its window,
//     and an outcome batch one per K = 1 key it frees; unique-key inserts
//     take at most 1024. Very large windows or batches with many concurrent
//     transactions may need a larger max_locks_per_transaction.
//   - Crash paths (Reap, ReclaimWorker) do not credit gate slots; Reconcile
//     recomputes every counter from the executing rows, promotes blocked
//     rows whose key has room and deletes idle counters. Run it periodically.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultSchema is the schema used when Options.Schema is empty.
const DefaultSchema = "durable"

// Options configure a Store.
type Options struct {
	// Schema is the schema holding the tables (default DefaultSchema). It
	// must pass ValidateSchema and have been migrated with Migrate.
	Schema string
	// History records every committed step run (Outcome.History) so that
	// Store.History can return it. Off by default: it costs one insert per
	// outcome batch.
	History bool
	// Clock, if set, is the "now" of the calls that take no time from
	// their caller: Insert and InsertTx (whether a row with a RunAt is due
	// at once, and its creation time) and SyncSchedules (a new schedule's
	// anchor). Default: the database's now(). durabletest sets its fake
	// clock here, so that a fake clock behind or ahead of the database's
	// gives the same results.
	Clock func() time.Time
	// PollOnly keeps no session state, for a pool behind a connection
	// pooler in transaction pooling mode (PgBouncer's pool_mode =
	// transaction), where consecutive transactions may run on different
	// server connections: the store never LISTENs (Listen only waits for
	// its context), so engines find new work by polling
	// (durable.Config.PollInterval, which such a fleet sets low) and the
	// cancel of a running step at their next heartbeat. Every other
	// statement keeps its state within its transaction. The pool must not
	// use server-side prepared statements across transactions either:
	// configure it with default_query_exec_mode=cache_describe (pgx; exec
	// and simple_protocol cannot encode its array arguments). Run Migrate
	// on a direct connection.
	PollOnly bool
}

// Store implements store.Store and store.Notifier on a pgx pool. It does not
// own the pool: Close does not close it.
type Store struct {
	pool    *pgxpool.Pool
	schema  string
	history bool
	clock   func() time.Time
	// pollOnly: see Options.PollOnly.
	pollOnly bool
	// copyMin is the smallest batch that Insert copies in (copyInsertMin;
	// tests and benchmarks change it).
	copyMin int
	// optimisticWait is the lock_timeout of an optimistic claim's wait for
	// its counters (optimisticLockWait; tests that hold the counters on
	// purpose lengthen it).
	optimisticWait string
	// listenWait bounds a first listen's wait for the first claim (see
	// listenConn; tests change it).
	listenWait time.Duration
	// channel is the LISTEN/NOTIFY channel of the schema; its payloads are queue names.
	channel string
	// cancelChannel carries the ids of executing instances whose cancel
	// was requested.
	cancelChannel string
	// keySalt and uniqueSalt seed the advisory-lock hashes of concurrency keys
	// and unique keys, so that schemas sharing a database do not contend.
	keySalt    int64
	uniqueSalt int64
	queueSalt  int64
	closed     atomic.Bool
	stmts      sync.Map // statement constant -> rendered text
	wakes      wakeSender
	// inserting counts the Insert calls in flight (see insertPlan.wakeAfter).
	inserting  atomic.Int32
	hot        recentKeys   // keys recently found saturated (see recentKeys)
	late       lateHeal     // stranded keys heal gave up on (see lateHeal)
	settled    recentKeys   // gate keys whose counters were recently found as their limits make them
	debitsLost atomic.Int64 // optimistic claims made again (a counter changed under them, or their wait timed out)
	windows    windows      // per queue, the keyed rows the last claim passed over
	claimed    *event       // the store's first claim returned (see listenConn)
	// freeWarmKey names, in a connection's custom data, that the
	// connection planned the statements that free slots (see queueFreeing).
	freeWarmKey string
}

var (
	_ store.Store    = (*Store)(nil)
	_ store.Notifier = (*Store)(nil)
)

// New returns a Store on pool. It fails if the schema is invalid or not
// migrated to the version this build expects (run Migrate first).
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, errors.New("postgres: nil pool")
	}
	if opts.Schema == "" {
		opts.Schema = DefaultSchema
	}
	if err := ValidateSchema(opts.Schema); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	applied, err := AppliedVersions(ctx, pool, opts.Schema)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if len(applied) != len(ms) {
		return nil, fmt.Errorf("postgres: schema %s is at version %d, this build needs %d: run Migrate",
			opts.Schema, len(applied), len(ms))
	}
	return &Store{
		pool:           pool,
		schema:         opts.Schema,
		history:        opts.History,
		clock:          opts.Clock,
		pollOnly:       opts.PollOnly,
		copyMin:        copyInsertMin,
		optimisticWait: strconv.FormatInt(optimisticLockWait.Milliseconds(), 10) + "ms",
		channel:        Channel(opts.Schema),
		cancelChannel:  CancelChannel(opts.Schema),
		keySalt:        lockSalt(opts.Schema, saltKeys),
		uniqueSalt:     lockSalt(opts.Schema, saltUnique),
		queueSalt:      lockSalt(opts.Schema, saltQueues),
		listenWait:     listenWait,
		claimed:        newEvent(),
		freeWarmKey:    "godurable/" + opts.Schema + "/free",
	}, nil
}

// Schema returns the schema the store works in.
func (s *Store) Schema() string { return s.schema }

// Close marks the store closed: later calls return store.ErrClosed. The pool
// stays open (it belongs to the caller).
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}

func (s *Store) check() error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	return nil
}

// q returns stmt with the store's schema in it.
func (s *Store) q(stmt string) string {
	if v, ok := s.stmts.Load(stmt); ok {
		return v.(string)
	}
	r := render(stmt, s.schema)
	s.stmts.Store(stmt, r)
	return r
}

// Channel returns the LISTEN/NOTIFY channel of a schema.
func Channel(schema string) string {
	c := "godurable_" + schema
	if len(c) > 63 {
		c = fmt.Sprintf("godurable_%016x", uint64(lockSalt(schema, saltChannel)))
	}
	return c
}

// CancelChannel returns the LISTEN/NOTIFY channel on which a schema's
// store announces the executing instances whose cancel was requested.
func CancelChannel(schema string) string {
	c := "godurable_cancel_" + schema
	if len(c) > 63 {
		c = fmt.Sprintf("godurable_cancel_%016x", uint64(lockSalt(schema, saltChannel)))
	}
	return c
}

// Advisory lock purposes; each salts the lock hashes differently.
const (
	saltKeys      = "keys"
	saltUnique    = "unique"
	saltMigrate   = "migrate"
	saltLimits    = "limits"
	saltChannel   = "channel"
	saltPolicies  = "policies"
	saltQueues    = "queues"
	saltSchedules = "schedules"
)

// lockSalt derives a stable 64-bit value from a schema and a purpose.
func lockSalt(schema, purpose string) int64 {
	h := fnv.New64a()
	h.Write([]byte("godurable\x00" + schema + "\x00" + purpose))
	return int64(h.Sum64())
}

// querier is what both a pool and a transaction offer.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// inTx runs fn in a READ COMMITTED transaction.
func (s *Store) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
}

// tsArg is a timestamp parameter: NULL for the zero time (the database clock).
func tsArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// clockNow is Options.Clock's time as a query argument (nil: the
// database's now()).
func (s *Store) clockNow() *time.Time {
	if s.clock == nil {
		return nil
	}
	return tsPtr(s.clock())
}

func tsPtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	p := new(time.Time) // not &t: t would be moved to the heap even when zero
	*p = t
	return p
}

func fromPtr(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// jsonArg is a JSON parameter passed as text (NULL when empty).
func jsonArg(b []byte) *string {
	if len(b) == 0 {
		return nil
	}
	s := string(b)
	return &s
}

// micros is a duration as whole microseconds.
func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// pgCode returns the SQLSTATE of err ("" if it is not a PostgreSQL error).
func pgCode(err error) (code, constraint string) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code, pe.ConstraintName
	}
	return "", ""
}

const (
	codeUniqueViolation = "23505"
)

// refused marks an error of class 22 (data exception: text with a NUL byte,
// JSON that jsonb cannot hold, a number out of range) as store.ErrInvalid,
// so that callers can tell a value PostgreSQL will never accept from a
// database that is unreachable.
func refused(err error) error {
	if code, _ := pgCode(err); len(code) == 5 && code[:2] == "22" {
		return fmt.Errorf("%w: %w", store.ErrInvalid, err)
	}
	return err
}

// instanceRow is a scanned instance with the columns the contract's
// Instance does not carry.
type instanceRow struct {
	store.Instance
	timedOut bool
}

// scanInstance scans the instance columns (see sql.go).
func scanInstance(row pgx.Row) (store.Instance, error) {
	r, err := scanInstanceRow(row)
	return r.Instance, err
}

// scanInstanceRow scans the instance columns (see sql.go), then extra.
func scanInstanceRow(row pgx.Row, extra ...any) (instanceRow, error) {
	var rs rowScan
	return rs.scan(row, extra...)
}
