package ui

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/explain"
	"github.com/godurable/godurable/store"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticRoot embed.FS

// staticFS serves static/ at /static/.
var staticFS fs.FS = staticRoot

// pages are the parsed templates, one set per page, each with the layout.
type pages struct {
	byName map[string]*template.Template
}

var funcs = template.FuncMap{
	// ts is a time in UTC, or "-" for the zero time.
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	// rel is how far t is from now ("3s ago", "in 5s").
	"rel": func(t, now time.Time) string {
		if t.IsZero() {
			return "-"
		}
		d := t.Sub(now)
		switch {
		case d > 0:
			return "in " + explain.Age(d)
		case d < 0:
			return explain.Age(-d) + " ago"
		}
		return "now"
	},
	"age":   explain.Age,
	"i64":   func(n int) int64 { return int64(n) },
	"barOf": barOf,
	"orDash": func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	},
	"indent": indentJSON,
	// keys are every key of an instance, its first key first.
	"keys": store.Instance.KeyList,
	// join joins keys with commas.
	"join": func(keys []string) string { return strings.Join(keys, ", ") },
}

func mustParsePages() *pages {
	layout := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html"))
	p := &pages{byName: map[string]*template.Template{}}
	for _, name := range []string{"overview", "key", "instances", "instance", "confirm", "queueconfirm", "message"} {
		t := template.Must(template.Must(layout.Clone()).ParseFS(templateFS, "templates/"+name+".html"))
		p.byName[name] = t
	}
	return p
}

// page is what every template gets: the layout's fields and the page's own D.
type page struct {
	Title    string
	Nav      string
	Prefix   string
	ReadOnly bool
	CSRF     string
	Now      time.Time
	// RefreshMS is the overview's refresh interval in milliseconds.
	RefreshMS   int64
	RefreshText string
	D           any
}

// render writes the named page (or one of its templates, for fragments)
// with status, buffering it so that a template error is a clean 500.
func (s *server) render(w http.ResponseWriter, r *http.Request, status int, name, tmpl string, p page) {
	p.Prefix = s.opts.Prefix
	p.ReadOnly = s.opts.ReadOnly
	p.RefreshMS = s.opts.Refresh.Milliseconds()
	p.RefreshText = s.opts.Refresh.String()
	if p.Now.IsZero() {
		p.Now = s.now()
	}
	if !s.opts.ReadOnly {
		p.CSRF = s.csrfToken(w, r)
	}
	var b bytes.Buffer
	if err := s.pages.byName[name].ExecuteTemplate(&b, tmpl, p); err != nil {
		slog.Error("durable ui: render", "page", name, "err", err)
		http.Error(w, "durable ui: the page failed to render", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// fail shows err on a message page; store errors an operator may meet get
// plain words.
func (s *server) fail(w http.ResponseWriter, r *http.Request, status int, title string, err error) {
	msg := err.Error()
	switch {
	case errors.Is(err, store.ErrNotFound):
		status, msg = http.StatusNotFound, "No such instance (check the id, and that the page reads the right schema)."
	case errors.Is(err, store.ErrClosed):
		status = http.StatusServiceUnavailable
	}
	s.render(w, r, status, "message", "layout.html", page{Title: title, D: msg})
}

func (s *server) now() time.Time { return s.opts.Now().UTC().Truncate(time.Microsecond) }

// overviewData is the live part of the overview.
type overviewData struct {
	At       time.Time
	Queues   []queueView
	Gates    []store.GateHealth
	Rates    []store.RateHealth
	Policies []policyView
	Warnings []gate.Warning
	// Snapshot is the oldest snapshot kept alive in the database
	// (store.Health, OldestSnapshot): shown when it is old.
	Snapshot store.SnapshotHealth
	// Engine is true when an engine gave its own view: the last reconcile
	// (nil before its first sweep), stale outcomes and deployment skew.
	Engine        bool
	LastReconcile *durable.ReconcileHealth
	Totals        durable.ReconcileHealth
	StaleOutcomes int64
	Skipped       []durable.SkewHealth
}

// loadOverview reads one Health snapshot (bounded as store.Health
// documents) and the stored queue policies.
func (s *server) loadOverview(ctx context.Context) (overviewData, error) {
	now := s.now()
	d := overviewData{At: now}
	var qs []store.QueueHealth
	if e := s.opts.Engine; e != nil {
		h, err := e.Health(ctx)
		if err != nil {
			return d, err
		}
		qs, d.Gates, d.Rates, d.Warnings, d.Snapshot = h.Queues, h.Gates, h.RateLimits, h.Warnings, h.OldestSnapshot
		d.Engine, d.LastReconcile, d.Totals, d.StaleOutcomes, d.Skipped = true, h.LastReconcile, h.ReconcileTotals, h.StaleOutcomes, h.Skipped
	} else {
		h, err := s.st.Health(ctx, now)
		if err != nil {
			return d, err
		}
		qs, d.Gates, d.Rates, d.Warnings, d.Snapshot = h.Queues, h.Gates, h.RateLimits, h.Warnings, h.OldestSnapshot
	}
	paused, err := s.st.PausedQueues(ctx)
	if err != nil {
		return d, err
	}
	d.Queues = queueViews(qs, paused)
	pol, err := s.st.ListConcurrencyPolicies(ctx)
	if err != nil {
		return d, err
	}
	for _, p := range pol {
		v := policyView{ConcurrencyPolicy: p}
		for _, q := range d.Queues {
			if q.Queue == p.Queue {
				v.Active, v.BlockedReady, v.SaturatedKeys, v.SaturatedKeysCapped = q.Active, q.BlockedReady, q.SaturatedKeys, q.SaturatedKeysCapped
				v.BlockedMore = q.BlockedReady >= store.BlockedReadyLimit
			}
		}
		d.Policies = append(d.Policies, v)
	}
	return d, nil
}

// queueView is a queue of the overview: its health, and its pause.
type queueView struct {
	store.QueueHealth
	Paused   bool
	PausedAt time.Time
}

// queueViews merges the queues of Health with the paused ones, which are
// listed even without rows, sorted by queue.
func queueViews(qs []store.QueueHealth, paused []store.QueuePause) []queueView {
	at := map[string]time.Time{}
	for _, p := range paused {
		at[p.Queue] = p.PausedAt
	}
	out := make([]queueView, 0, len(qs)+len(paused))
	for _, q := range qs {
		t, ok := at[q.Queue]
		out = append(out, queueView{QueueHealth: q, Paused: ok, PausedAt: t})
		delete(at, q.Queue)
	}
	for _, p := range paused {
		if _, ok := at[p.Queue]; ok {
			out = append(out, queueView{QueueHealth: store.QueueHealth{Queue: p.Queue}, Paused: true, PausedAt: p.PausedAt})
		}
	}
	slices.SortFunc(out, func(a, b queueView) int { return strings.Compare(a.Queue, b.Queue) })
	return out
}

// policyView is a stored queue policy with its pressure from Health: the
// ready rows a full MaxActive holds back (BlockedMore: more than
// store.BlockedReadyLimit − 1) and the keys at MaxActivePerKey.
type policyView struct {
	store.ConcurrencyPolicy
	Active              int64
	BlockedReady        int64
	BlockedMore         bool
	SaturatedKeys       int
	SaturatedKeysCapped bool
}

// BlockedText is BlockedReady as the CLI prints it (">100" past the bound).
func (p policyView) BlockedText() string {
	if p.BlockedMore {
		return fmt.Sprintf(">%d", store.BlockedReadyLimit-1)
	}
	return strconv.FormatInt(p.BlockedReady, 10)
}

// snapshot is the overview's last snapshot, shared by every viewer: the
// page and its refreshes are served from it, and a snapshot older than
// half the refresh interval is replaced in the background, so a viewer
// never waits for the store's Health (which counts every ready row: about
// 90 ms at a million of them) unless nobody looked for two intervals. The
// page shows when its snapshot was taken.
type snapshot struct {
	mu         sync.Mutex
	d          overviewData
	taken      time.Time // wall clock
	ok         bool
	refreshing bool
}

// overviewData returns the shared snapshot, taking it now when there is
// none or it is older than two refresh intervals.
func (s *server) overviewData(r *http.Request) (overviewData, error) {
	c := &s.snap
	c.mu.Lock()
	defer c.mu.Unlock()
	age := time.Since(c.taken)
	if !c.ok || age >= 2*s.opts.Refresh {
		d, err := s.loadOverview(r.Context())
		if err != nil {
			return d, err
		}
		c.d, c.taken, c.ok = d, time.Now(), true
		return d, nil
	}
	if age >= s.opts.Refresh/2 && !c.refreshing {
		c.refreshing = true
		go s.refreshSnapshot()
	}
	return c.d, nil
}

// forget drops the snapshot, so that the next view reads the store again:
// an action's result shows at once.
func (c *snapshot) forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ok = false
}

// refreshSnapshot replaces the snapshot (a failed read keeps the old one:
// the page shows its time, so its age is visible).
func (s *server) refreshSnapshot() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := s.loadOverview(ctx)
	c := &s.snap
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshing = false
	if err != nil {
		slog.Warn("durable ui: overview refresh", "err", err)
		return
	}
	c.d, c.taken, c.ok = d, time.Now(), true
}

func (s *server) overview(w http.ResponseWriter, r *http.Request) {
	d, err := s.overviewData(r)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, "Overview", fmt.Errorf("health: %w", err))
		return
	}
	s.render(w, r, http.StatusOK, "overview", "layout.html", page{Title: "Overview", Nav: "overview", Now: d.At, D: d})
}

// overviewLive is the overview's live section alone, which the page's
// script fetches every Refresh.
func (s *server) overviewLive(w http.ResponseWriter, r *http.Request) {
	d, err := s.overviewData(r)
	if err != nil {
		http.Error(w, "health: "+err.Error(), http.StatusInternalServerError)
		return
	}
	s.render(w, r, http.StatusOK, "overview", "live", page{Now: d.At, D: d})
}

// keyData is the key page: the form, and the explanation when a key is given.
type keyData struct {
	Key   string
	Error string
	X     *explain.Explanation
}

// HoldersOthers is true when a holder of the key holds other keys too:
// the holders table then has a column for them.
func (d keyData) HoldersOthers() bool {
	return d.X != nil && slices.ContainsFunc(d.X.Holders, func(h explain.Holder) bool { return len(h.OtherKeys) > 0 })
}

// WaitersOthers is true when the next or oldest waiter has other keys:
// the waiters table then has a column for them.
func (d keyData) WaitersOthers() bool {
	return d.X != nil && ((d.X.Waiting.Next != nil && len(d.X.Waiting.Next.OtherKeys) > 0) ||
		(d.X.Waiting.Oldest != nil && len(d.X.Waiting.Oldest.OtherKeys) > 0))
}

func (s *server) key(w http.ResponseWriter, r *http.Request) {
	d := keyData{Key: r.URL.Query().Get("key")}
	now := s.now()
	if d.Key != "" {
		if k, err := gate.Parse(d.Key); err != nil || k.IsZero() {
			d.Error = "not a concurrency key: want name:id (for example account:42)"
		} else if x, err := explain.Key(r.Context(), s.st, d.Key, now); err != nil {
			d.Error = "explain: " + err.Error()
		} else {
			d.X = &x
		}
	}
	title := "Key"
	if d.Key != "" {
		title = "Key " + d.Key
	}
	status := http.StatusOK
	if d.Error != "" {
		status = http.StatusBadRequest
	}
	s.render(w, r, status, "key", "layout.html", page{Title: title, Nav: "key", Now: now, D: d})
}

// statuses are the statuses an instance list may filter on.
var statuses = []store.Status{store.StatusReady, store.StatusBlocked, store.StatusExecuting, store.StatusAwaiting,
	store.StatusChildren, store.StatusDone, store.StatusFailed, store.StatusCanceled}

// instancesData is one page of the instance list.
type instancesData struct {
	Filter   store.ListFilter
	Statuses []store.Status
	Rows     []store.Instance
	// Next is the cursor of the next page ("" on the last page); Paged is
	// true when this is not the first page.
	Next  string
	Paged bool
	// Stopped is true when the page stopped after looking at Scanned
	// instances (Options.ScanLimit) with fewer matches than a page: Next
	// then continues the scan.
	Stopped bool
	Scanned int
	Error   string
}

func (s *server) instances(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.ListFilter{Workflow: q.Get("workflow"), Key: q.Get("key"), Queue: q.Get("queue"),
		AfterID: q.Get("after"), Newest: true, Limit: s.opts.PageSize + 1}
	d := instancesData{Statuses: statuses, Paged: f.AfterID != ""}
	if st := store.Status(q.Get("status")); st != "" {
		if !slices.Contains(statuses, st) {
			d.Error = "unknown status: pick one from the list"
		}
		f.Status = st
	}
	d.Filter = f
	status := http.StatusOK
	if d.Error == "" {
		// Any filter may match few rows (a rare status too: a few failed
		// among a million done), so a filtered page looks at ScanLimit
		// instances at most (newest first, through the primary key) rather
		// than the whole table.
		if f.Workflow != "" || f.Key != "" || f.Queue != "" || f.Status != "" {
			f.ScanLimit = s.opts.ScanLimit
		}
		p, err := s.st.ListPage(r.Context(), f)
		if err != nil {
			d.Error = "list: " + err.Error()
			status = http.StatusBadRequest
		}
		rows := p.Rows
		switch {
		case len(rows) > s.opts.PageSize:
			rows = rows[:s.opts.PageSize]
			d.Next = rows[len(rows)-1].ID
		case p.ScanStopped:
			d.Next, d.Stopped, d.Scanned = p.Next, true, f.ScanLimit
		}
		d.Rows = rows
	} else {
		status = http.StatusBadRequest
	}
	s.render(w, r, status, "instances", "layout.html", page{Title: "Instances", Nav: "instances", D: d})
}

// instanceData is the instance page.
type instanceData struct {
	In store.Instance
	// Keys are, for a row of several keys, every one of them, its first
	// key first (nil for a row of one key or none).
	Keys     []instanceKey
	State    string
	Result   string
	Timeline []run
	Inbox    []signalView
	// InboxCapped is true when the inbox holds more than is shown.
	InboxCapped bool
	Done        string
	CanCancel   bool
	CanRetry    bool
	CanSignal   bool
}

// instanceKey is one key of a row of several keys on the instance page:
// its intent, the shard of its counters the row holds while it executes
// (Shard ≥ 0), and whether it is the key the blocked row waits for.
type instanceKey struct {
	Key       string
	Intent    gate.Intent
	Shard     int
	BlockedOn bool
}

// instanceKeys lists the keys of a row of several keys (nil otherwise).
func instanceKeys(in store.Instance) []instanceKey {
	if len(in.Also) == 0 {
		return nil
	}
	refs := append([]store.KeyRef{{Key: in.Key, Intent: in.KeyIntent}}, in.Also...)
	shards := append([]int{in.KeyShard}, in.AlsoShards...)
	out := make([]instanceKey, len(refs))
	for i, r := range refs {
		out[i] = instanceKey{Key: r.Key, Intent: r.Intent, Shard: -1,
			BlockedOn: in.Status == store.StatusBlocked && r.Key == in.BlockedOn}
		if in.Status == store.StatusExecuting && i < len(shards) {
			out[i].Shard = shards[i]
		}
	}
	return out
}

// run is one recorded step run placed on the instance's timeline: X and W
// are its start and width in percent of the time from the first start to
// the last finish.
type run struct {
	store.HistoryEntry
	X, W string
	Took string
}

// signalView is a signal with its payload ready to print.
type signalView struct {
	store.Signal
	Payload string
}

// maxInbox is the most inbox signals the instance page shows.
const maxInbox = 100

// maxRuns is the most step runs the instance page shows (the latest).
const maxRuns = 200

// doneMessages are the confirmations shown after an action, by code.
var doneMessages = map[string]string{
	"canceled":         "Canceled. A running step is stopped at its next heartbeat and its outcome discarded.",
	"canceled-tree":    "Canceled, with every descendant, parents first. Running steps are stopped at their next heartbeat and their outcomes discarded.",
	"retried":          "Retrying: the instance is ready again at its step, attempt 0.",
	"signal-woke":      "Signal sent: the instance was awaiting it and is ready again.",
	"signal-stored":    "Signal stored: it is delivered at the instance's next await of that name.",
	"signal-duplicate": "Nothing sent: a signal with that dedup key was sent before.",
}

func (s *server) instance(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx := r.Context()
	in, err := s.st.Get(ctx, id)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, "Instance", err)
		return
	}
	hist, err := s.st.History(ctx, id)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, "Instance", err)
		return
	}
	inbox, err := s.st.Inbox(ctx, id, maxInbox+1)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, "Instance", err)
		return
	}
	d := instanceData{In: in, Keys: instanceKeys(in), State: indentJSON(in.State), Result: indentJSON(in.Result),
		Timeline: timeline(hist), Done: doneMessages[r.URL.Query().Get("did")],
		CanCancel: !in.Status.Terminal(), CanSignal: !in.Status.Terminal(),
		CanRetry: in.Status == store.StatusFailed || in.Status == store.StatusCanceled}
	if len(inbox) > maxInbox {
		inbox, d.InboxCapped = inbox[:maxInbox], true
	}
	for _, sg := range inbox {
		d.Inbox = append(d.Inbox, signalView{Signal: sg, Payload: indentJSON(sg.Payload)})
	}
	s.render(w, r, http.StatusOK, "instance", "layout.html", page{Title: "Instance " + in.ID, Nav: "instances", D: d})
}

// timeline places the latest maxRuns step runs on one time axis.
func timeline(hist []store.HistoryEntry) []run {
	if len(hist) > maxRuns {
		hist = hist[len(hist)-maxRuns:]
	}
	var first, last time.Time
	for _, h := range hist {
		for _, t := range []time.Time{h.StartedAt, h.FinishedAt} {
			if t.IsZero() {
				continue
			}
			if first.IsZero() || t.Before(first) {
				first = t
			}
			if t.After(last) {
				last = t
			}
		}
	}
	span := last.Sub(first)
	out := make([]run, 0, len(hist))
	for _, h := range hist {
		x, w := 0.0, 100.0
		if span > 0 && !h.StartedAt.IsZero() {
			x = 100 * float64(h.StartedAt.Sub(first)) / float64(span)
			end := h.FinishedAt
			if end.IsZero() {
				end = h.StartedAt
			}
			w = 100 * float64(end.Sub(h.StartedAt)) / float64(span)
		}
		w = max(w, 0.6)
		x = min(x, 100-w)
		took := "-"
		if !h.StartedAt.IsZero() && !h.FinishedAt.IsZero() {
			took = explain.Age(h.FinishedAt.Sub(h.StartedAt))
		}
		out = append(out, run{HistoryEntry: h, X: strconv.FormatFloat(x, 'f', 2, 64),
			W: strconv.FormatFloat(w, 'f', 2, 64), Took: took})
	}
	return out
}

// bar is a horizontal bar of used against a limit.
type bar struct {
	Pct   string
	Full  bool
	Label string
}

func barOf(used, limit int64) bar {
	b := bar{Pct: "0", Full: limit > 0 && used >= limit, Label: fmt.Sprintf("%d of %d", used, limit)}
	if limit > 0 {
		b.Pct = strconv.FormatFloat(min(100, max(0, 100*float64(used)/float64(limit))), 'f', 1, 64)
	}
	return b
}

// indentJSON formats raw JSON for reading ("null" when empty).
func indentJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "null"
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}
