package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// explanation answers "why is this key blocked": who holds its slots, who
// waits, which limits apply and which one blocks it now. It is also the
// JSON form of `durable explain -json`.
type explanation struct {
	Key  string    `json:"key"`
	Name string    `json:"name"`
	At   time.Time `json:"at"`
	// Holders are the executing rows of the key, oldest claim first.
	Holders []holder `json:"holders"`
	Waiting waiting  `json:"waiting"`
	// Limits are every limit kind that may hold the key back, in the order
	// admission applies them.
	Limits []limitCheck `json:"limits"`
	// Blocking is the kind of the limit blocking the key now ("" when none)
	// and Verdict says in a sentence what happens next.
	Blocking string `json:"blocking"`
	Verdict  string `json:"verdict"`
}

type holder struct {
	ID             string    `json:"id"`
	Workflow       string    `json:"workflow"`
	Step           string    `json:"step"`
	Attempt        int       `json:"attempt"`
	Worker         string    `json:"worker"`
	Since          time.Time `json:"since"`
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
}

type waiting struct {
	// Count is every ready, delayed or blocked row of the key; Blocked are
	// those taken off the pick path because the key was full.
	Count   int     `json:"count"`
	Blocked int     `json:"blocked"`
	Oldest  *waiter `json:"oldest"`
	Next    *waiter `json:"next_in_line"`
}

type waiter struct {
	ID       string       `json:"id"`
	Workflow string       `json:"workflow"`
	Step     string       `json:"step"`
	Status   store.Status `json:"status"`
	Queue    string       `json:"queue"`
	Priority int          `json:"priority"`
	RunAt    time.Time    `json:"run_at"`
}

// limitCheck is one kind of limit as it applies to the key now.
type limitCheck struct {
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

// explain prints who holds a key's slots, who waits and why.
func explain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, 1, 0, "KEY")
	if err != nil {
		return err
	}
	key := pos[0]
	if k, err := gate.Parse(key); err != nil || k.IsZero() {
		return usagef("explain: %q is not a concurrency key: want name:id (for example account:42)", key)
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("explain: %w", err)
	}
	defer closeStore()
	x, err := explainKey(ctx, st, key, time.Now().UTC())
	if err != nil {
		return fmt.Errorf("explain: %w", err)
	}
	if *asJSON {
		return writeJSON(stdout, x)
	}
	printExplanation(stdout, x)
	return nil
}

// explainKey gathers the explanation of key at now.
func explainKey(ctx context.Context, st store.Store, key string, now time.Time) (explanation, error) {
	info, err := st.KeyInfo(ctx, key)
	if err != nil {
		return explanation{}, err
	}
	x := explanation{Key: key, Name: gate.NameOf(key), At: now, Holders: []holder{}}
	for _, h := range info.Holders {
		x.Holders = append(x.Holders, holder{ID: h.ID, Workflow: h.Workflow, Step: h.Step, Attempt: h.Attempt,
			Worker: h.Worker, Since: h.StartedAt, LeaseExpiresAt: h.LeaseExpiresAt})
	}
	x.Waiting = waiting{Count: info.Waiting, Blocked: info.Blocked, Oldest: toWaiter(info.OldestWaiting), Next: toWaiter(info.NextInLine)}
	k := keyView{info: info, now: now,
		due: info.Blocked > 0 || (info.OldestWaiting != nil && !info.OldestWaiting.RunAt.After(now))}

	x.Limits = []limitCheck{concurrencyCheck(k), rateLimitCheck(k)}
	fleet, err := fleetLimitCheck(ctx, st, k)
	if err != nil {
		return explanation{}, err
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

func toWaiter(in *store.Instance) *waiter {
	if in == nil {
		return nil
	}
	return &waiter{ID: in.ID, Workflow: in.Workflow, Step: in.Step, Status: in.Status, Queue: in.Queue,
		Priority: in.Priority, RunAt: in.RunAt}
}

// keyView is what the limit checks know about the key at now.
type keyView struct {
	info store.KeyInfo
	now  time.Time
	// due is true when a waiting row could run now if no limit held it
	// back (a blocked row, or a ready row whose run time has come).
	due bool
}

// concurrencyCheck is the key's semaphore: its name's limit, or K = 1.
func concurrencyCheck(k keyView) limitCheck {
	info := k.info
	name := gate.NameOf(info.Key)
	c := limitCheck{Kind: "concurrency", Applies: true, Limit: info.K, InUse: len(info.Holders)}
	if info.Shards > 0 {
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
func rateLimitCheck(k keyView) limitCheck {
	info, now := k.info, k.now
	name := gate.NameOf(info.Key)
	r := info.RateLimit
	if r == nil {
		return limitCheck{Kind: "rate", Detail: fmt.Sprintf("no rate limit for %q", name)}
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
	c := limitCheck{Kind: "rate", Applies: true, Limit: r.Burst, InUse: r.Burst - int(tokens)}
	c.Detail = fmt.Sprintf("rate limit %q: %d per %s, burst %d, %s; %d token(s) now", name, r.Limit, r.Period, r.Burst, scope, tokens)
	if tokens < 1 {
		c.Detail += ", the next " + when(r.Due(b, 1), now)
	}
	c.Blocking = info.Waiting > 0 && tokens < 1
	return c
}

// fleetLimitCheck reports the fleet-wide policy (MaxActive,
// MaxActivePerKey) of the queue the key's work runs on (its next waiting
// row's, else its oldest waiting row's, else its first holder's).
func fleetLimitCheck(ctx context.Context, st store.Store, k keyView) (limitCheck, error) {
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
		return limitCheck{Kind: "fleet", Detail: "no queue: nothing holds or waits for the key"}, nil
	}
	policies, err := st.ListConcurrencyPolicies(ctx)
	if err != nil {
		return limitCheck{}, err
	}
	i := slices.IndexFunc(policies, func(p store.ConcurrencyPolicy) bool { return p.Queue == queue })
	if i < 0 {
		return limitCheck{Kind: "fleet", Detail: fmt.Sprintf("no policy for queue %q", queue)}, nil
	}
	p := policies[i]
	executing, err := st.List(ctx, store.ListFilter{Queue: queue, Status: store.StatusExecuting})
	if err != nil {
		return limitCheck{}, err
	}
	mine := 0
	for _, h := range info.Holders {
		if h.Queue == queue {
			mine++
		}
	}
	c := limitCheck{Kind: "fleet", Applies: true, Limit: p.MaxActive, InUse: len(executing)}
	c.Detail = fmt.Sprintf("queue %q (namespace %q): MaxActive %d, %d executing", queue, p.Namespace, p.MaxActive, len(executing))
	full := len(executing) >= p.MaxActive
	if p.MaxActivePerKey > 0 {
		c.Detail += fmt.Sprintf("; MaxActivePerKey %d, %d of this key", p.MaxActivePerKey, mine)
		full = full || mine >= p.MaxActivePerKey
	}
	c.Blocking = due && full
	return c, nil
}

// verdict says in one sentence why the key's work waits and what frees it.
func verdict(x explanation, k keyView) string {
	info, now := k.info, k.now
	switch {
	case info.Waiting == 0 && len(info.Holders) == 0:
		return fmt.Sprintf("nothing holds or waits for %s", x.Key)
	case info.Waiting == 0:
		return fmt.Sprintf("not blocked: nothing waits for %s", x.Key)
	case !k.due && x.Blocking != "rate":
		return fmt.Sprintf("not blocked: every waiting row is scheduled for later; the first is due %s", when(info.OldestWaiting.RunAt, now))
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
			info.K, x.Key, when(first, now))
	case "rate":
		r := info.RateLimit
		b := r.Full(now)
		if info.Bucket != nil {
			b = r.Refill(*info.Bucket, now)
		}
		return fmt.Sprintf("throttled by its rate limit: the bucket of %s holds no token; its waiting rows are rescheduled to when their tokens are due, the next %s",
			x.Key, when(r.Due(b, 1), now))
	case "":
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

func printExplanation(w io.Writer, x explanation) {
	fmt.Fprintf(w, "key %s (name %q)\n\n", x.Key, x.Name)
	if len(x.Holders) == 0 {
		fmt.Fprintln(w, "holders: none")
	} else {
		fmt.Fprintf(w, "holders: %d\n", len(x.Holders))
		tw := table(w)
		fmt.Fprintln(tw, "  INSTANCE\tWORKFLOW\tSTEP\tATTEMPT\tWORKER\tSINCE\tLEASE EXPIRES")
		for _, h := range x.Holders {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\t%s\n", h.ID, h.Workflow, h.Step, h.Attempt, h.Worker,
				when(h.Since, x.At), when(h.LeaseExpiresAt, x.At))
		}
		tw.Flush()
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "waiting: %d (%d blocked)\n", x.Waiting.Count, x.Waiting.Blocked)
	if o := x.Waiting.Oldest; o != nil {
		fmt.Fprintf(w, "  oldest:       %s %s/%s, %s, waiting since %s\n", o.ID, o.Workflow, o.Step, o.Status, when(o.RunAt, x.At))
	}
	if n := x.Waiting.Next; n != nil {
		fmt.Fprintf(w, "  next in line: %s %s/%s, %s, priority %d, queue %s\n", n.ID, n.Workflow, n.Step, n.Status, n.Priority, n.Queue)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "limits:")
	tw := table(w)
	for _, l := range x.Limits {
		use, state := "-", "not configured"
		if l.Applies {
			use = fmt.Sprintf("%d/%d in use", l.InUse, l.Limit)
			state = "ok"
		}
		if l.Blocking {
			state = "BLOCKING"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", l.Kind, use, state, l.Detail)
	}
	tw.Flush()
	fmt.Fprintln(w)
	blocking := x.Blocking
	if blocking == "" {
		blocking = "none"
	}
	fmt.Fprintf(w, "blocking now: %s\n%s\n", blocking, wrap(x.Verdict, 100))
}

// wrap breaks s into lines of at most width characters at spaces.
func wrap(s string, width int) string {
	var b strings.Builder
	line := 0
	for i, word := range strings.Fields(s) {
		if i > 0 {
			if line+1+len(word) > width {
				b.WriteByte('\n')
				line = 0
			} else {
				b.WriteByte(' ')
				line++
			}
		}
		b.WriteString(word)
		line += len(word)
	}
	return b.String()
}
