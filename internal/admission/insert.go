package admission

import (
	"cmp"
	"slices"
	"time"
)

// This file is the insert rule of K = 1 keys: which due rows of an insert
// go in blocked rather than ready (see store.Store, Admission). The memory
// store and PostgreSQL's COPY insert path call InsertBlocked; PostgreSQL's
// statement insert (sqlInsert) is its SQL form, pinned equal to the COPY
// path by TestInsertCopyMatchesStatement.

// ReadyCap is the most rows of one K = 1 key an insert leaves on the pick
// path (ready): the key runs one row at a time, and a deep backlog there
// only crowds claims' windows (each claim locks the rows it reads, to
// admit at most one of them). Keys with fewer rows waiting are unaffected:
// taking turns by rounds, their next row usually comes up after the last
// one ended and goes from ready to executing at once, where blocking it at
// insert would cost it a promotion. Measured with the peers driver alone
// (500 keys K = 1, 1 ms steps): with a cap of 16, 40 rows per key fell from
// about 15,000 to 9,000 steps/s (24 promotions per key); with 64 it ran
// 20,837-22,579, and 100 rows per key 8,029-8,959 (7,287-11,437 without a
// cap: that run varies a lot). make
// bench's scenario 5 (100,000 rows of one key) needs the cap well below a
// claim's window.
const ReadyCap = 64

// InsertRow is a due row of an insert batch whose key is a K = 1 key.
type InsertRow struct {
	Key      string
	Priority int
	// At is the row's run_at and Seq its place in the batch: with
	// Priority, the order in which a key's blocked rows are promoted.
	At  time.Time
	Seq int64
}

// KeyState is what an insert read of a K = 1 key before inserting: whether
// a row of it executes (Busy), and how many of its rows are ready and due
// (Ready, read up to ReadyCap).
type KeyState struct {
	Busy  bool
	Ready int
}

// InsertBlocked reports, for each row of rows, whether it goes in blocked.
// A row goes in blocked when its key is busy (a row of it executes), or
// when the key already has ReadyCap rows ready: those it had, then the
// batch's rows in (Priority, At, Seq) order, the order in which blocked
// rows are promoted. Every other row goes in ready. state is called once
// per key.
//
// A row inserted blocked is written once until its turn comes (whatever
// frees the key promotes it), and never sits in a claim's window.
func InsertBlocked(rows []InsertRow, state func(key string) KeyState) []bool {
	out := make([]bool, len(rows))
	keys, byKey := groupByKey(rows)
	for _, k := range keys {
		st := state(k)
		idx := byKey[k]
		if st.Busy {
			for _, i := range idx {
				out[i] = true
			}
			continue
		}
		if st.Ready+len(idx) <= ReadyCap {
			continue
		}
		// Rank the key's rows in promotion order; past the cap, blocked.
		ranked := slices.Clone(idx)
		slices.SortFunc(ranked, func(a, b int) int { return insertOrder(rows[a], rows[b]) })
		for n, i := range ranked {
			out[i] = st.Ready+n >= ReadyCap
		}
	}
	return out
}

// groupByKey returns the keys of rows in the order they first appear, and
// the indexes of each key's rows.
func groupByKey(rows []InsertRow) ([]string, map[string][]int) {
	byKey := map[string][]int{}
	var keys []string
	for i, r := range rows {
		if _, ok := byKey[r.Key]; !ok {
			keys = append(keys, r.Key)
		}
		byKey[r.Key] = append(byKey[r.Key], i)
	}
	return keys, byKey
}

func insertOrder(a, b InsertRow) int {
	return cmp.Or(cmp.Compare(a.Priority, b.Priority), a.At.Compare(b.At), cmp.Compare(a.Seq, b.Seq))
}

// InsertBlockedAtGate reports, for each row of rows (due rows of several
// keys, each with Key its first gate key: see store.FirstGate), whether it
// goes in blocked in that gate's line. free returns the gate's free slots
// as the insert read them (the sum of its counters' free slots, its limit
// when it has none yet), and false when it could not read them all (a
// transaction held one): then the rows go in ready. A gate's rows take its
// free slots in promotion order (priority, run_at, input order); the rows
// past them go in blocked. A gate whose line holds waiting rows (lined)
// gives the batch no free slot: its rows go in blocked behind them, as a
// row taking a free slot would pass them (its free slots are then those
// its promoted or inserted ready rows will take, or, while the gate is
// stranded, its next promotion's to give). free is called once per gate,
// lined at most once (not for a gate free could not read).
//
// A row a full gate would block anyway is then written once until its
// turn comes: a freed slot of the gate is handed to it (or promotes it)
// with its other keys, where one inserted ready is first moved by the
// claim that finds the gate full (a second write, and the indexes the
// move enters), then handed a slot. Rows of the gate already ready are not
// counted: the claim that finds the gate full blocks the surplus. So once
// a batch has put a row in the gate's line, the batches after it put
// theirs behind it, where each took the free slots again; batches that
// each fit in the free slots still leave the surplus ready.
func InsertBlockedAtGate(rows []InsertRow, free func(gate string) (int, bool), lined func(gate string) bool) []bool {
	out := make([]bool, len(rows))
	gates, byGate := groupByKey(rows)
	for _, g := range gates {
		n, ok := free(g)
		idx := byGate[g]
		if !ok {
			continue
		}
		if lined(g) {
			n = 0
		}
		if n >= len(idx) {
			continue
		}
		ranked := slices.Clone(idx)
		slices.SortFunc(ranked, func(a, b int) int { return insertOrder(rows[a], rows[b]) })
		for rank, i := range ranked {
			out[i] = rank >= n
		}
	}
	return out
}

// InsertBehindFirst reports, for each row of rows (the due rows of several
// keys that InsertBlockedAtGate blocks, each with Key its first key when
// that is a K = 1 key, "" otherwise, and gates[i] its gate), whether it goes
// in blocked in its first key's line instead of the gate's: when its first
// key comes before the gate in key order, a row of that key that goes in
// ready (ahead, among ahead: the batch's due rows of K = 1 keys that go in
// ready) comes before it in promotion order, and no row waits in the
// gate's line ahead of it (lined says whether the gate had blocked rows;
// the rows are taken in promotion order, each that goes in the gate's line
// lining it). The row of its key, once admitted, holds the key, and a claim
// blocks a row on the first full key in key order; from that key's line,
// the row can be reserved as that row's successor, or handed both slots by
// its outcome, which a gate with rows waiting in its line would not allow
// (the row would pass them).
func InsertBehindFirst(rows []InsertRow, gates []string, ahead []InsertRow, lined func(gate string) bool) []bool {
	out := make([]bool, len(rows))
	first := map[string]InsertRow{} // per key, its first row going in ready
	for _, a := range ahead {
		if f, ok := first[a.Key]; !ok || insertOrder(a, f) < 0 {
			first[a.Key] = a
		}
	}
	order := make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return insertOrder(rows[a], rows[b]) })
	inLine := map[string]bool{}
	for _, i := range order {
		r, g := rows[i], gates[i]
		if _, seen := inLine[g]; !seen {
			inLine[g] = lined(g)
		}
		f, ok := first[r.Key]
		if r.Key != "" && ok && r.Key < g && insertOrder(f, r) < 0 && !inLine[g] {
			out[i] = true
			continue
		}
		inLine[g] = true
	}
	return out
}
