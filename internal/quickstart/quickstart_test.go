package quickstart

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/godurable/godurable/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// wantOutput is what the README says the quick start prints.
const wantOutput = "order A-1: charged 1250 cents\n"

// readmeBlock returns the code of the README's block called name: the
// fenced block of language lang between <!-- name:begin --> and
// <!-- name:end -->.
func readmeBlock(readme, name, lang string) (string, error) {
	begin, end := "<!-- "+name+":begin -->", "<!-- "+name+":end -->"
	_, rest, ok := strings.Cut(readme, begin)
	if !ok {
		return "", errors.New("no " + begin + " in README.md")
	}
	block, _, ok := strings.Cut(rest, end)
	if !ok {
		return "", errors.New("no " + end + " after " + begin)
	}
	block = strings.TrimSpace(block)
	code, ok := strings.CutPrefix(block, "```"+lang+"\n")
	if !ok {
		return "", errors.New("the " + name + " block does not open with ```" + lang)
	}
	code, ok = strings.CutSuffix(code, "```")
	if !ok {
		return "", errors.New("the " + name + " block does not close with ```")
	}
	return code, nil
}

// quickstartSource returns the Go program of the README's quick start.
func quickstartSource(readme string) (string, error) { return readmeBlock(readme, "quickstart", "go") }

// repoRoot is the repository this test runs in, and its README.
func repoRoot(t *testing.T) (root, readme string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return root, string(b)
}

var goDirective = regexp.MustCompile(`(?m)^go (\S+)$`)

func TestReadmeQuickStartBuildsAndRunsAsAUserModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a separate module")
	}
	root, readme := repoRoot(t)
	src, err := quickstartSource(readme)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(src, "package main\n") {
		t.Fatalf("the quick start must be a complete program (package main), got:\n%.200s", src)
	}
	if strings.Contains(src, "/internal/") {
		t.Fatal("the quick start imports an internal package, which a user cannot")
	}
	rootMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := goDirective.FindSubmatch(rootMod)
	if goVersion == nil {
		t.Fatal("no go directive in go.mod")
	}
	goSum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	mod := "module example.com/quickstart\n\ngo " + string(goVersion[1]) + "\n\n" +
		"require github.com/godurable/godurable v0.0.0-00010101000000-000000000000\n\n" +
		"replace github.com/godurable/godurable => " + root + "\n"
	for name, data := range map[string][]byte{"go.mod": []byte(mod), "go.sum": goSum, "main.go": []byte(src)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go command not found: %v", err)
	}
	bin := filepath.Join(dir, "quickstart")
	build := exec.Command(goCmd, "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the README quick start: %v\n%s", err, out)
	}

	dbURL := freshDatabase(t, pgtest.URL(t))
	// Twice: a user runs it again, on the schema the first run migrated.
	for run := 1; run <= 2; run++ {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		cancel()
		if err != nil {
			t.Fatalf("run %d of the quick start: %v\nstdout:\n%s\nstderr:\n%s", run, err, stdout.String(), stderr.String())
		}
		if stdout.String() != wantOutput {
			t.Fatalf("run %d printed %q, the README promises %q (stderr: %s)", run, stdout.String(), wantOutput, stderr.String())
		}
	}
}

// freshDatabase creates an empty database on the server of serverURL,
// dropped when t ends, and returns its URL: the quick start migrates its
// own schema, which must not meet any other test's.
func freshDatabase(t *testing.T, serverURL string) string {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("need a postgres:// URL for the test server, got %q (%v)", serverURL, err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "quickstart_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(ctx) }()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, serverURL)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer func() { _ = admin.Close(ctx) }()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}

func TestQuickstartSourceNeedsBothMarkers(t *testing.T) {
	const beginMarker, endMarker = "<!-- quickstart:begin -->", "<!-- quickstart:end -->"
	code, err := quickstartSource("x\n" + beginMarker + "\n```go\npackage main\n```\n" + endMarker + "\n")
	if err != nil || code != "package main\n" {
		t.Fatalf("got %q, %v", code, err)
	}
	if _, err := quickstartSource(beginMarker + "\n```go\npackage main\n```\n"); err == nil {
		t.Fatal("a block without its end marker was accepted")
	}
	if _, err := readmeBlock(beginMarker+"\n```sh\ngo mod tidy\n```\n"+endMarker, "quickstart", "go"); err == nil {
		t.Fatal("a block of another language was accepted")
	}
	if _, err := quickstartSource("no markers"); err == nil {
		t.Fatal("a README without markers was accepted")
	}
}
