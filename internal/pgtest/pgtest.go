// Package pgtest gives tests a PostgreSQL connection pool on a fresh schema
// that is dropped when the test ends.
//
// The server is found in this order: DATABASE_URL; the local default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable; a throwaway
// cluster started in a temporary directory when initdb and postgres are
// installed (PATH or /usr/lib/postgresql/*/bin). When none works the test is
// skipped, or fails when CI=true, so that CI never passes by skipping.
//
// A package that may start a throwaway cluster should call Main from its
// TestMain so that the cluster is stopped and removed at exit.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/godurable/godurable/internal/pgcluster"
)

// DefaultURL is tried when DATABASE_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// MaxConns is the size of the pools Pool returns.
const MaxConns = 16

var (
	once    sync.Once
	baseURL string
	baseErr error
	cluster *pgcluster.Cluster
)

// Pool returns a pool whose connections use a new, empty schema as their
// search_path (see SchemaOf). The pool is closed and the schema dropped when
// t ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := server(t)
	pool, schema, err := newSchemaPool(context.Background(), url)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dropSchema(ctx, url, schema); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", schema, err)
		}
	})
	return pool
}

func newSchemaPool(ctx context.Context, url string) (*pgxpool.Pool, string, error) {
	schema := "t_" + randomHex(8)
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, "", fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = admin.Close(ctx) }()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, "", fmt.Errorf("create schema: %w", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, "", err
	}
	cfg.MaxConns = MaxConns
	cfg.MaxConnIdleTime = 5 * time.Second
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	// Tests need visibility and locking, not durability: skip the commit fsync.
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", err
	}
	return pool, schema, nil
}

func dropSchema(ctx context.Context, url, schema string) error {
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer func() { _ = admin.Close(ctx) }()
	_, err = admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	return err
}

// Schemas hands out pools on schemas that are prepared once (for example
// migrated) and reset between tests instead of being created and dropped
// for each: a test gets a schema no other running test uses, in the state
// setup left it. Main drops them at exit.
type Schemas struct {
	setup, reset func(ctx context.Context, pool *pgxpool.Pool, schema string) error
	mu           sync.Mutex
	free         []*pooled
	made         []*pooled
	url          string
}

type pooled struct {
	pool   *pgxpool.Pool
	schema string
}

var reusable struct {
	sync.Mutex
	all []*Schemas
}

// NewSchemas returns a Schemas whose schemas are prepared by setup when made
// and by reset when a test that used one ends. A schema whose reset fails is
// dropped.
func NewSchemas(setup, reset func(ctx context.Context, pool *pgxpool.Pool, schema string) error) *Schemas {
	s := &Schemas{setup: setup, reset: reset}
	reusable.Lock()
	reusable.all = append(reusable.all, s)
	reusable.Unlock()
	return s
}

// Pool returns a pool on a prepared schema (see SchemaOf) for the duration of t.
func (s *Schemas) Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := server(t)
	ctx := context.Background()
	s.mu.Lock()
	s.url = url
	var p *pooled
	if n := len(s.free); n > 0 {
		p, s.free = s.free[n-1], s.free[:n-1]
	}
	s.mu.Unlock()
	if p == nil {
		pool, schema, err := newSchemaPool(ctx, url)
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		p = &pooled{pool: pool, schema: schema}
		s.mu.Lock()
		s.made = append(s.made, p)
		s.mu.Unlock()
		if err := s.setup(ctx, pool, schema); err != nil {
			t.Fatalf("pgtest: set up schema %s: %v", schema, err)
		}
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.reset(cctx, p.pool, p.schema); err != nil {
			t.Errorf("pgtest: reset schema %s: %v", p.schema, err)
			return
		}
		// Hold no connections while unused: the server's connection budget
		// is shared with every other test process.
		p.pool.Reset()
		s.mu.Lock()
		s.free = append(s.free, p)
		s.mu.Unlock()
	})
	return p.pool
}

func (s *Schemas) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.made {
		p.pool.Close()
		_ = dropSchema(ctx, s.url, p.schema)
	}
	s.made, s.free = nil, nil
}

// SchemaOf returns the schema of a pool made by Pool.
func SchemaOf(pool *pgxpool.Pool) string {
	return pool.Config().ConnConfig.RuntimeParams["search_path"]
}

// URL returns the connection string of the test server (skipping or failing
// t as Pool does when there is none).
func URL(t testing.TB) string {
	t.Helper()
	return server(t)
}

// Main runs the tests, then drops the schemas of every Schemas and stops a
// throwaway cluster if one was started. Use it from TestMain:
// func TestMain(m *testing.M) { pgtest.Main(m) }.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main without the exit: it returns the tests' exit code, for a
// TestMain that has its own cleanup to do before exiting.
func Run(m *testing.M) int {
	code := m.Run()
	reusable.Lock()
	for _, s := range reusable.all {
		s.close()
	}
	reusable.Unlock()
	if cluster != nil {
		cluster.Remove()
	}
	return code
}

func server(t testing.TB) string {
	t.Helper()
	once.Do(func() { baseURL, baseErr = findServer() })
	if baseErr != nil {
		fail(t, baseErr)
	}
	return baseURL
}

func fail(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("pgtest: no PostgreSQL for tests (CI=true, so this fails instead of skipping): %v; "+
			"set DATABASE_URL, run a server at %s, or install initdb/postgres", err, DefaultURL)
	}
	t.Skipf("pgtest: no PostgreSQL for tests: %v", err)
}

func findServer() (string, error) {
	var errs []error
	if os.Getenv("PGTEST_THROWAWAY") != "1" {
		if u := os.Getenv("DATABASE_URL"); u != "" {
			if err := ping(u); err == nil {
				return u, nil
			} else {
				errs = append(errs, fmt.Errorf("DATABASE_URL: %w", err))
			}
		}
		if err := ping(DefaultURL); err == nil {
			return DefaultURL, nil
		} else {
			errs = append(errs, fmt.Errorf("%s: %w", DefaultURL, err))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{"synchronous_commit": "off"}})
	if err != nil {
		errs = append(errs, fmt.Errorf("throwaway cluster: %w", err))
		return "", errors.Join(errs...)
	}
	cluster = c
	return c.URL(""), nil
}

func ping(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	return conn.Ping(ctx)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
