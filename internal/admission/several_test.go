package admission

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
)

// also gives c the other keys ns.
func also(c Candidate, ns ...Need) Candidate {
	c.Also = ns
	return c
}

func one(key string) Need { return Need{Key: key} }

func gateNeed(key string, limit int) Need {
	return Need{Key: key, Gate: &gate.Limit{Name: gate.NameOf(key), Limit: limit, Shards: 1}}
}

func TestDecideSeveralKeys(t *testing.T) {
	rl := perSecond("api", 1)
	// A row of two rated keys, and its state with tokens left in api's
	// bucket (acct's is full).
	twoBuckets := []Candidate{also(rated(row("a", "acct:1"), perSecond("acct", 5)), Need{Key: "api:x", Rate: &rl})}
	apiTokens := func(tokens int) State {
		return state(func(st *State) {
			st.Locked["acct:1"], st.Locked["api:x"] = true, true
			st.Buckets["api"] = bucketWith(rl, tokens)
		})
	}
	runDecide(t, []decideCase{
		{
			name:   "a row is admitted when each of its keys has room, and debits each",
			window: []Candidate{also(row("a", "acct:1"), gateNeed("api:x", 2))},
			st: state(func(st *State) {
				st.Locked["acct:1"] = true
				st.Gates["api:x"] = counters([]int{2}, []int{2})
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []Admitted{{ID: "a", Shard: -1, Also: []Hold{{Key: "api:x", Shard: 0}}}}, p.Admitted)
				require.Equal(t, map[ShardKey]int{{"api:x", 0}: 1}, p.Debits)
				require.Nil(t, p.BlockedOn)
			},
		},
		{
			name: "a row refused by its gate takes nothing of its K = 1 key",
			window: []Candidate{
				also(row("a", "acct:1"), gateNeed("api:x", 1)),
				row("b", "acct:1"),
			},
			st: state(func(st *State) {
				st.Locked["acct:1"] = true
				st.Gates["api:x"] = counters([]int{1}, []int{0})
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"b"}, ids(p), "acct:1 is free for the next row")
				require.Equal(t, []string{"a"}, p.Blocked)
				require.Equal(t, map[string]string{"a": "api:x"}, p.BlockedOn)
				require.Equal(t, []string{"api:x"}, p.Saturated)
				require.Empty(t, p.Debits)
			},
		},
		{
			name: "a row refused by its K = 1 key debits nothing of its gate",
			window: []Candidate{
				also(gated("a", "api:x", 1, 1), one("acct:1")),
				gated("b", "api:x", 1, 1),
			},
			st: state(func(st *State) {
				st.Locked["acct:1"], st.Busy["acct:1"] = true, true
				st.Gates["api:x"] = counters([]int{1}, []int{1})
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []Admitted{{ID: "b", Shard: 0}}, p.Admitted, "the gate's one slot goes to the next row")
				require.Equal(t, map[string]string{"a": "acct:1"}, p.BlockedOn)
				require.Equal(t, map[ShardKey]int{{"api:x", 0}: 1}, p.Debits)
			},
		},
		{
			name: "a row is blocked on the first of its full keys in key order, whichever is its first",
			window: []Candidate{
				also(row("a", "k:2"), one("k:1")),
				also(row("b", "k:1"), one("k:2")),
			},
			st: state(func(st *State) {
				for _, k := range []string{"k:1", "k:2"} {
					st.Locked[k], st.Busy[k] = true, true
				}
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, map[string]string{"a": "k:1", "b": "k:1"}, p.BlockedOn)
				require.Equal(t, []string{"k:1"}, p.Saturated)
			},
		},
		{
			name: "a full key blocks the row even when another key would leave it ready",
			window: []Candidate{
				also(row("a", "k:1"), one("k:2")),
			},
			st: state(func(st *State) {
				st.Locked["k:2"], st.Busy["k:2"] = true, true // k:1's lock is held elsewhere
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, map[string]string{"a": "k:2"}, p.BlockedOn)
			},
		},
		{
			name: "a key held elsewhere leaves the row ready and takes nothing of the others",
			window: []Candidate{
				also(row("a", "k:1"), gateNeed("api:x", 2)),
				row("b", "k:1"),
			},
			st: state(func(st *State) {
				st.Locked["k:1"] = true
				st.Gates["api:x"] = GateState{Counters: []Counter{{Shard: 0, Capacity: 1, Available: 0}}, HeldElsewhere: true, Count: 2}
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"b"}, ids(p))
				require.Empty(t, p.Blocked)
				require.Equal(t, []string{"api:x"}, p.Unsettled)
			},
		},
		{
			name: "the only row in sight of a busy K = 1 key in its key column is left ready, as a row of one key is",
			window: []Candidate{
				also(row("a", "k:1"), one("k:2")),
			},
			st: state(func(st *State) {
				st.Locked["k:1"], st.Locked["k:2"], st.Busy["k:1"] = true, true, true
			}),
			check: func(t *testing.T, p Plan) {
				require.Empty(t, p.Admitted)
				require.Empty(t, p.Blocked, "the freeing of k:1 finds it by its key column")
			},
		},
		{
			name: "the only row in sight of a busy K = 1 key it holds as another key is blocked on it",
			window: []Candidate{
				also(row("a", "k:2"), one("k:1")),
			},
			st: state(func(st *State) {
				st.Locked["k:1"], st.Locked["k:2"], st.Busy["k:1"] = true, true, true
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, map[string]string{"a": "k:1"}, p.BlockedOn, "the freeing of k:1 finds ready rows by their key column only")
			},
		},
		{
			name:   "a row refused a token by one bucket takes none of the other",
			window: twoBuckets,
			st:     apiTokens(0),
			check: func(t *testing.T, p Plan) {
				require.Empty(t, p.Admitted)
				require.Equal(t, []Throttled{{ID: "a", RunAt: now.Add(1e9)}}, p.Throttled)
				require.Empty(t, p.Buckets, "no bucket is debited")
				require.Equal(t, map[string]int{"api": 1}, p.Rescheduled, "it waits for the bucket that refused it only")
			},
		},
		{
			name:   "an admitted row takes a token of each of its buckets",
			window: twoBuckets,
			st:     apiTokens(1),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a"}, ids(p))
				require.Equal(t, map[string]gate.Bucket{"api": bucketWith(rl, 0), "acct": bucketWith(perSecond("acct", 5), 4)}, p.Buckets)
			},
		},
		{
			name: "MaxActivePerKey holds for each key of a row",
			window: []Candidate{
				also(row("a", "k:1"), one("k:2")),
				row("b", "k:1"),
			},
			st: state(func(st *State) {
				st.Locked["k:1"], st.Locked["k:2"] = true, true
				st.Policy = &Policy{MaxActive: 10, MaxActivePerKey: 1}
				st.KeyActive["k:2"] = 1
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"b"}, ids(p))
				require.Equal(t, map[string]string{"a": "k:2"}, p.BlockedOn)
			},
		},
		{
			name: "a row of several keys takes no reservation and stops its key's line",
			window: []Candidate{
				gated("a", "api:x", 2, 1),
				also(gated("m", "api:x", 2, 1), one("acct:1")),
				gated("b", "api:x", 2, 1),
				gated("c", "api:x", 2, 1),
				gated("d", "api:x", 2, 1),
			},
			st: state(func(st *State) {
				st.Locked["acct:1"] = true
				st.Gates["api:x"] = counters([]int{2}, []int{2})
				st.Reserve = 2
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a", "m"}, ids(p))
				require.Equal(t, []Reservation{{"b", "a"}, {"c", "a"}}, p.Reserved, "the row of several keys takes none")
				require.Equal(t, []string{"d"}, p.Blocked)

				p = Decide([]Candidate{
					gated("a", "api:x", 1, 1),
					also(gated("m", "api:x", 1, 1), one("acct:1")),
					gated("b", "api:x", 1, 1),
				}, state(func(st *State) {
					st.Locked["acct:1"] = true
					st.Gates["api:x"] = counters([]int{1}, []int{1})
					st.Reserve = 2
				}))
				require.Equal(t, []string{"a"}, ids(p))
				require.Empty(t, p.Reserved, "no row after the blocked row of several keys is reserved ahead of it")
				require.Equal(t, []string{"m", "b"}, p.Blocked)
			},
		},
	})
}

// TestDecideSeveralKeysProperties checks, over random windows of rows of
// one to four keys and random key states, that no key is taken past its
// limit, that only admitted rows debit anything, that a row is blocked only
// on a key that is full and whose state the claimer holds, that the order
// of a row's other keys changes nothing, and that a row alone is admitted
// exactly when each of its keys, alone, would admit a row of that key.
func TestDecideSeveralKeysProperties(t *testing.T) {
	ones := []string{"acct:1", "acct:2", "acct:3"}
	gates := []string{"api:1", "api:2"}
	const limit = 2
	rng := rand.New(rand.NewPCG(1, 2))
	need := func(k string) Need {
		if slices.Contains(gates, k) {
			return gateNeed(k, limit)
		}
		return one(k)
	}
	candidate := func(id string, keys []string) Candidate {
		c := Candidate{ID: id}
		for i, k := range keys {
			n := need(k)
			if i == 0 {
				c.Key, c.Gate = n.Key, n.Gate
			} else {
				c.Also = append(c.Also, n)
			}
		}
		return c
	}
	for trial := range 3000 {
		st := state(func(st *State) { st.Limit = 1 + rng.IntN(6) })
		for _, k := range ones {
			st.Locked[k] = rng.IntN(5) > 0
			st.Busy[k] = rng.IntN(3) == 0
		}
		for _, k := range gates {
			avail := rng.IntN(limit + 1)
			st.Gates[k] = counters([]int{limit}, []int{avail})
		}
		all := append(slices.Clone(ones), gates...)
		var window []Candidate
		for i := range 1 + rng.IntN(6) {
			keys := slices.Clone(all)
			rng.Shuffle(len(keys), func(a, b int) { keys[a], keys[b] = keys[b], keys[a] })
			window = append(window, candidate(fmt.Sprint("r", i), keys[:1+rng.IntN(4)]))
		}
		p := Decide(window, st)
		msg := fmt.Sprintf("trial %d: window %+v", trial, window)

		// Limits hold, and the debits are the admitted rows' holds.
		holders := map[string]int{}
		debits := map[ShardKey]int{}
		for _, a := range p.Admitted {
			c := window[slices.IndexFunc(window, func(c Candidate) bool { return c.ID == a.ID })]
			holds := append([]Hold{{Key: c.Key, Shard: a.Shard}}, a.Also...)
			require.Len(t, holds, 1+len(c.Also), msg)
			for _, h := range holds {
				holders[h.Key]++
				if h.Shard >= 0 {
					debits[ShardKey(h)]++
				}
			}
		}
		require.Equal(t, debits, p.Debits, msg)
		for _, k := range ones {
			if holders[k] > 0 {
				require.True(t, st.Locked[k] && !st.Busy[k] && holders[k] == 1, "%s: K = 1 key %s, %d holders", msg, k, holders[k])
			}
		}
		for _, k := range gates {
			require.LessOrEqual(t, holders[k], st.Gates[k].Counters[0].Available, "%s: gate %s", msg, k)
		}

		// A row is blocked only on one of its keys that is full, whose state
		// the claimer holds.
		for id, k := range p.BlockedOn {
			c := window[slices.IndexFunc(window, func(c Candidate) bool { return c.ID == id })]
			require.True(t, k == c.Key || slices.ContainsFunc(c.Also, func(n Need) bool { return n.Key == k }), msg)
			if slices.Contains(ones, k) {
				require.True(t, st.Locked[k], "%s: %s blocked on %s, whose lock the claimer lacks", msg, id, k)
			} else {
				require.False(t, st.Gates[k].HeldElsewhere, msg)
			}
			require.Contains(t, p.Saturated, k, msg)
		}
		for _, c := range window {
			if len(c.Also) > 0 && slices.Contains(p.Blocked, c.ID) {
				require.Contains(t, p.BlockedOn, c.ID, msg)
			}
		}

		// The order of a row's other keys changes nothing.
		shuffled := make([]Candidate, len(window))
		for i, c := range window {
			c.Also = slices.Clone(c.Also)
			rng.Shuffle(len(c.Also), func(a, b int) { c.Also[a], c.Also[b] = c.Also[b], c.Also[a] })
			shuffled[i] = c
		}
		q := Decide(shuffled, st)
		require.Equal(t, ids(p), ids(q), msg)
		require.Equal(t, p.Blocked, q.Blocked, msg)
		require.Equal(t, p.BlockedOn, q.BlockedOn, msg)
		require.Equal(t, p.Debits, q.Debits, msg)

		// A row alone is admitted exactly when each of its keys alone admits
		// a row of that key (the K = 1 "only row in sight" rule aside, which
		// applies to rows of one key only: InSight 2 turns it off).
		c := window[0]
		alone := Decide([]Candidate{c}, st)
		each := true
		for _, n := range c.needs(nil) {
			solo := Decide([]Candidate{{ID: "solo", Key: n.Key, Gate: n.Gate}}, state(func(s *State) {
				*s = st
				s.InSight = map[string]int{n.Key: 2}
			}))
			each = each && len(solo.Admitted) == 1
		}
		require.Equal(t, each, len(alone.Admitted) == 1, "%s: row %+v", msg, c)
	}
}
