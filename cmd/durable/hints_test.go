package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/internal/pgtest"
	"github.com/godurable/godurable/store"
)

// pasted runs a command line the CLI printed as a user pastes it into a
// shell: through sh, with the built binary first on PATH as durable, and
// env on top of an environment without DATABASE_URL.
func pasted(t *testing.T, cmdline string, env ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", cmdline)
	cmd.Env = append(os.Environ(), "DATABASE_URL=", "PATH="+filepath.Dir(binary)+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run %q: %v", cmdline, err)
	}
	return out.String(), errb.String(), code
}

var moreHint = regexp.MustCompile(`(?m)^more: (durable .*)$`)

// cliHintsWorkAsPasted checks that the next-page hint of ls carries the
// global flags the user gave, so that pasting it lists the next page of
// the same schema, wherever the flags were on the command line and
// whether the URL came from a flag or from $DATABASE_URL.
func cliHintsWorkAsPasted(t *testing.T, s *seeded) {
	newest, err := s.st.List(context.Background(), store.ListFilter{Newest: true})
	require.NoError(t, err)
	require.Greater(t, len(newest), 4)
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"flags before the command", nil, []string{"-database-url", s.url, "-schema", s.schema, "ls", "-limit", "2"}},
		{"flags after the command", nil, []string{"ls", "-limit", "2", "-schema=" + s.schema, "-database-url", s.url}},
		{"the URL from the environment", []string{"DATABASE_URL=" + s.url}, []string{"-schema", s.schema, "ls", "-limit", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runBinary(t, tc.env, tc.args...)
			require.Equal(t, 0, code, errOut)
			assert.Equal(t, []string{newest[0].ID, newest[1].ID}, ids(out))
			m := moreHint.FindStringSubmatch(out)
			require.NotNil(t, m, "no next-page hint in:\n%s", out)
			assert.Contains(t, m[1], "-schema "+s.schema)
			if tc.env != nil {
				assert.NotContains(t, m[1], "-database-url", "a URL the user did not give is left to the environment")
			}
			// Pasted in the same shell: its environment, nothing else.
			out, errOut, code = pasted(t, m[1], tc.env...)
			require.Equal(t, 0, code, "%s: %s", m[1], errOut)
			assert.Equal(t, []string{newest[2].ID, newest[3].ID}, ids(out), "the next page of the same schema")
		})
	}

	// A filtered page that stops at -scan says where to go on, with a
	// quoted value and the flags.
	out, errOut, code := runBinary(t, nil, "-database-url", s.url, "ls", "-schema", s.schema, "-workflow", "no such; workflow", "-scan", "3")
	require.Equal(t, 0, code, errOut)
	m := regexp.MustCompile(`older ones may match: (durable .*)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	assert.Contains(t, m[1], `-workflow 'no such; workflow'`)
	out, errOut, code = pasted(t, m[1])
	require.Equal(t, 0, code, "%s: %s", m[1], errOut)
	assert.Contains(t, out, "older ones may match: durable ls -workflow 'no such; workflow' -scan 3 -after "+newest[5].ID)
}

// The hint of a command run on a schema that was never migrated is the
// migrate command for that schema and database, which works as pasted.
func TestCLIMigrateHintWorksAsPasted(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t) // a schema of its own, not migrated
	url, schema := pgtest.URL(t), pgtest.SchemaOf(pool)
	_, errOut, code := runBinary(t, nil, "ls", "-database-url", url, "-schema", schema)
	require.Equal(t, 1, code)
	m := regexp.MustCompile("run `(durable [^`]*)` first").FindStringSubmatch(errOut)
	require.NotNil(t, m, errOut)
	assert.Contains(t, m[1], "-schema "+schema)
	out, errOut, code := pasted(t, m[1])
	require.Equal(t, 0, code, "%s: %s", m[1], errOut)
	assert.Contains(t, out, "schema "+schema+": applied")
	_, errOut, code = runBinary(t, nil, "ls", "-database-url", url, "-schema", schema)
	require.Equal(t, 0, code, errOut)
}

// durable show prints the state's object keys sorted by name (jsonb keeps
// no order of its own the user wrote), whatever order PostgreSQL returns.
func TestCLIShowSortsStateKeys(t *testing.T) {
	t.Parallel()
	s := migrated(t)
	e := newEngine(t, s.st)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	state := json.RawMessage(`{"d": 4, "bb": {"z": 1, "y": "<&>"}, "ccc": 3.50, "a": [2, 1]}`)
	id, err := e.Insert(ctx, "sync", state, durable.InsertOptions{})
	require.NoError(t, err)
	out := s.ok(t, "show", id)
	_, after, ok := strings.Cut(out, "state:\n")
	require.True(t, ok, out)
	st, _, _ := strings.Cut(after, "\n\n")
	assert.Equal(t, `  {
    "a": [
      2,
      1
    ],
    "bb": {
      "y": "<&>",
      "z": 1
    },
    "ccc": 3.50,
    "d": 4
  }`, st)
}
