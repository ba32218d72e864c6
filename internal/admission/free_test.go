package admission

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
)

func waiting(id, key string) Waiting {
	return Waiting{ID: id, Key: key, Queue: "q", Workflow: "wf", Version: 1}
}

// runs is a FreeState.Runs for a worker that runs version 1 of workflows.
func runs(workflows ...string) func(string, int) bool {
	return func(w string, v int) bool { return v == 1 && slices.Contains(workflows, w) }
}

func freeState(mut func(*FreeState)) FreeState {
	st := NewFreeState(map[string]int{"q": 10}, nil)
	if mut != nil {
		mut(&st)
	}
	return st
}

// withGate gives key k the limit and clean, fully used counters.
func withGate(k string, limit, shards int) func(*FreeState) {
	return func(st *FreeState) {
		lim := gate.Limit{Name: gate.NameOf(k), Limit: limit, Shards: shards}
		st.Limits[k] = lim
		st.Count[k] = shards
		for i, c := range lim.ShardCapacities() {
			st.Counters[k] = append(st.Counters[k], Counter{Shard: i, Capacity: c, Available: 0})
		}
	}
}

func handed(p FreePlan) []Admitted { return p.HandOffs }

// multiAt is a waiting row of several keys in key's line, at its first key
// or not, with the other keys also.
func multiAt(id, key string, first bool, also ...string) Waiting {
	w := waiting(id, key)
	w.Also, w.AtFirst = also, first
	return w
}

func TestFree(t *testing.T) {
	one := []Freed{{Key: "a:1", Shard: -1}}
	line := []Waiting{waiting("r1", "a:1"), waiting("r2", "a:1")}
	for _, tc := range []struct {
		name    string
		freed   []Freed
		waiting []Waiting
		st      FreeState
		want    []Admitted
		rest    []Freed
	}{
		{name: "a K = 1 key goes to its next row, one row only", freed: one, waiting: line, st: freeState(nil),
			want: []Admitted{{ID: "r1", Shard: -1}}},
		{name: "a K = 1 key is handed to one row, even if listed freed twice",
			freed: []Freed{{Key: "a:1", Shard: -1}, {Key: "a:1", Shard: -1}}, waiting: line, st: freeState(nil),
			want: []Admitted{{ID: "r1", Shard: -1}}, rest: []Freed{{Key: "a:1", Shard: -1}}},
		{name: "a K = 1 key with nothing waiting is freed", freed: one, st: freeState(nil), rest: one},
		{name: "a K = 1 key that still executes is not handed", freed: one, waiting: line,
			st: freeState(func(st *FreeState) { st.Busy["a:1"] = true }), rest: one},
		{name: "a K = 1 key whose name got a limit is freed", freed: one, waiting: line,
			st: freeState(withGate("a:1", 2, 1)), rest: one},
		{name: "no room in the row's queue", freed: one, waiting: line,
			st: freeState(func(st *FreeState) { st.Room = map[string]int{"other": 5} }), rest: one},
		{name: "a workflow the worker does not run", freed: one, waiting: line,
			st: freeState(func(st *FreeState) { st.Runs = runs("x") }), rest: one},
		{name: "a version of its workflow the worker does not run", freed: one,
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Workflow: "wf", Version: 2}},
			st:      freeState(func(st *FreeState) { st.Runs = runs("wf") }), rest: one},
		{name: "a queue policy", freed: one, waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Policy: true}},
			st: freeState(nil), rest: one},
		{name: "a rate limit", freed: one, waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Rated: true}},
			st: freeState(nil), rest: one},
		{name: "a row of several keys whose other key has no slot stops the line", freed: one,
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Also: []string{"b:1"}}, {ID: "r2", Key: "a:1", Queue: "q"}},
			st:      freeState(nil), rest: one},
		{name: "a row of several keys takes its other key's freed slot with its own",
			freed:   []Freed{{Key: "a:1", Shard: -1}, {Key: "g:1", Shard: 1}},
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Also: []string{"g:1"}}},
			st:      freeState(withGate("g:1", 4, 2)),
			want:    []Admitted{{ID: "r1", Shard: -1, Also: []Hold{{Key: "g:1", Shard: 1}}}}},
		{name: "the other key's slot comes first in the batch",
			freed:   []Freed{{Key: "g:1", Shard: 1}, {Key: "a:1", Shard: -1}},
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Also: []string{"g:1"}}},
			st:      freeState(withGate("g:1", 4, 2)),
			want:    []Admitted{{ID: "r1", Shard: -1, Also: []Hold{{Key: "g:1", Shard: 1}}}}},
		{name: "a row waiting in the other key's line keeps that key's slot",
			freed: []Freed{{Key: "a:1", Shard: -1}, {Key: "g:1", Shard: 1}},
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Also: []string{"g:1"}},
				{ID: "r2", Key: "g:1", Queue: "q"}},
			st:   freeState(withGate("g:1", 4, 2)),
			want: []Admitted{{ID: "r2", Shard: 1}}, rest: one},
		{name: "a row of several keys in the other key's line does not pass it either",
			freed: []Freed{{Key: "a:1", Shard: -1}, {Key: "g:1", Shard: 1}},
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Also: []string{"g:1"}},
				{ID: "r2", Key: "g:1", Queue: "q", Also: []string{"a:2"}}},
			st:   freeState(withGate("g:1", 4, 2)),
			rest: []Freed{{Key: "a:1", Shard: -1}, {Key: "g:1", Shard: 1}}},
		{name: "a tried K = 1 key goes with a freed gate slot",
			freed: []Freed{{Key: "a:1", Shard: -1}, {Key: "g:1", Shard: 1}},
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Also: []string{"g:1"}},
				{ID: "r2", Key: "g:1", Queue: "q", Also: []string{"a:2"}}},
			st:   freeState(func(st *FreeState) { withGate("g:1", 4, 2)(st); st.Tried = map[string]bool{"a:2": true} }),
			want: []Admitted{{ID: "r2", Shard: 1, Also: []Hold{{Key: "a:2", Shard: -1}}}}, rest: one},
		{name: "a row of several keys takes no slot of a key with slots to spare",
			freed:   []Freed{{Key: "g:1", Shard: 1}},
			waiting: []Waiting{{ID: "r1", Key: "g:1", Queue: "q", Also: []string{"a:2"}}},
			st: freeState(func(st *FreeState) {
				withGate("g:1", 4, 2)(st)
				st.Counters["g:1"][0].Available = 1
				st.Tried = map[string]bool{"a:2": true}
			}),
			rest: []Freed{{Key: "g:1", Shard: 1}}},
		{name: "a tried key goes to one row",
			freed: []Freed{{Key: "g:1", Shard: 1}, {Key: "g:1", Shard: 0}},
			waiting: []Waiting{{ID: "r1", Key: "g:1", Queue: "q", Also: []string{"a:2"}},
				{ID: "r2", Key: "g:1", Queue: "q", Also: []string{"a:2"}}},
			st:   freeState(func(st *FreeState) { withGate("g:1", 4, 2)(st); st.Tried = map[string]bool{"a:2": true} }),
			want: []Admitted{{ID: "r1", Shard: 1, Also: []Hold{{Key: "a:2", Shard: -1}}}}, rest: []Freed{{Key: "g:1", Shard: 0}}},
		{name: "a slot that may not pass is not taken as another key's",
			freed:   []Freed{{Key: "a:1", Shard: -1}, {Key: "g:1", Shard: 3}},
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Also: []string{"g:1"}}},
			st:      freeState(withGate("g:1", 4, 2)),
			rest:    []Freed{{Key: "g:1", Shard: 3}, {Key: "a:1", Shard: -1}}},
		{name: "a row of several keys needs room in its queue",
			freed:   []Freed{{Key: "a:1", Shard: -1}, {Key: "g:1", Shard: 1}},
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Also: []string{"g:1"}}},
			st:      freeState(func(st *FreeState) { withGate("g:1", 4, 2)(st); st.Room = map[string]int{"other": 5} }),
			rest:    []Freed{{Key: "a:1", Shard: -1}, {Key: "g:1", Shard: 1}}},
		{name: "out of turn: another key's earlier round", freed: one,
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Turn: Turn{Round: 3}, Head: &Turn{Round: 2}}},
			st:      freeState(nil), rest: one},
		{name: "out of turn: a better priority waits, whatever its round", freed: one,
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Turn: Turn{Priority: 10, Round: 0}, Head: &Turn{Priority: 0, Round: 50}}},
			st:      freeState(nil), rest: one},
		{name: "in turn: the head is of a worse priority", freed: one,
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Workflow: "wf", Turn: Turn{Priority: 0, Round: 9}, Head: &Turn{Priority: 1, Round: 0}}},
			st:      freeState(nil), want: []Admitted{{ID: "r1", Shard: -1}}},
		{name: "gate slots go to the key's next rows in line, each with its shard",
			freed:   []Freed{{Key: "g:1", Shard: 1}, {Key: "g:1", Shard: 0}},
			waiting: []Waiting{waiting("r1", "g:1"), waiting("r2", "g:1"), waiting("r3", "g:1")},
			st:      freeState(withGate("g:1", 4, 2)),
			want:    []Admitted{{ID: "r1", Shard: 1}, {ID: "r2", Shard: 0}}},
		{name: "room runs out: the rest is freed",
			freed:   []Freed{{Key: "g:1", Shard: 0}, {Key: "g:1", Shard: 0}},
			waiting: []Waiting{waiting("r1", "g:1"), waiting("r2", "g:1")},
			st:      freeState(func(st *FreeState) { withGate("g:1", 4, 1)(st); st.Room["q"] = 1 }),
			want:    []Admitted{{ID: "r1", Shard: 0}}, rest: []Freed{{Key: "g:1", Shard: 0}}},
		{name: "a key's line stops at its first row that cannot take a slot",
			freed:   []Freed{{Key: "g:1", Shard: 0}, {Key: "g:1", Shard: 0}},
			waiting: []Waiting{{ID: "r1", Key: "g:1", Queue: "other"}, waiting("r2", "g:1")},
			st:      freeState(withGate("g:1", 4, 1)),
			rest:    []Freed{{Key: "g:1", Shard: 0}, {Key: "g:1", Shard: 0}}},
		{name: "a gate whose name lost its limit is freed", freed: []Freed{{Key: "g:1", Shard: 0}},
			waiting: []Waiting{waiting("r1", "g:1")}, st: freeState(nil), rest: []Freed{{Key: "g:1", Shard: 0}}},
		{name: "a shard the limit no longer has is freed", freed: []Freed{{Key: "g:1", Shard: 1}},
			waiting: []Waiting{waiting("r1", "g:1")}, st: freeState(withGate("g:1", 4, 1)), rest: []Freed{{Key: "g:1", Shard: 1}}},
		{name: "counters not in the limit's shape (a lowered limit) are freed", freed: []Freed{{Key: "g:1", Shard: 0}},
			waiting: []Waiting{waiting("r1", "g:1")},
			st: freeState(func(st *FreeState) {
				withGate("g:1", 1, 1)(st)
				st.Counters["g:1"][0].Capacity = 2
			}), rest: []Freed{{Key: "g:1", Shard: 0}}},
		{name: "a counter held elsewhere in part (fewer counters than shards) is freed", freed: []Freed{{Key: "g:1", Shard: 0}},
			waiting: []Waiting{waiting("r1", "g:1")},
			st:      freeState(func(st *FreeState) { withGate("g:1", 4, 2)(st); st.Count["g:1"] = 3 }),
			rest:    []Freed{{Key: "g:1", Shard: 0}}},
		{name: "a shard in debt is freed", freed: []Freed{{Key: "g:1", Shard: 0}},
			waiting: []Waiting{waiting("r1", "g:1")},
			st:      freeState(func(st *FreeState) { withGate("g:1", 2, 1)(st); st.Counters["g:1"][0].Available = -1 }),
			rest:    []Freed{{Key: "g:1", Shard: 0}}},
		{name: "a gate key with a free slot besides the freed one is freed: claims admit its rows",
			freed:   []Freed{{Key: "g:1", Shard: 0}, {Key: "g:1", Shard: 1}},
			waiting: []Waiting{waiting("r1", "g:1"), waiting("r2", "g:1")},
			st:      freeState(func(st *FreeState) { withGate("g:1", 4, 2)(st); st.Counters["g:1"][1].Available = 1 }),
			rest:    []Freed{{Key: "g:1", Shard: 0}, {Key: "g:1", Shard: 1}}},
		{name: "keys are independent",
			freed:   []Freed{{Key: "a:1", Shard: -1}, {Key: "a:2", Shard: -1}},
			waiting: []Waiting{{ID: "r1", Key: "a:1", Queue: "other"}, waiting("r2", "a:2")},
			st:      freeState(nil),
			want:    []Admitted{{ID: "r2", Shard: -1}}, rest: []Freed{{Key: "a:1", Shard: -1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(tc.st.Room)
			p := Free(tc.freed, tc.waiting, tc.st)
			require.Equal(t, tc.want, handed(p))
			require.Equal(t, tc.rest, p.Rest)
			require.Len(t, tc.st.Room, before)
			used := len(p.Rest)
			for _, a := range p.HandOffs {
				used++
				for _, h := range a.Also { // a freed slot, or a tried key
					if slices.ContainsFunc(tc.freed, func(f Freed) bool { return f.Key == h.Key }) {
						used++
					}
				}
			}
			require.Equal(t, len(tc.freed), used, "every freed slot is handed off or freed")
			if strings.HasPrefix(tc.name, "a gate key with a free slot") || strings.Contains(tc.name, "slots to spare") {
				require.Equal(t, []string{"g:1"}, p.Roomy)
			} else {
				require.Empty(t, p.Roomy)
			}
		})
	}
}

func TestFreeReservations(t *testing.T) {
	reserve := func(mut func(*FreeState)) FreeState {
		return freeState(func(st *FreeState) {
			st.Reserve = true
			if mut != nil {
				mut(st)
			}
		})
	}
	line := []Waiting{waiting("r1", "a:1"), waiting("r2", "a:1"), waiting("r3", "a:1"), waiting("r4", "a:1")}
	for _, tc := range []struct {
		name     string
		freed    []Freed
		waiting  []Waiting
		st       FreeState
		succeed  []Admitted
		handed   []Admitted
		reserved []Reservation
		rest     []Freed
	}{
		{name: "a hand-off reserves Ahead of the key's next rows for the row handed the slot, in line",
			freed: []Freed{{Key: "a:1", Shard: -1, Ahead: 2}}, waiting: line, st: reserve(nil),
			handed:   []Admitted{{ID: "r1", Shard: -1}},
			reserved: []Reservation{{ID: "r2", After: "r1"}, {ID: "r3", After: "r1"}}},
		{name: "without Reserve, no reservation",
			freed: []Freed{{Key: "a:1", Shard: -1, Ahead: 2}}, waiting: line, st: freeState(nil),
			handed: []Admitted{{ID: "r1", Shard: -1}}},
		{name: "a successor takes its slot and gets the next rows reserved",
			freed: []Freed{{Key: "a:1", Shard: -1, Successor: "s", Queue: "q", Ahead: 1}}, waiting: line, st: reserve(nil),
			succeed: []Admitted{{ID: "s", Shard: -1}}, reserved: []Reservation{{ID: "r1", After: "s"}}},
		{name: "a successor takes its slot even when the slot would not pass, but gets nothing reserved",
			freed: []Freed{{Key: "a:1", Shard: -1, Successor: "s", Queue: "q", Ahead: 2}}, waiting: line,
			st:      reserve(func(st *FreeState) { st.Busy["a:1"] = true }),
			succeed: []Admitted{{ID: "s", Shard: -1}}},
		{name: "a successor takes its slot with no room in its queue",
			freed: []Freed{{Key: "a:1", Shard: -1, Successor: "s", Queue: "q"}}, waiting: line,
			st:      reserve(func(st *FreeState) { st.Room = map[string]int{} }),
			succeed: []Admitted{{ID: "s", Shard: -1}}},
		{name: "a row of another queue ends the reservations",
			freed: []Freed{{Key: "a:1", Shard: -1, Ahead: 3}},
			waiting: []Waiting{waiting("r1", "a:1"), waiting("r2", "a:1"),
				{ID: "r3", Key: "a:1", Queue: "other", Workflow: "wf"}, waiting("r4", "a:1")},
			st:       reserve(func(st *FreeState) { st.Room["other"] = 1 }),
			handed:   []Admitted{{ID: "r1", Shard: -1}},
			reserved: []Reservation{{ID: "r2", After: "r1"}}},
		{name: "a row out of turn ends the reservations",
			freed: []Freed{{Key: "a:1", Shard: -1, Ahead: 3}},
			waiting: []Waiting{waiting("r1", "a:1"),
				{ID: "r2", Key: "a:1", Queue: "q", Workflow: "wf", Turn: Turn{Round: 5}, Head: &Turn{Round: 4}}, waiting("r3", "a:1")},
			st: reserve(nil), handed: []Admitted{{ID: "r1", Shard: -1}}},
		{name: "a workflow the worker does not run ends the reservations",
			freed: []Freed{{Key: "a:1", Shard: -1, Ahead: 3}},
			waiting: []Waiting{waiting("r1", "a:1"),
				{ID: "r2", Key: "a:1", Queue: "q", Workflow: "unknown"}},
			st:     reserve(func(st *FreeState) { st.Runs = runs("wf") }),
			handed: []Admitted{{ID: "r1", Shard: -1}}},
		{name: "gate slots: each row handed a slot gets its own reservations, in slot order",
			freed:    []Freed{{Key: "g:1", Shard: 0, Ahead: 1}, {Key: "g:1", Shard: 1, Ahead: 1}},
			waiting:  []Waiting{waiting("g1", "g:1"), waiting("g2", "g:1"), waiting("g3", "g:1"), waiting("g4", "g:1")},
			st:       reserve(withGate("g:1", 2, 2)),
			handed:   []Admitted{{ID: "g1", Shard: 0}, {ID: "g2", Shard: 1}},
			reserved: []Reservation{{ID: "g3", After: "g1"}, {ID: "g4", After: "g2"}}},
		{name: "a successor of several keys gets the next rows of the same keys in its first key's line reserved",
			freed:   []Freed{{Key: "a:1", Shard: -1, Successor: "s", Queue: "q", Ahead: 3, Also: []string{"g:1", "b:1"}}},
			waiting: []Waiting{multiAt("m1", "a:1", true, "b:1", "g:1"), multiAt("m2", "a:1", true, "g:1", "b:1"), multiAt("m3", "a:1", true, "g:2")},
			st:      reserve(nil), succeed: []Admitted{{ID: "s", Shard: -1}},
			reserved: []Reservation{{ID: "m1", After: "s"}, {ID: "m2", After: "s"}}},
		{name: "a row of other keys than its predecessor's is not reserved: a row of one key after a row of several",
			freed:   []Freed{{Key: "a:1", Shard: -1, Successor: "s", Queue: "q", Ahead: 2, Also: []string{"g:1"}}},
			waiting: []Waiting{waiting("r1", "a:1"), multiAt("m1", "a:1", true, "g:1")},
			st:      reserve(nil), succeed: []Admitted{{ID: "s", Shard: -1}}},
		{name: "a row of other keys than its predecessor's is not reserved: a row of several after a row of one",
			freed:   []Freed{{Key: "a:1", Shard: -1, Successor: "s", Queue: "q", Ahead: 2}},
			waiting: []Waiting{multiAt("m1", "a:1", true, "g:1"), waiting("r1", "a:1")},
			st:      reserve(nil), succeed: []Admitted{{ID: "s", Shard: -1}}},
		{name: "a row of the same keys waiting in another line than its first key's is not reserved",
			freed:   []Freed{{Key: "a:1", Shard: -1, Successor: "s", Queue: "q", Ahead: 2, Also: []string{"g:1"}}},
			waiting: []Waiting{multiAt("m1", "a:1", false, "g:1")},
			st:      reserve(nil), succeed: []Admitted{{ID: "s", Shard: -1}}},
		{name: "a row of several keys handed a slot at its first key gets rows of its keys reserved; elsewhere none",
			freed: []Freed{{Key: "a:1", Shard: -1, Ahead: 1}, {Key: "a:2", Shard: -1, Ahead: 1}},
			waiting: []Waiting{multiAt("m1", "a:1", true, "b:1"), multiAt("m2", "a:1", true, "b:1"),
				multiAt("n1", "a:2", false, "b:2"), multiAt("n2", "a:2", true, "b:2")},
			st: reserve(func(st *FreeState) { st.Tried = map[string]bool{"b:1": true, "b:2": true} }),
			handed: []Admitted{{ID: "m1", Shard: -1, Also: []Hold{{Key: "b:1", Shard: -1}}},
				{ID: "n1", Shard: -1, Also: []Hold{{Key: "b:2", Shard: -1}}}},
			reserved: []Reservation{{ID: "m2", After: "m1"}}},
		{name: "a gate shard the lowered limit no longer has passes to its successor, and reserves nothing",
			freed:   []Freed{{Key: "g:1", Shard: 1, Successor: "s", Queue: "q", Ahead: 2}},
			waiting: []Waiting{waiting("g1", "g:1")},
			st:      reserve(withGate("g:1", 1, 1)),
			succeed: []Admitted{{ID: "s", Shard: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Free(tc.freed, tc.waiting, tc.st)
			require.Equal(t, tc.succeed, p.Successions, "successions")
			require.Equal(t, tc.handed, p.HandOffs, "hand-offs")
			require.Equal(t, tc.reserved, p.Reserved, "reserved")
			require.Equal(t, tc.rest, p.Rest, "rest")
		})
	}
}

// TestFreeRoomyGateSuccessionReservesNothing: a slot that names its
// successor passes to it whatever the counters say (the worker may run it
// already), but a gate key with free slots gets no further successors.
func TestFreeRoomyGateSuccessionReservesNothing(t *testing.T) {
	st := freeState(func(st *FreeState) {
		withGate("g:1", 4, 1)(st)
		st.Counters["g:1"][0].Available = 2
		st.Reserve = true
	})
	p := Free([]Freed{{Key: "g:1", Shard: 0, Successor: "s1", Queue: "q", Ahead: 2}},
		[]Waiting{waiting("r1", "g:1"), waiting("r2", "g:1")}, st)
	require.Equal(t, []Admitted{{ID: "s1", Shard: 0}}, p.Successions)
	require.Empty(t, p.Reserved)
	require.Empty(t, p.HandOffs)

	st.Counters["g:1"][0].Available = 0
	p = Free([]Freed{{Key: "g:1", Shard: 0, Successor: "s1", Queue: "q", Ahead: 2}},
		[]Waiting{waiting("r1", "g:1"), waiting("r2", "g:1")}, st)
	require.Equal(t, []Reservation{{ID: "r1", After: "s1"}, {ID: "r2", After: "s1"}}, p.Reserved, "a full key reserves")

	multi := waiting("r2", "g:1")
	multi.Also = []string{"a:1"}
	p = Free([]Freed{{Key: "g:1", Shard: 0, Successor: "s1", Queue: "q", Ahead: 2}},
		[]Waiting{waiting("r1", "g:1"), multi, waiting("r3", "g:1")}, st)
	require.Equal(t, []Reservation{{ID: "r1", After: "s1"}}, p.Reserved, "the reservations stop at a row of several keys")
}

func TestInTurn(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    Turn
		head *Turn
		want bool
	}{
		{"no other ready row", Turn{Priority: 5, Round: 7}, nil, true},
		{"the head is of a later round", Turn{Round: 1}, &Turn{Round: 2}, true},
		{"a tie is in turn", Turn{Round: 2}, &Turn{Round: 2}, true},
		{"the head is of an earlier round", Turn{Round: 2}, &Turn{Round: 1}, false},
		{"the head has a better priority, whatever the rounds", Turn{Priority: 1, Round: 0}, &Turn{Priority: 0, Round: 99}, false},
		{"the head has a worse priority, whatever the rounds", Turn{Priority: 0, Round: 99}, &Turn{Priority: 1, Round: 0}, true},
		{"a row with no round comes first in its priority", Turn{Round: NoRound}, &Turn{Round: 0}, true},
	} {
		require.Equal(t, tc.want, InTurn(tc.t, tc.head), tc.name)
	}
}

func TestFreeYieldsAChainOutOfTurn(t *testing.T) {
	succ := []Freed{{Key: "a:1", Shard: -1, Successor: "s1", Queue: "q", Ahead: 2}}
	inTurn := []Waiting{waiting("r1", "a:1"), waiting("r2", "a:1")}
	p := Free(succ, inTurn, freeState(func(st *FreeState) { st.Reserve = true }))
	require.Empty(t, p.Yield)
	require.Equal(t, []Reservation{{ID: "r1", After: "s1"}, {ID: "r2", After: "s1"}}, p.Reserved, "in turn: the chain goes on")

	behind := []Waiting{{ID: "r1", Key: "a:1", Queue: "q", Workflow: "wf", Turn: Turn{Priority: 5}, Head: &Turn{Priority: 0}}}
	p = Free(succ, behind, freeState(func(st *FreeState) { st.Reserve = true }))
	require.Equal(t, []Admitted{{ID: "s1", Shard: -1}}, p.Successions, "the successor takes the slot: it may run already")
	require.Empty(t, p.Reserved, "nothing is reserved out of turn")
	require.Equal(t, []string{"s1"}, p.Yield, "and the rest of its chain yields")

	p = Free(succ, behind, freeState(nil))
	require.Equal(t, []string{"s1"}, p.Yield, "without Reserve too")
}

func TestFreeYieldsAChainOverALoweredLimit(t *testing.T) {
	succ := []Freed{{Key: "g:1", Shard: 1, Successor: "s1", Queue: "q", Ahead: 2}}
	line := []Waiting{waiting("r1", "g:1"), waiting("r2", "g:1")}
	p := Free(succ, line, freeState(func(st *FreeState) {
		withGate("g:1", 2, 2)(st)
		st.Reserve = true
	}))
	require.Empty(t, p.Yield, "the slot is one the limit gives")
	p = Free(succ, line, freeState(func(st *FreeState) {
		withGate("g:1", 1, 1)(st) // lowered: shard 1 is gone
		st.Reserve = true
	}))
	require.Equal(t, []Admitted{{ID: "s1", Shard: 1}}, p.Successions, "the successor may run already: it takes the slot")
	require.Empty(t, p.Reserved)
	require.Equal(t, []string{"s1"}, p.Yield, "the chain stops at this flush")
}

func TestFreePassesNoSlotIntoAPausedQueue(t *testing.T) {
	paused := func(st *FreeState) {
		st.Paused = map[string]bool{"q": true}
		st.Reserve = true
	}
	one := []Freed{{Key: "a:1", Shard: -1, Ahead: 2}}
	line := []Waiting{waiting("r1", "a:1"), waiting("r2", "a:1")}
	p := Free(one, line, freeState(paused))
	require.Empty(t, p.HandOffs, "no hand-off into a paused queue")
	require.Empty(t, p.Reserved)
	require.Equal(t, one, p.Rest, "the slot frees: its blocked rows are promoted, and wait")

	other := []Waiting{{ID: "o1", Key: "a:1", Queue: "other", Workflow: "wf"}}
	p = Free(one, other, freeState(func(st *FreeState) {
		paused(st)
		st.Room = map[string]int{"other": 1}
	}))
	require.Equal(t, []Admitted{{ID: "o1", Shard: -1}}, p.HandOffs, "a queue that is not paused still takes it")

	succ := []Freed{{Key: "a:1", Shard: -1, Successor: "s1", Queue: "q", Ahead: 2}}
	p = Free(succ, line, freeState(paused))
	require.Equal(t, []Admitted{{ID: "s1", Shard: -1}}, p.Successions, "a successor may run already: it takes the slot")
	require.Empty(t, p.Reserved, "nothing more is reserved")
	require.Equal(t, []string{"s1"}, p.Yield, "and the rest of its chain yields")
}
