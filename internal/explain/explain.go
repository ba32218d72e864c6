// Package explain answers, for one concurrency key, the question an
// operator asks at 3 a.m.: who holds its slots, who waits, which limits
// apply and which one blocks it now. The CLI (`durable explain`) and the
// web page (package ui) both print what Key returns, so they never disagree.
package explain

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// Explanation answers "why is this key blocked": who holds its slots, who
// waits, which limits apply and which one blocks it now. It is also the
// JSON form of `durable explain -json`.
type Explanation struct {
	Key  string    `json:"key"`
	Name string    `json:"name"`
	At   time.Time `json:"at"`
	// Holders are the executing rows of the key, oldest claim first.
	Holders []Holder `json:"holders"`
	Waiting Waiting  `json:"waiting"`
	// Limits are every limit kind that may hold the key back, in the order
	// admission applies them.
	Limits []LimitCheck `json:"limits"`
	// Blocking is the kind of the limit blocking the key now ("" when none)
	// and Verdict says in a sentence what happens next.
	Blocking string `json:"blocking"`
	Verdict  string `json:"verdict"`
}

// Holder is an executing row holding one of the key's slots.
type Holder struct {
	ID             string    `json:"id"`
	Workflow       string    `json:"workflow"`
	Step           string    `json:"step"`
	Attempt        int       `json:"attempt"`
	Worker         string    `json:"worker"`
	Since          time.Time `json:"since"`
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
	// OtherKeys are, for a row of several keys, the keys it holds besides
	// this one, in key order (empty for a row of one key).
	OtherKeys []string `json:"other_keys,omitempty"`
}

// Waiting counts the rows waiting for the key and names two of them.
type Waiting struct {
	// Count is every ready, delayed or blocked row of the key; Blocked are
	// those taken off the pick path because the key was full.
	Count   int     `json:"count"`
	Blocked int     `json:"blocked"`
	Oldest  *Waiter `json:"oldest"`
	Next    *Waiter `json:"next_in_line"`
	// Elsewhere counts the rows of several keys that carry the key but
	// wait in the line of another of their keys (store.KeyInfo.
	// WaitingElsewhere); they are not in Count. ElsewhereOn names, among
	// the blocked ones a bounded read finds (see Key), the keys they are
	// blocked on, most rows first.
	Elsewhere   int        `json:"elsewhere"`
	ElsewhereOn []KeyCount `json:"elsewhere_on,omitempty"`
}

// KeyCount is a key and how many rows it concerns.
type KeyCount struct {
	Key   string `json:"key"`
	Count int    `json:"count"`
}

// Waiter is a waiting row of the key.
type Waiter struct {
	ID       string       `json:"id"`
	Workflow string       `json:"workflow"`
	Step     string       `json:"step"`
	Status   store.Status `json:"status"`
	Queue    string       `json:"queue"`
	Priority int          `json:"priority"`
	RunAt    time.Time    `json:"run_at"`
	// OtherKeys are, for a row of several keys, its keys besides this one,
	// in key order (empty for a row of one key); BlockedOn is, for such a
	// row when blocked, the key it waits for.
	OtherKeys []string `json:"other_keys,omitempty"`
	BlockedOn string   `json:"blocked_on,omitempty"`
}

// LimitCheck is one kind of limit as it applies to the key now.
type LimitCheck struct {
	// Kind is "concurrency", "rate" or "fleet".
	Kind string `json:"kind"`
	// Applies is false when no limit of this kind is configured for the key.
	Applies bool `json:"applies"`
	// Limit and InUse are the capacity and what is taken of it (0 when the
	// kind does not apply).
	Limit int `json:"limit"`
	InUse int `json:"in_use"`
	// Detail describes the limit; Blocking is true when it alone keeps the
	// key's due waiting rows from running now.
	Detail   string `json:"detail"`
	Blocking bool   `json:"blocking"`
}

// Key gathers the Explanation of key at now. When rows carrying the key
// wait for another of their keys, it reads the blocked ones among the
// newest 10,000 instances (a bounded read, no table scan) to name the keys
// they wait for (Waiting.ElsewhereOn).
func Key(ctx context.Context, st store.Store, key string, now time.Time) (Explanation, error) {
	info, err := st.KeyInfo(ctx, key)
	if err != nil {
		return Explanation{}, err
	}
	x := Explanation{Key: key, Name: gate.NameOf(key), At: now, Holders: []Holder{}}
	for _, h := range info.Holders {
		x.Holders = append(x.Holders, Holder{ID: h.ID, Workflow: h.Workflow, Step: h.Step, Attempt: h.Attempt,
			Worker: h.Worker, Since: h.StartedAt, LeaseExpiresAt: h.LeaseExpiresAt, OtherKeys: OtherKeys(h, key)})
	}
	x.Waiting = Waiting{Count: info.Waiting, Blocked: info.Blocked, Oldest: toWaiter(info.OldestWaiting, key),
		Next: toWaiter(info.NextInLine, key), Elsewhere: info.WaitingElsewhere}
	if info.WaitingElsewhere > 0 {
		if x.Waiting.ElsewhereOn, err = blockedElsewhere(ctx, st, key); err != nil {
			return Explanation{}, err
		}
	}
	k := keyView{info: info, now: now,
		due: info.Blocked > 0 || (info.OldestWaiting != nil && !info.OldestWaiting.RunAt.After(now))}

	x.Limits = []LimitCheck{concurrencyCheck(k), rateLimitCheck(k)}
	fleet, err := fleetLimitCheck(ctx, st, k)
	if err != nil {
		return Explanation{}, err
	}
	x.Limits = append(x.Limits, fleet)
	for _, l := range x.Limits {
		if l.Blocking {
			x.Blocking = l.Kind
			break
		}
	}
	x.Verdict = verdict(x, k)
	return x, nil
}

func toWaiter(in *store.Instance, key string) *Waiter {
	if in == nil {
		return nil
	}
	w := &Waiter{ID: in.ID, Workflow: in.Workflow, Step: in.Step, Status: in.Status, Queue: in.Queue,
		Priority: in.Priority, RunAt: in.RunAt, OtherKeys: OtherKeys(*in, key)}
	if len(in.Also) > 0 {
		w.BlockedOn = in.BlockedOn
	}
	return w
}

// OtherKeys are the keys of in other than key, in key order (nil for a
// row of one key).
func OtherKeys(in store.Instance, key string) []string {
	if len(in.Also) == 0 {
		return nil
	}
	return slices.DeleteFunc(in.KeyList(), func(k string) bool { return k == key })
}

// elsewhereScan is the most instances (newest first) blockedElsewhere
// reads, and elsewhereTop the most keys it names.
const (
	elsewhereScan = 10_000
	elsewhereTop  = 3
)

// blockedElsewhere names the keys that rows carrying key are blocked on
// when that is not key, most rows first (then in key order), at most
// elsewhereTop of them, among the newest elsewhereScan instances: a
// bounded read, so a key whose rows wait elsewhere costs no table scan.
func blockedElsewhere(ctx context.Context, st store.Store, key string) ([]KeyCount, error) {
	p, err := st.ListPage(ctx, store.ListFilter{Key: key, Status: store.StatusBlocked, Newest: true, ScanLimit: elsewhereScan})
	if err != nil {
		return nil, err
	}
	n := map[string]int{}
	for _, in := range p.Rows {
		if in.BlockedOn != "" && in.BlockedOn != key {
			n[in.BlockedOn]++
		}
	}
	out := make([]KeyCount, 0, len(n))
	for k, c := range n {
		out = append(out, KeyCount{Key: k, Count: c})
	}
	slices.SortFunc(out, func(a, b KeyCount) int {
		if a.Count != b.Count {
			return b.Count - a.Count
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(out) > elsewhereTop {
		out = out[:elsewhereTop]
	}
	return out, nil
}

// keyView is what the limit checks know about the key at now.
type keyView struct {
	info store.KeyInfo
	now  time.Time
	// due is true when a waiting row could run now if no limit held it
	// back (a blocked row, or a ready row whose run time has come).
	due bool
}

// concurrencyCheck is the key's semaphore: its own limit, its name's
// limit, or K = 1 (store.KeyInfo.LimitName says which).
func concurrencyCheck(k keyView) LimitCheck {
	info := k.info
	name := gate.NameOf(info.Key)
	c := LimitCheck{Kind: "concurrency", Applies: true, Limit: info.K, InUse: len(info.Holders)}
	if info.LimitName == info.Key {
		c.Detail = fmt.Sprintf("per-key limit of %q: K = %d over %d shard(s), over the limit of %q; %d held, %d free",
			info.Key, info.K, info.Shards, name, len(info.Holders), info.Available)
	} else if info.Shards > 0 {
		c.Detail = fmt.Sprintf("gate %q: K = %d per key over %d shard(s); %d held, %d free",
			name, info.K, info.Shards, len(info.Holders), info.Available)
	} else {
		c.Detail = fmt.Sprintf("no limit configured for %q: K = 1, one at a time per key; %d held, %d free",
			name, len(info.Holders), info.Available)
	}
	c.Blocking = k.due && info.Available == 0
	return c
}

// rateLimitCheck reports the token bucket (flow cap) that key draws from:
// its burst, the tokens it holds at now, and when the next one is due. It
// blocks the key when rows wait and the bucket holds no token (those rows
// are rescheduled to their tokens' due times).
func rateLimitCheck(k keyView) LimitCheck {
	info, now := k.info, k.now
	name := gate.NameOf(info.Key)
	r := info.RateLimit
	if r == nil {
		return LimitCheck{Kind: "rate", Detail: fmt.Sprintf("no rate limit for %q", name)}
	}
	b := r.Full(now)
	if info.Bucket != nil {
		b = r.Refill(*info.Bucket, now)
	}
	tokens := r.Tokens(b)
	scope := "one bucket for every key of the name"
	if r.PerKey {
		scope = "a bucket per key"
	}
	c := LimitCheck{Kind: "rate", Applies: true, Limit: r.Burst, InUse: r.Burst - int(tokens)}
	c.Detail = fmt.Sprintf("rate limit %q: %d per %s, burst %d, %s; %d token(s) now", name, r.Limit, r.Period, r.Burst, scope, tokens)
	if tokens < 1 {
		c.Detail += ", the next " + When(r.Due(b, 1), now)
	}
	c.Blocking = info.Waiting > 0 && tokens < 1
	return c
}

// fleetLimitCheck reports the fleet-wide policy (MaxActive,
// MaxActivePerKey) of the queue the key's work runs on (its next waiting
// row's, else its oldest waiting row's, else its first holder's).
func fleetLimitCheck(ctx context.Context, st store.Store, k keyView) (LimitCheck, error) {
	info, due := k.info, k.due
	var queue string
	switch {
	case info.NextInLine != nil:
		queue = info.NextInLine.Queue
	case info.OldestWaiting != nil:
		queue = info.OldestWaiting.Queue
	case len(info.Holders) > 0:
		queue = info.Holders[0].Queue
	default:
		return LimitCheck{Kind: "fleet", Detail: "no queue: nothing holds or waits for the key"}, nil
	}
	policies, err := st.ListConcurrencyPolicies(ctx)
	if err != nil {
		return LimitCheck{}, err
	}
	i := slices.IndexFunc(policies, func(p store.ConcurrencyPolicy) bool { return p.Queue == queue })
	if i < 0 {
		return LimitCheck{Kind: "fleet", Detail: fmt.Sprintf("no policy for queue %q", queue)}, nil
	}
	p := policies[i]
	executing, err := st.List(ctx, store.ListFilter{Queue: queue, Status: store.StatusExecuting})
	if err != nil {
		return LimitCheck{}, err
	}
	mine := 0
	for _, h := range info.Holders {
		if h.Queue == queue {
			mine++
		}
	}
	c := LimitCheck{Kind: "fleet", Applies: true, Limit: p.MaxActive, InUse: len(executing)}
	c.Detail = fmt.Sprintf("queue %q (namespace %q): MaxActive %d, %d executing", queue, p.Namespace, p.MaxActive, len(executing))
	full := len(executing) >= p.MaxActive
	if p.MaxActivePerKey > 0 {
		c.Detail += fmt.Sprintf("; MaxActivePerKey %d, %d of this key", p.MaxActivePerKey, mine)
		full = full || mine >= p.MaxActivePerKey
	}
	c.Blocking = due && full
	return c, nil
}

// verdict says in one sentence why the key's work waits and what frees it,
// and then, when rows carrying the key wait for another of their keys,
// which.
func verdict(x Explanation, k keyView) string {
	v := lineVerdict(x, k)
	if x.Waiting.Elsewhere == 0 {
		return v
	}
	return v + "; " + elsewhere(x)
}

// elsewhere says how many rows carrying the key wait in another key's
// line, and for the blocked ones found, on which keys.
func elsewhere(x Explanation) string {
	s := fmt.Sprintf("%d row(s) that also need %s wait for another of their keys", x.Waiting.Elsewhere, x.Key)
	if len(x.Waiting.ElsewhereOn) > 0 {
		on := make([]string, len(x.Waiting.ElsewhereOn))
		for i, c := range x.Waiting.ElsewhereOn {
			on[i] = fmt.Sprintf("%s (%d)", c.Key, c.Count)
		}
		s += " (blocked on " + strings.Join(on, ", ") + ")"
	}
	return s + "; they run once each of their keys has room"
}

// lineVerdict says in one sentence why the rows in the key's own line
// wait and what frees them.
func lineVerdict(x Explanation, k keyView) string {
	info, now := k.info, k.now
	switch {
	case info.Waiting == 0 && len(info.Holders) == 0 && info.WaitingElsewhere > 0:
		return fmt.Sprintf("nothing holds %s and no row waits in its own line", x.Key)
	case info.Waiting == 0 && len(info.Holders) == 0:
		return fmt.Sprintf("nothing holds or waits for %s", x.Key)
	case info.Waiting == 0 && info.WaitingElsewhere > 0:
		return fmt.Sprintf("not blocked: no row waits in the line of %s", x.Key)
	case info.Waiting == 0:
		return fmt.Sprintf("not blocked: nothing waits for %s", x.Key)
	case !k.due && x.Blocking != "rate":
		return fmt.Sprintf("not blocked: every waiting row is scheduled for later; the first is due %s", When(info.OldestWaiting.RunAt, now))
	}
	switch x.Blocking {
	case "concurrency":
		if len(info.Holders) == 0 {
			// Only a gate's counters can leak (a reaped claim does not
			// credit them); a K = 1 key is free as soon as nothing executes.
			if info.Shards > 0 {
				return fmt.Sprintf("blocked by its concurrency limit, yet nothing executes: slots of %s leaked on a crash path; the reconciler returns them at its next sweep", x.Key)
			}
			return fmt.Sprintf("not blocked: nothing executes under %s, so its one slot is free; its rows run at the next claim of their queue", x.Key)
		}
		first := info.Holders[0].LeaseExpiresAt
		for _, h := range info.Holders {
			if h.LeaseExpiresAt.Before(first) {
				first = h.LeaseExpiresAt
			}
		}
		return fmt.Sprintf("blocked by its concurrency limit: all %d slot(s) of %s are held; the next in line runs when a holder finishes, or when a lease expires if its worker died (earliest %s)",
			info.K, x.Key, When(first, now))
	case "rate":
		r := info.RateLimit
		b := r.Full(now)
		if info.Bucket != nil {
			b = r.Refill(*info.Bucket, now)
		}
		return fmt.Sprintf("throttled by its rate limit: the bucket of %s holds no token; its waiting rows are rescheduled to when their tokens are due, the next %s",
			x.Key, When(r.Due(b, 1), now))
	case "":
		if info.Blocked > 0 && info.Blocked == info.Waiting && info.K == 1 && info.Shards == 0 && len(info.Holders) == 0 {
			// Rows inserted behind a busy K = 1 key go in blocked; the
			// insert's heal, or the holder's end, makes the first ready
			// within milliseconds. Seen for longer, one of them was lost.
			return fmt.Sprintf("nothing executes under %s, yet its rows wait blocked: the end of its last holder, or the insert that blocked them, did not pass the turn on (a crash, or rows locked at that moment); the reconciler makes the next one ready at its next sweep", x.Key)
		}
		if info.Blocked > 0 {
			return fmt.Sprintf("a slot of %s is free: its blocked rows are made ready at the next outcome or reconciler sweep", x.Key)
		}
		return fmt.Sprintf("not blocked by any limit: the ready rows of %s wait for a free executor on queue %s", x.Key, info.NextInLine.Queue)
	default:
		for _, l := range x.Limits {
			if l.Kind == x.Blocking {
				return fmt.Sprintf("blocked by its %s limit: %s", l.Kind, l.Detail)
			}
		}
		return "blocked by its " + x.Blocking + " limit"
	}
}

// Age is a duration for people: whole seconds above a second, "-" for zero.
func Age(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Second && d > -time.Second:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// When is a time with how far it is from now ("-" for the zero time).
func When(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now)
	rel := "now"
	switch {
	case d > 0:
		rel = "in " + Age(d)
	case d < 0:
		rel = Age(-d) + " ago"
	}
	return fmt.Sprintf("%s (%s)", t.UTC().Format(time.RFC3339), rel)
}
