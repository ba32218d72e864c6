package main

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/godurable/godurable/internal/pgstatements"
	"github.com/jackc/pgx/v5"
)

// serverProfile reads where the server's time goes in each measured run,
// from pg_stat_statements (-server-profile): the statements the engines
// ran against the run's schema, by total execution time, per 10,000 steps.
// Comparisons (scenarios 4, 5, 6 and 11) measure several runs and print one
// result line; this prints every run, so that a round that went another way
// than the others (a plan, a mode of the engine) shows which statements
// made the difference. Statements are named as store/postgres names them
// (package pgstatements), and each run's rows are counted by the path that
// took them to their step (rowPaths). The extension must be loaded by the
// server (shared_preload_libraries); the bench creates it in its own
// database.
type serverProfile struct {
	url      string // the bench database
	top      int    // statements printed per run
	planning bool   // the server counts planning (pg_stat_statements.track_planning; read by check)
}

// profileStatementWidth is how much of a statement's text a line shows.
const profileStatementWidth = 90

// check creates the extension in the bench database and tells whether the
// server collects statements, with what to do when it does not, and
// whether it counts their planning.
func (p *serverProfile) check(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return fmt.Errorf("-server-profile: create extension pg_stat_statements: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1 FROM pg_stat_statements LIMIT 1"); err != nil {
		return fmt.Errorf("-server-profile needs the server to load pg_stat_statements "+
			"(ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements', then restart it): %w", err)
	}
	return conn.QueryRow(ctx, `SELECT current_setting('pg_stat_statements.track_planning')::bool`).Scan(&p.planning)
}

// reset forgets what the server collected so far, so that the next report
// covers one run. It runs after the run's inserts, before its engines start.
func (p *serverProfile) reset(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(ctx, "SELECT pg_stat_statements_reset()")
	return err
}

// profiledStatement is one statement's share of a run.
type profiledStatement struct {
	calls, rows          int64
	walRecords, walBytes int64
	total, plan          time.Duration // executing and planning; planning alone
	text                 string
}

// report prints the run's statements against schema, steps steps in all:
// the top ones by time, each per 10,000 steps with the WAL records it
// wrote a step, and the total of all of them. A statement's time is its
// execution and, when the server tracks it
// (pg_stat_statements.track_planning), its planning: a statement planned
// at every call can take longer to plan than to run. WAL records are
// a measure of a run's writes: a row's update that is not HOT writes one
// record for the heap and one for each index the new version enters. The
// report's own statements and the observer's are not the engines': they
// name no schema of the bench's.
func (p *serverProfile) report(ctx context.Context, w io.Writer, run, schema string, steps int64) error {
	conn, err := pgx.Connect(ctx, p.url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	rows, err := conn.Query(ctx, `SELECT calls, rows, wal_records, wal_bytes::bigint, total_exec_time, total_plan_time, query
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND strpos(query, $1) > 0
		ORDER BY total_exec_time + total_plan_time DESC`, pgx.Identifier{schema}.Sanitize()+".")
	if err != nil {
		return err
	}
	var all []profiledStatement
	var ms, planMS float64
	var s profiledStatement
	if _, err := pgx.ForEachRow(rows, []any{&s.calls, &s.rows, &s.walRecords, &s.walBytes, &ms, &planMS, &s.text}, func() error {
		s.plan = time.Duration(planMS * float64(time.Millisecond))
		s.total = time.Duration(ms*float64(time.Millisecond)) + s.plan
		all = append(all, s)
		return nil
	}); err != nil {
		return err
	}
	n := float64(max(steps, 1))
	per := 10000 / n
	var total, plan time.Duration
	var walRecords, walBytes int64
	for _, s := range all {
		total, plan = total+s.total, plan+s.plan
		walRecords, walBytes = walRecords+s.walRecords, walBytes+s.walBytes
	}
	planned := "planning not counted (pg_stat_statements.track_planning is off)"
	if p.planning {
		planned = fmt.Sprintf("%.0f ms of it planning", ms10k(plan, per))
	}
	fmt.Fprintf(w, "    server time of %s: %.0f ms per 10,000 steps, %s, %d statements; WAL %.1f records, %.0f bytes a step\n",
		run, ms10k(total, per), planned, len(all), float64(walRecords)/n, float64(walBytes)/n)
	paths := map[string]float64{}
	names := make([]string, len(all))
	for i, s := range all {
		name, ok := pgstatements.Name(s.text)
		if !ok {
			name = "?"
		}
		names[i] = name
		if p, ok := rowPaths[name]; ok {
			paths[p] += float64(s.rows) * per
		}
	}
	counts := make([]string, len(rowPathOrder))
	for i, p := range rowPathOrder {
		counts[i] = fmt.Sprintf("%s %.0f", p, paths[p])
	}
	fmt.Fprintf(w, "    rows per 10,000 steps of %s: %s\n", run, strings.Join(counts, ", "))
	for i, s := range all {
		if i == p.top {
			break
		}
		fmt.Fprintf(w, "      %6.0f ms (plan %5.0f) %6.0f calls %7.0f rows %5.1f WAL/step  %-22s %s\n", ms10k(s.total, per),
			ms10k(s.plan, per), float64(s.calls)*per, float64(s.rows)*per, float64(s.walRecords)/n,
			names[i], oneLine(s.text, schema, profileStatementWidth))
	}
	return nil
}

// rowPaths names, for each statement that starts, reserves, blocks or
// gives back rows, the path a run's profile counts its rows under. How a
// run's rows reached their steps (claims, hand-offs, successors) and how
// many were blocked on the way tells which mode the engine was in.
var rowPaths = map[string]string{
	"sqlClaim":        "claimed",
	"sqlHandOff":      "handed off",
	"sqlReserve":      "reserved",
	"sqlClaimReserve": "reserved",
	"sqlBlock":        "blocked",
	"sqlBlockMulti":   "blocked",
	"sqlBlockBacklog": "blocked",
	"sqlRelease":      "released",
}

// rowPathOrder is the order a profile prints the paths in.
var rowPathOrder = []string{"claimed", "handed off", "reserved", "blocked", "released"}

func ms10k(d time.Duration, per float64) float64 { return float64(d) / float64(time.Millisecond) * per }

var spaces = regexp.MustCompile(`\s+`)

// oneLine is a statement's text on one line, without its schema, cut to
// width characters.
func oneLine(q, schema string, width int) string {
	q = strings.ReplaceAll(q, pgx.Identifier{schema}.Sanitize()+".", "")
	q = strings.TrimSpace(spaces.ReplaceAllString(q, " "))
	if r := []rune(q); len(r) > width {
		q = string(r[:width]) + "…"
	}
	return q
}
