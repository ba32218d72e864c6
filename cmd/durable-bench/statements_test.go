package main

import "testing"

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
