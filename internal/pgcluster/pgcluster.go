// Package pgcluster runs a throwaway PostgreSQL cluster in a temporary
// directory, on its own port, that a test or the chaos tool may stop, start
// and restart at will without touching any server shared with other work.
//
// It needs initdb and postgres (PATH or /usr/lib/postgresql/*/bin). Run as
// root, the server runs as the postgres user, which owns the directory.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cluster is a PostgreSQL cluster this process owns.
type Cluster struct {
	dir, data, bin string
	port           int
	cred           *syscall.Credential
	logFile        string
	cmdArgs        []string

	mu  sync.Mutex
	cmd *exec.Cmd
	// exited is closed when the running server process has exited.
	exited chan struct{}
}

// Options configure Start.
type Options struct {
	// Dir is where the cluster lives (default: a new temporary directory,
	// removed by Remove).
	Dir string
	// Settings are extra "-c name=value" server settings.
	Settings map[string]string
}

// Available reports whether initdb and postgres can be found, and if not why.
func Available() error {
	_, err := binDir()
	return err
}

// Start creates a cluster with initdb and starts it. The server is killed
// (SIGQUIT) if this process dies without calling Remove.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir := opts.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "pgcluster-"); err != nil {
			return nil, err
		}
	}
	c := &Cluster{dir: dir, data: filepath.Join(dir, "data"), bin: bin, logFile: filepath.Join(dir, "server.log")}
	if c.cred, err = credential(dir); err != nil {
		c.Remove()
		return nil, err
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", c.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		c.Remove()
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	if c.port, err = freePort(); err != nil {
		c.Remove()
		return nil, err
	}
	args := []string{"-D", c.data, "-p", strconv.Itoa(c.port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "logging_collector=off"}
	keys := make([]string, 0, len(opts.Settings))
	for k := range opts.Settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+opts.Settings[k])
	}
	c.cmdArgs = args
	if err := c.StartServer(ctx); err != nil {
		c.Remove()
		return nil, err
	}
	return c, nil
}

// URL is the connection string of database db ("postgres" when empty).
func (c *Cluster) URL(db string) string {
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// Port is the TCP port the server listens on (the same across restarts).
func (c *Cluster) Port() int { return c.port }

// Dir is the cluster's directory.
func (c *Cluster) Dir() string { return c.dir }

// StartServer starts the server on its port and waits until it accepts
// connections. Starting a running server is an error.
func (c *Cluster) StartServer(ctx context.Context) error {
	c.mu.Lock()
	if c.cmd != nil {
		c.mu.Unlock()
		return errors.New("pgcluster: server already running")
	}
	log, err := os.OpenFile(c.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), c.cmdArgs...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT}
	if err := cmd.Start(); err != nil {
		c.mu.Unlock()
		_ = log.Close()
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = log.Close(); close(exited) }()
	c.cmd, c.exited = cmd, exited
	c.mu.Unlock()

	deadline := time.Now().Add(60 * time.Second)
	for {
		if err = ping(ctx, c.URL("")); err == nil {
			return nil
		}
		select {
		case <-exited:
			c.mu.Lock()
			c.cmd = nil
			c.mu.Unlock()
			return fmt.Errorf("pgcluster: postgres exited at start (see %s): %w", c.logFile, err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: postgres did not accept connections within 60s: %w", err)
		}
	}
}

// StopServer shuts the server down ("fast" mode: open transactions are
// rolled back and every connection is closed) and waits for it to exit.
// Stopping a stopped server does nothing.
func (c *Cluster) StopServer() error {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-exited:
		return nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		return errors.New("pgcluster: postgres ignored fast shutdown for 30s and was killed")
	}
}

// Restart stops the server, keeps it down for down, and starts it again on
// the same port.
func (c *Cluster) Restart(ctx context.Context, down time.Duration) error {
	if err := c.StopServer(); err != nil {
		return err
	}
	select {
	case <-time.After(down):
	case <-ctx.Done():
		return ctx.Err()
	}
	return c.StartServer(ctx)
}

// Remove stops the server and deletes the cluster's directory.
func (c *Cluster) Remove() {
	_ = c.StopServer()
	_ = os.RemoveAll(c.dir)
}

// CreateDatabase creates database name.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.URL(""))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	return err
}

func ping(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	return conn.Ping(ctx)
}

// credential runs the server as the postgres user when this process is root
// (initdb refuses root), giving it the directory.
func credential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root and there is no postgres user to run the server as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return versionOf(b) - versionOf(a) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("pgcluster: initdb not found in PATH or /usr/lib/postgresql/*/bin")
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
