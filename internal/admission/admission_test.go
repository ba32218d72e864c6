package admission

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
)

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func row(id, key string) Candidate { return Candidate{ID: id, Key: key} }

func gated(id, key string, limit, shards int) Candidate {
	return Candidate{ID: id, Key: key, Gate: &gate.Limit{Name: gate.NameOf(key), Limit: limit, Shards: shards}}
}

func rated(c Candidate, r gate.RateLimit) Candidate {
	c.Rate = &r
	return c
}

// perSecond is a rate limit of one token a second, with a burst of burst.
func perSecond(name string, burst int) gate.RateLimit {
	return gate.RateLimit{Name: name, Limit: 1, Period: time.Second, Burst: burst}
}

// bucketWith is a bucket holding tokens whole tokens of r, as of now.
func bucketWith(r gate.RateLimit, tokens int) gate.Bucket {
	return gate.Bucket{Credit: int64(tokens) * r.TokenCredit(), At: now}
}

func state(mut func(*State)) State {
	st := State{Now: now, Limit: 10, Locked: map[string]bool{}, Busy: map[string]bool{},
		Gates: map[string]GateState{}, KeyActive: map[string]int{}, Buckets: map[string]gate.Bucket{}}
	if mut != nil {
		mut(&st)
	}
	return st
}

// counters is a fully locked gate key's state with the given available
// slots per shard and capacities caps.
func counters(caps, avail []int) GateState {
	var g GateState
	for i := range caps {
		g.Counters = append(g.Counters, Counter{Shard: i, Capacity: caps[i], Available: avail[i]})
	}
	return g
}

func ids(p Plan) []string {
	var out []string
	for _, a := range p.Admitted {
		out = append(out, a.ID)
	}
	return out
}

// decideCase is a window, the state read for it, and a check of the plan
// Decide makes of them.
type decideCase struct {
	name   string
	window []Candidate
	st     State
	check  func(t *testing.T, p Plan)
}

// runDecide checks each case's plan in a subtest of its name.
func runDecide(t *testing.T, cases []decideCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { tc.check(t, Decide(tc.window, tc.st)) })
	}
}

func TestDecide(t *testing.T) {
	rl := perSecond("api", 2)
	runDecide(t, []decideCase{
		{
			name:   "a row without a key is always admitted",
			window: []Candidate{row("a", ""), row("b", ""), row("c", "")},
			st:     state(func(st *State) { st.Policy = &Policy{MaxActive: 100, MaxActivePerKey: 1} }),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []Admitted{{ID: "a", Shard: -1}, {ID: "b", Shard: -1}, {ID: "c", Shard: -1}}, p.Admitted)
				require.Empty(t, p.Blocked)
				require.Empty(t, p.Debits)
			},
		},
		{
			name:   "K = 1: the first row is admitted with the key's lock, the key's further rows are blocked",
			window: []Candidate{row("a1", "acct:1"), row("b1", "acct:2"), row("a2", "acct:1"), row("a3", "acct:1")},
			st:     state(func(st *State) { st.Locked["acct:1"], st.Locked["acct:2"] = true, true }),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []Admitted{{ID: "a1", Shard: -1}, {ID: "b1", Shard: -1}}, p.Admitted)
				require.Equal(t, []string{"a2", "a3"}, p.Blocked)
				require.Equal(t, []string{"acct:1"}, p.Saturated)
			},
		},
		{
			name:   "K = 1: a busy key's rows are blocked",
			window: []Candidate{row("a1", "acct:1"), row("x", ""), row("a2", "acct:1")},
			st:     state(func(st *State) { st.Locked["acct:1"], st.Busy["acct:1"] = true, true }),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"x"}, ids(p))
				require.Equal(t, []string{"a1", "a2"}, p.Blocked)
				require.Equal(t, []string{"acct:1"}, p.Saturated)
			},
		},
		{
			name:   "K = 1: a busy key's only row in the window is left ready",
			window: []Candidate{row("a1", "acct:1"), row("x", "")},
			st:     state(func(st *State) { st.Locked["acct:1"], st.Busy["acct:1"] = true, true }),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"x"}, ids(p))
				require.Empty(t, p.Blocked)
				require.Empty(t, p.Saturated)
			},
		},
		{
			name:   "K = 1: the rows in sight are the store's count when it gives one",
			window: []Candidate{row("a1", "acct:1"), row("b1", "acct:2")},
			st: state(func(st *State) {
				st.Locked["acct:1"], st.Busy["acct:1"] = true, true
				st.Locked["acct:2"], st.Busy["acct:2"] = true, true
				st.InSight = map[string]int{"acct:1": 3, "acct:2": 1}
			}),
			check: func(t *testing.T, p Plan) {
				require.Empty(t, p.Admitted)
				require.Equal(t, []string{"a1"}, p.Blocked)
				require.Equal(t, []string{"acct:1"}, p.Saturated)
			},
		},
		{
			name:   "K = 1: a lock held elsewhere leaves the rows ready",
			window: []Candidate{row("a1", "acct:1"), row("a2", "acct:1"), row("x", "")},
			st:     state(func(st *State) { st.Busy["acct:1"] = true }),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"x"}, ids(p))
				require.Empty(t, p.Blocked)
				require.Empty(t, p.Saturated)
				require.Empty(t, p.Throttled)
			},
		},
		{
			name:   "gate: a key the plan admitted rows of and left slots free is roomy",
			window: []Candidate{gated("a", "api:x", 10, 2), gated("b", "api:x", 10, 2), gated("c", "api:y", 2, 1), gated("d", "api:y", 2, 1)},
			st: state(func(st *State) {
				st.Gates["api:x"] = counters([]int{5, 5}, []int{3, 4})
				st.Gates["api:y"] = counters([]int{2}, []int{2})
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a", "b", "c", "d"}, ids(p))
				require.Equal(t, []string{"api:x"}, p.Roomy, "api:y is full once its two rows are in")
				require.Empty(t, p.Saturated)
			},
		},
		{
			name:   "gate: a key full or saturated in the plan, or with counters held elsewhere, is not roomy",
			window: []Candidate{gated("a", "api:x", 2, 1), gated("b", "api:x", 2, 1), gated("c", "api:y", 4, 2)},
			st: state(func(st *State) {
				st.Gates["api:x"] = counters([]int{2}, []int{1})
				st.Gates["api:y"] = GateState{Counters: []Counter{{Shard: 0, Capacity: 2, Available: 2}}, HeldElsewhere: true, Count: 2}
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a", "c"}, ids(p))
				require.Equal(t, []string{"api:x"}, p.Saturated)
				require.Empty(t, p.Roomy)
			},
		},
		{
			name:   "gate: admitted while a shard has room, then blocked",
			window: []Candidate{gated("a", "api:x", 2, 1), gated("b", "api:x", 2, 1), gated("c", "api:x", 2, 1)},
			st:     state(func(st *State) { st.Gates["api:x"] = counters([]int{2}, []int{2}) }),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []Admitted{{ID: "a", Shard: 0}, {ID: "b", Shard: 0}}, p.Admitted)
				require.Equal(t, []string{"c"}, p.Blocked)
				require.Equal(t, []string{"api:x"}, p.Saturated)
				require.Equal(t, map[ShardKey]int{{"api:x", 0}: 2}, p.Debits)
			},
		},
		{
			name:   "gate: slots in use at the limit block even when a shard shows room",
			window: []Candidate{gated("a", "api:x", 2, 2)},
			// The limit was lowered to 2 (1+1) but shard 0 still holds 2 executing rows of capacity 3.
			st: state(func(st *State) {
				st.Gates["api:x"] = GateState{Counters: []Counter{{0, 3, 1}, {1, 1, 1}}}
			}),
			check: func(t *testing.T, p Plan) {
				require.Empty(t, p.Admitted)
				require.Equal(t, []string{"a"}, p.Blocked)
				require.Empty(t, p.Debits)
			},
		},
		{
			name:   "gate: the shard with the most free slots, the lowest on ties, and never a shard beyond the limit's",
			window: []Candidate{gated("a", "api:x", 9, 3), gated("b", "api:x", 9, 3), gated("c", "api:x", 9, 3), gated("d", "api:x", 9, 3)},
			st: state(func(st *State) {
				// Shard 3 is left from a wider sharding: it must not be used.
				st.Gates["api:x"] = GateState{Counters: []Counter{{0, 3, 1}, {1, 3, 2}, {2, 3, 2}, {3, 3, 3}}}
			}),
			check: func(t *testing.T, p Plan) {
				// in use 2+1+1+0 = 4 < 9: (1,2) ties, take 1; then 2 has most; then 0,1,2 tie at 1: take 0.
				require.Equal(t, []Admitted{{ID: "a", Shard: 1}, {ID: "b", Shard: 2}, {ID: "c", Shard: 0}, {ID: "d", Shard: 1}}, p.Admitted)
				require.Equal(t, map[ShardKey]int{{"api:x", 0}: 1, {"api:x", 1}: 2, {"api:x", 2}: 1}, p.Debits)
			},
		},
		{
			name:   "gate held elsewhere with clean shards: the locked shards are used, then the rows stay ready",
			window: []Candidate{gated("a", "api:x", 4, 2), gated("b", "api:x", 4, 2), gated("c", "api:x", 4, 2)},
			st: state(func(st *State) {
				st.Gates["api:x"] = GateState{Counters: []Counter{{1, 2, 2}}, HeldElsewhere: true, Count: 2}
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []Admitted{{ID: "a", Shard: 1}, {ID: "b", Shard: 1}}, p.Admitted)
				require.Empty(t, p.Blocked, "the holder may be freeing a slot: never blocked")
				require.Empty(t, p.Saturated)
				require.Equal(t, []string{"api:x"}, p.Unsettled, "c was left for want of room it could see")
			},
		},
		{
			name: "gate read without locks (an optimistic claim): admitted within each counter, never blocked, left ready when full",
			window: []Candidate{gated("a", "api:x", 4, 2), gated("b", "api:x", 4, 2), gated("c", "api:x", 4, 2),
				gated("d", "api:y", 4, 2)},
			st: state(func(st *State) {
				st.Gates["api:x"] = GateState{Counters: []Counter{{0, 2, 1}, {1, 2, 1}}, HeldElsewhere: true, Count: 2}
				st.Gates["api:y"] = GateState{Counters: []Counter{{0, 2, 2}, {1, 2, 0}}, HeldElsewhere: true, Count: 2}
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []Admitted{{ID: "a", Shard: 0}, {ID: "b", Shard: 1}, {ID: "d", Shard: 0}}, p.Admitted)
				require.Equal(t, map[ShardKey]int{{"api:x", 0}: 1, {"api:x", 1}: 1, {"api:y", 0}: 1}, p.Debits)
				require.Empty(t, p.Blocked)
				require.Empty(t, p.Saturated)
				require.Equal(t, []string{"api:x"}, p.Unsettled)
			},
		},
		{
			name:   "gate held elsewhere mid re-shard: the rows stay ready",
			window: []Candidate{gated("a", "api:x", 4, 2)},
			st: state(func(st *State) {
				st.Gates["api:x"] = GateState{Counters: []Counter{{1, 2, 2}}, HeldElsewhere: true, Count: 3}
			}),
			check: func(t *testing.T, p Plan) {
				require.Empty(t, p.Admitted)
				require.Empty(t, p.Blocked)
				require.Empty(t, p.Debits)
				require.Equal(t, []string{"api:x"}, p.Unsettled)
			},
		},
		{
			name:   "gate with every counter held elsewhere: the rows stay ready",
			window: []Candidate{gated("a", "api:x", 4, 2)},
			st:     state(func(st *State) { st.Gates["api:x"] = GateState{HeldElsewhere: true, Count: 2} }),
			check: func(t *testing.T, p Plan) {
				require.Empty(t, p.Admitted)
				require.Empty(t, p.Blocked)
			},
		},
		{
			name:   "MaxActivePerKey blocks a key's rows once it is reached, admitted ones included",
			window: []Candidate{gated("a", "api:x", 9, 1), gated("b", "api:x", 9, 1), gated("c", "api:x", 9, 1), row("x", "")},
			st: state(func(st *State) {
				st.Gates["api:x"] = counters([]int{9}, []int{8})
				st.Policy = &Policy{MaxActive: 100, MaxActivePerKey: 2}
				st.Active, st.KeyActive["api:x"] = 1, 1
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a", "x"}, ids(p))
				require.Equal(t, []string{"b", "c"}, p.Blocked)
				require.Empty(t, p.Saturated, "the key itself has room")
				require.Equal(t, map[ShardKey]int{{"api:x", 0}: 1}, p.Debits)
			},
		},
		{
			name:   "MaxActive leaves rows ready",
			window: []Candidate{row("a", ""), row("b", "acct:1"), row("c", ""), row("d", "acct:2")},
			st: state(func(st *State) {
				st.Locked["acct:1"], st.Locked["acct:2"] = true, true
				st.Policy = &Policy{MaxActive: 3}
				st.Active = 1
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a", "b"}, ids(p))
				require.Empty(t, p.Blocked)
				require.Empty(t, p.Throttled)
			},
		},
		{
			name:   "the claim's Limit leaves rows ready",
			window: []Candidate{row("a", ""), row("b", ""), gated("c", "api:x", 5, 1), row("d", "")},
			st: state(func(st *State) {
				st.Limit = 2
				st.Gates["api:x"] = counters([]int{5}, []int{5})
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a", "b"}, ids(p))
				require.Empty(t, p.Blocked)
				require.Empty(t, p.Debits)
			},
		},
		{
			name: "composition: rows a busy K = 1 key blocks take no token",
			window: []Candidate{
				rated(row("a", "api:1"), rl), rated(row("b", "api:1"), rl), rated(row("c", "api:1"), rl), rated(row("d", "api:1"), rl),
			},
			st: state(func(st *State) {
				st.Locked["api:1"] = true
				st.Buckets["api"] = bucketWith(rl, 2)
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a"}, ids(p))
				require.Equal(t, []string{"b", "c", "d"}, p.Blocked)
				require.Empty(t, p.Throttled)
				require.Equal(t, bucketWith(rl, 1), p.Buckets["api"])
			},
		},
		{
			name: "rate limit: a row needs a token; the i-th refused row of a bucket waits for i tokens and stays ready",
			window: []Candidate{
				rated(row("a", "api:1"), rl), rated(row("b", "api:2"), rl), rated(row("c", "api:3"), rl), rated(row("x", "web:1"), perSecond("web", 1)),
			},
			st: state(func(st *State) {
				for _, k := range []string{"api:1", "api:2", "api:3", "web:1"} {
					st.Locked[k] = true
				}
				st.Buckets["api"] = bucketWith(rl, 1)
				// web's bucket is missing: it starts full.
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a", "x"}, ids(p))
				require.Equal(t, []Throttled{{"b", now.Add(time.Second)}, {"c", now.Add(2 * time.Second)}}, p.Throttled)
				require.Empty(t, p.Blocked)
				require.Equal(t, gate.Bucket{Credit: 0, At: now}, p.Buckets["api"])
				require.Equal(t, gate.Bucket{Credit: 0, At: now}, p.Buckets["web"])
			},
		},
		{
			name:   "rate limit: rows already rescheduled by the claim push the next one back",
			window: []Candidate{rated(row("a", "api:1"), rl)},
			st: state(func(st *State) {
				st.Locked["api:1"] = true
				st.Buckets["api"] = bucketWith(rl, 0)
				st.Rescheduled = map[string]int{"api": 2}
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []Throttled{{"a", now.Add(3 * time.Second)}}, p.Throttled)
			},
		},
		{
			name:   "rate limit: the bucket is refilled to the claim's now",
			window: []Candidate{rated(row("a", "api:1"), rl), rated(row("b", "api:2"), rl)},
			st: state(func(st *State) {
				st.Locked["api:1"], st.Locked["api:2"] = true, true
				st.Buckets["api"] = gate.Bucket{Credit: 0, At: now.Add(-1500 * time.Millisecond)}
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a"}, ids(p))
				// 1.5 tokens refilled, one taken: half a token left, the next whole one half a second away.
				require.Equal(t, []Throttled{{"b", now.Add(500 * time.Millisecond)}}, p.Throttled)
			},
		},
		{
			name:   "composition: a throttled row debits no gate slot and no queue capacity",
			window: []Candidate{rated(gated("a", "api:x", 5, 1), rl), row("b", ""), row("c", "")},
			st: state(func(st *State) {
				st.Gates["api:x"] = counters([]int{5}, []int{5})
				st.Buckets["api"] = bucketWith(rl, 0)
				st.Policy = &Policy{MaxActive: 2}
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"b", "c"}, ids(p))
				require.Len(t, p.Throttled, 1)
				require.Empty(t, p.Debits)
				require.Empty(t, p.Buckets)
			},
		},
		{
			name:   "composition: a row refused by its gate or by MaxActivePerKey takes no token",
			window: []Candidate{rated(gated("a", "api:x", 1, 1), rl), rated(row("b", "api:y"), rl), rated(row("c", "api:z"), rl)},
			st: state(func(st *State) {
				st.Gates["api:x"] = counters([]int{1}, []int{0})
				st.Locked["api:y"], st.Locked["api:z"] = true, true
				st.Buckets["api"] = bucketWith(rl, 1)
				st.Policy = &Policy{MaxActive: 10, MaxActivePerKey: 1}
				st.KeyActive["api:y"] = 1
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"c"}, ids(p), "c gets the only token")
				require.Equal(t, []string{"a", "b"}, p.Blocked)
				require.Empty(t, p.Throttled)
				require.Empty(t, p.Debits)
			},
		},
		{
			name:   "composition: a row refused by MaxActive takes no token and no gate slot",
			window: []Candidate{row("a", ""), rated(gated("b", "api:x", 5, 1), rl)},
			st: state(func(st *State) {
				st.Gates["api:x"] = counters([]int{5}, []int{5})
				st.Buckets["api"] = bucketWith(rl, 2)
				st.Policy = &Policy{MaxActive: 1}
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a"}, ids(p))
				require.Empty(t, p.Debits)
				require.Empty(t, p.Buckets)
			},
		},
	})
}

// TestDecideReserves: with State.Reserve, the rows a claim would block of a
// key it admitted rows of and found full are reserved as those rows'
// successors, dealt in turn, under the hand-off's rule.
func TestDecideReserves(t *testing.T) {
	rl := perSecond("api", 5)
	gateOf := func(n int, ids ...string) []Candidate {
		var w []Candidate
		for _, id := range ids {
			w = append(w, gated(id, "api:x", n, 1))
		}
		return w
	}
	full := func(n, reserve int) State {
		return state(func(st *State) {
			st.Gates["api:x"] = counters([]int{n}, []int{n})
			st.Reserve = reserve
		})
	}
	runDecide(t, []decideCase{
		{
			name:   "one successor for each admitted row, the rest blocked",
			window: gateOf(2, "a", "b", "c", "d", "e"),
			st:     full(2, 1),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a", "b"}, ids(p))
				require.Equal(t, []Reservation{{"c", "a"}, {"d", "b"}}, p.Reserved)
				require.Equal(t, []string{"e"}, p.Blocked)
				require.Equal(t, []string{"api:x"}, p.Saturated)
			},
		},
		{
			name:   "successors are dealt to the admitted rows in turn",
			window: gateOf(2, "a", "b", "c", "d", "e", "f", "g"),
			st:     full(2, 2),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []Reservation{{"c", "a"}, {"d", "b"}, {"e", "a"}, {"f", "b"}}, p.Reserved)
				require.Equal(t, []string{"g"}, p.Blocked)
			},
		},
		{
			name:   "without Reserve nothing is reserved",
			window: gateOf(1, "a", "b"),
			st:     full(1, 0),
			check: func(t *testing.T, p Plan) {
				require.Empty(t, p.Reserved)
				require.Equal(t, []string{"b"}, p.Blocked)
			},
		},
		{
			name:   "K = 1: the key's next rows follow the row admitted",
			window: []Candidate{row("a1", "acct:1"), row("b1", "acct:2"), row("a2", "acct:1"), row("a3", "acct:1")},
			st: state(func(st *State) {
				st.Locked["acct:1"], st.Locked["acct:2"] = true, true
				st.Reserve = 1
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a1", "b1"}, ids(p))
				require.Equal(t, []Reservation{{"a2", "a1"}}, p.Reserved)
				require.Equal(t, []string{"a3"}, p.Blocked)
			},
		},
		{
			name:   "K = 1: a key busy elsewhere has no row admitted here to follow",
			window: []Candidate{row("a1", "acct:1"), row("a2", "acct:1")},
			st: state(func(st *State) {
				st.Locked["acct:1"], st.Busy["acct:1"] = true, true
				st.Reserve = 1
			}),
			check: func(t *testing.T, p Plan) {
				require.Empty(t, p.Reserved)
				require.Equal(t, []string{"a1", "a2"}, p.Blocked)
			},
		},
		{
			name: "a row left ready before ends reservations: it may be of an earlier round",
			window: []Candidate{gated("a", "api:x", 1, 1), gated("b", "api:x", 1, 1), row("k", "acct:9"),
				gated("c", "api:x", 1, 1), gated("d", "api:x", 1, 1)},
			st: full(1, 3),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a"}, ids(p))
				require.Equal(t, []Reservation{{"b", "a"}}, p.Reserved, "k's key is locked elsewhere: left ready")
				require.Equal(t, []string{"c", "d"}, p.Blocked)
			},
		},
		{
			name:   "a row left ready by the claim's limit ends reservations too",
			window: []Candidate{gated("a", "api:x", 1, 1), row("x", ""), gated("b", "api:x", 1, 1)},
			st: state(func(st *State) {
				st.Gates["api:x"] = counters([]int{1}, []int{1})
				st.Reserve, st.Limit = 1, 1
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a"}, ids(p))
				require.Empty(t, p.Reserved)
				require.Equal(t, []string{"b"}, p.Blocked)
			},
		},
		{
			name:   "a queue with a policy reserves nothing",
			window: gateOf(1, "a", "b"),
			st: state(func(st *State) {
				st.Gates["api:x"] = counters([]int{1}, []int{1})
				st.Reserve, st.Policy = 1, &Policy{MaxActive: 10}
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a"}, ids(p))
				require.Empty(t, p.Reserved)
				require.Equal(t, []string{"b"}, p.Blocked)
			},
		},
		{
			name:   "a rate-limited key reserves nothing: a reservation takes no token",
			window: []Candidate{rated(gated("a", "api:x", 1, 1), rl), rated(gated("b", "api:x", 1, 1), rl)},
			st: state(func(st *State) {
				st.Gates["api:x"] = counters([]int{1}, []int{1})
				st.Reserve = 1
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a"}, ids(p))
				require.Empty(t, p.Reserved)
				require.Equal(t, []string{"b"}, p.Blocked)
			},
		},
		{
			name:   "a key with counters held elsewhere is not found full: nothing blocked, nothing reserved",
			window: gateOf(1, "a", "b"),
			st: state(func(st *State) {
				st.Gates["api:x"] = GateState{HeldElsewhere: true, Count: 1,
					Counters: []Counter{{Shard: 0, Capacity: 1, Available: 1}}}
				st.Reserve = 1
			}),
			check: func(t *testing.T, p Plan) {
				require.Equal(t, []string{"a"}, ids(p))
				require.Empty(t, p.Reserved)
				require.Empty(t, p.Blocked)
			},
		},
	})
}

// TestDecideLeavesStateAlone checks that Decide debits copies: a store may
// hand it maps it goes on using.
func TestDecideLeavesStateAlone(t *testing.T) {
	rl := perSecond("api", 1)
	st := state(func(st *State) {
		st.Gates["api:x"] = counters([]int{2}, []int{2})
		st.Buckets["api"] = bucketWith(rl, 1)
	})
	p := Decide([]Candidate{rated(gated("a", "api:x", 2, 1), rl)}, st)
	require.Equal(t, []Admitted{{ID: "a", Shard: 0}}, p.Admitted)
	require.Equal(t, 2, st.Gates["api:x"].Counters[0].Available)
	require.Equal(t, bucketWith(rl, 1), st.Buckets["api"])

	st.Buckets["api"] = bucketWith(rl, 0)
	st.Rescheduled = map[string]int{"api": 1}
	st.Locked["api:1"] = true
	p = Decide([]Candidate{rated(row("b", "api:1"), rl)}, st)
	require.Len(t, p.Throttled, 1)
	require.Equal(t, map[string]int{"api": 1}, st.Rescheduled)
}

func TestSortedDebits(t *testing.T) {
	p := Plan{Debits: map[ShardKey]int{{"b", 0}: 1, {"a", 2}: 1, {"a", 0}: 3}}
	require.Equal(t, []ShardKey{{"a", 0}, {"a", 2}, {"b", 0}}, p.SortedDebits())
}
