package main

import (
	"slices"
	"testing"

	"github.com/godurable/godurable/internal/pgstatements"
)

func TestOneLine(t *testing.T) {
	for _, c := range []struct {
		q     string
		width int
		want  string
	}{
		{"SELECT 1\n  FROM \"bench_s11b\".instances i\n\tWHERE i.id = $1", 200, "SELECT 1 FROM instances i WHERE i.id = $1"},
		{"UPDATE \"bench_s11b\".key_slots SET available = available - 1", 200, "UPDATE key_slots SET available = available - 1"},
		{"SELECT count(*) FROM \"bench_s11a\".instances", 200, "SELECT count(*) FROM \"bench_s11a\".instances"}, // another run's schema stays
		{"SELECT 'ééééééé'", 10, "SELECT 'éé…"},                                                                 // cut by characters, not bytes
	} {
		if got := oneLine(c.q, "bench_s11b", c.width); got != c.want {
			t.Errorf("oneLine(%q, %d) = %q, want %q", c.q, c.width, got, c.want)
		}
	}
}

// TestRowPathsNameStatements: every statement a profile counts rows of is
// one of store/postgres's, so that a rename does not silently zero a path.
func TestRowPathsNameStatements(t *testing.T) {
	all := pgstatements.Statements()
	for name := range rowPaths {
		if _, ok := all[name]; !ok {
			t.Errorf("rowPaths counts %s, which store/postgres does not have", name)
		}
		if !slices.Contains(rowPathOrder, rowPaths[name]) {
			t.Errorf("rowPaths counts %s under %q, which the profile does not print", name, rowPaths[name])
		}
	}
}
