package postgres_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/internal/enginetest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
)

// TestFleetBehindPgBouncerInTransactionPooling runs a fleet of engines
// (keys, gates, signals, children) through a real PgBouncer in
// transaction pooling mode, with fewer server connections than the
// engines' pools: with Options.PollOnly and a pool without server-side
// prepared statements, every instance ends done and no key ran over its
// limit (enginetest.Stress's recorder, outside the SDK).
func TestFleetBehindPgBouncerInTransactionPooling(t *testing.T) {
	bin := pgBouncerBinary(t)
	e := newEnv(t) // a migrated schema, reached directly
	url := startPgBouncer(t, bin, e.pool.Config().ConnConfig)
	cfg, err := pgxpool.ParseConfig(url + "&default_query_exec_mode=cache_describe")
	require.NoError(t, err)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	enginetest.Stress(t, func() store.Store {
		s, err := postgres.New(e.ctx, pool, postgres.Options{Schema: e.schema, PollOnly: true})
		require.NoError(t, err)
		return s
	}, enginetest.StressOptions{Engines: 3, Instances: 300, AcctKeys: 20, APIKeys: 4, Executors: 6, Timeout: 2 * time.Minute})
}

// pgBouncerBinary finds Debian's pgbouncer. Without it the test is
// skipped, or fails under CI=true (.ci/run installs it).
func pgBouncerBinary(t *testing.T) string {
	for _, p := range []string{"pgbouncer", "/usr/sbin/pgbouncer"} {
		if bin, err := exec.LookPath(p); err == nil {
			return bin
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("pgbouncer is not installed (CI=true, so this fails instead of skipping): apt-get install pgbouncer")
	}
	t.Skip("pgbouncer is not installed")
	return ""
}

// startPgBouncer runs pgbouncer in front of the server of direct, in
// transaction pooling mode with 4 server connections, until the test ends,
// and returns the URL of its database.
func startPgBouncer(t *testing.T, bin string, direct *pgx.ConnConfig) string {
	dir, err := os.MkdirTemp("", "pgbouncer")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755)) // pgbouncer may run as another user (below)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	ini := fmt.Sprintf(`[databases]
bounced = host=%s port=%d dbname=%s user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = 4
max_client_conn = 100
ignore_startup_parameters = extra_float_digits
`, direct.Host, direct.Port, direct.Database, direct.User, port, filepath.Join(dir, "users.txt"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "users.txt"), fmt.Appendf(nil, "%q \"\"\n", direct.User), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644))
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if u, err := user.Current(); err == nil && u.Uid == "0" {
		args = append([]string{"-u", "nobody"}, args...) // it refuses to run as root
	}
	var log bytes.Buffer // its log: stderr
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("pgbouncer's log:\n%s", log.String())
		}
	})
	url := fmt.Sprintf("postgres://%s@127.0.0.1:%d/bounced?sslmode=disable", direct.User, port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			_ = conn.Close(ctx)
			return url
		}
		if ctx.Err() != nil {
			t.Fatalf("pgbouncer did not accept connections: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
