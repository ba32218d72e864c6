package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// table writes aligned columns; call flush when done.
func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// age is a duration for people: whole seconds above a second, "-" for zero.
func age(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Second && d > -time.Second:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// when is a time with how far it is from now ("-" for the zero time).
func when(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now)
	rel := "now"
	switch {
	case d > 0:
		rel = "in " + age(d)
	case d < 0:
		rel = age(-d) + " ago"
	}
	return fmt.Sprintf("%s (%s)", t.UTC().Format(time.RFC3339), rel)
}

// orDash is s, or "-" when empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
