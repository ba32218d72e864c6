package enginepg

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/internal/pgcluster"
	"github.com/godurable/godurable/internal/pgstoretest"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/steps"
	"github.com/godurable/godurable/store/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// pgStore returns a store (with history) on a migrated schema of the shared server.
func pgStore(t *testing.T) (*postgres.Store, *pgxpool.Pool) {
	t.Helper()
	pool := pgstoretest.Migrated.Pool(t)
	s, err := postgres.New(context.Background(), pool, postgres.Options{Schema: pgtest.SchemaOf(pool), History: true})
	require.NoError(t, err)
	return s, pool
}

// logBuffer is a goroutine-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) Count(s string) int { return strings.Count(b.String(), s) }

func (b *logBuffer) logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: level}))
}

func fastRetry(n int) steps.RetryPolicy {
	return steps.RetryPolicy{MaxAttempts: n, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, RandomizationFactor: -1}
}

// engine builds an engine on st with fast polling and the given definitions.
func engine(t *testing.T, cfg durable.Config, defs ...durable.Definition) *durable.Engine {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if cfg.ReaperInterval == 0 {
		cfg.ReaperInterval = 100 * time.Millisecond
	}
	e, err := durable.New(cfg)
	require.NoError(t, err)
	require.NoError(t, e.Register(defs...))
	return e
}

func startEngine(t *testing.T, e *durable.Engine) {
	t.Helper()
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Stop(ctx)
	})
}

func waitCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// throwaway starts a private cluster for tests that stop the database. It
// fails under CI=true when none can be started, and skips otherwise.
func throwaway(t *testing.T) *pgcluster.Cluster {
	t.Helper()
	if err := pgcluster.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no PostgreSQL binaries to start a throwaway cluster (CI=true): %v", err)
		}
		t.Skipf("no throwaway cluster: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err)
	t.Cleanup(c.Remove)
	return c
}
