package ui_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/ui"
)

// TestReadmeRoutesServeTheirPages requests every route of the README's
// table of the page's routes, with an instance's id for ID and a key for
// NAME:ID, under a prefix as a mounted page has, and requires the page
// the table names.
func TestReadmeRoutesServeTheirPages(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	rows := regexp.MustCompile("(?m)^\\| `(/[^`]*)` \\| ([^|]+) \\|$").FindAllStringSubmatch(string(readme), -1)
	require.Len(t, rows, 4, "the README's table of routes")

	f := newFixture(t, memory.New(memory.Options{}))
	mux := http.NewServeMux()
	mux.Handle("/durable/", ui.Handler(f.st, ui.Options{Prefix: "/durable"}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := client(t)
	seen := map[string]bool{}
	for _, r := range rows {
		route := strings.NewReplacer("NAME:ID", url.QueryEscape(f.key), "ID", f.awaiting, "=W", "=approve", "=S", "=awaiting",
			"=Q", "=mail", "=K", "=").Replace(r[1])
		route = strings.Replace(route, "after="+f.awaiting, "after=", 1)
		code, body := get(t, c, srv.URL+"/durable"+route)
		require.Equal(t, http.StatusOK, code, "%s: %s", route, body)
		switch {
		case strings.HasPrefix(r[1], "/instances/"):
			assert.Contains(t, body, f.awaiting, route)
			assert.Contains(t, body, "approval", "the awaited signal")
		case strings.HasPrefix(r[1], "/instances"):
			assert.Contains(t, body, f.awaiting, route)
			assert.NotContains(t, body, f.holder, "filtered by workflow, status and queue")
		case strings.HasPrefix(r[1], "/key"):
			assert.Contains(t, body, f.holder, "the key's holder")
		}
		seen[strings.TrimSpace(r[2])] = true
	}
	assert.Len(t, seen, 4)
}
