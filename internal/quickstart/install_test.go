package quickstart

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReadmeInstallWorksFromAClone runs the README's install block, as it
// is, the way a user with a clone of the repository runs it: in a fresh
// module of their own outside the repository, whose code imports
// godurable (the quick start program), with the clone at the place the
// block names ($HOME/src/godurable, here a link to this repository under
// a HOME of the test's own). The module must then build, and the block's
// go install must have put a durable binary that runs in $GOBIN.
func TestReadmeInstallWorksFromAClone(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a separate module and the CLI")
	}
	root, readme := repoRoot(t)
	script, err := readmeBlock(readme, "install", "sh")
	if err != nil {
		t.Fatal(err)
	}
	src, err := quickstartSource(readme)
	if err != nil {
		t.Fatal(err)
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go command not found: %v", err)
	}

	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(root, filepath.Join(home, "src", "godurable")); err != nil {
		t.Fatal(err)
	}
	app := filepath.Join(home, "app")
	gobin := filepath.Join(home, "bin")
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(app, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	// The user's caches and module cache, so that nothing is downloaded
	// twice; their HOME is the test's, so that the block's paths resolve
	// to the link.
	env := append(os.Environ(), "HOME="+home, "GOBIN="+gobin, "GOWORK=off", "GOTOOLCHAIN=local")
	for _, v := range []string{"GOPATH", "GOMODCACHE", "GOCACHE"} {
		out, err := exec.Command(goCmd, "env", v).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", v, err)
		}
		env = append(env, v+"="+strings.TrimSpace(string(out)))
	}
	run := func(name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Env = app, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	run(goCmd, "mod", "init", "example.com/app") // the block's "a new one"
	run("sh", "-e", "-x", "-c", script)
	run(goCmd, "build", "-o", filepath.Join(home, "app-bin"), ".")
	if help := run(filepath.Join(gobin, "durable"), "help"); !strings.Contains(help, "usage: durable") {
		t.Fatalf("the installed durable printed:\n%s", help)
	}
	mod, err := os.ReadFile(filepath.Join(app, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mod), "require github.com/godurable/godurable") && !strings.Contains(string(mod), "\tgithub.com/godurable/godurable ") {
		t.Fatalf("go mod tidy left no requirement of godurable:\n%s", mod)
	}
}
