package postgres

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
)

// copyInsertMin is the smallest batch (rows) that Insert and InsertTx write
// with COPY rather than with sqlInsert. Below it the COPY path's extra round
// trips (its transaction, the round query, the copy) eat what it saves per
// row: around a hundred rows neither path is reliably ahead, at 500 COPY
// is.
const copyInsertMin = 500

// copyer is the part of a transaction that the COPY path needs.
type copyer interface {
	querier
	Conn() *pgx.Conn
}

// sqlCopyInstances is the COPY of copyInsert: the instances columns it
// writes, copyFields of them, in the order copyRows.encode writes them; the
// others take their defaults (unique_key and unique_statuses stay NULL:
// batches with unique keys take the sqlInsert path).
const (
	sqlCopyInstances = `COPY {schema}.instances (id, workflow, version, queue, priority, status, step, state,
    key, key_intent, run_at, round, parent_id, join_gen, created_at, updated_at, extra_keys, extra_intents)
    FROM STDIN WITH (FORMAT binary)`
	copyFields = 18
)

// roundGroup is one (queue, priority, key) of a batch, with what decides
// whether any of its rows is due: the earliest explicit run_at and the
// shortest delay of its rows without one.
type roundGroup struct {
	queue    string
	priority int32
	key      string
	runAt    *time.Time
	delayUS  *int64
}

type roundGroupKey struct {
	queue    string
	priority int32
	key      string
}

// copyInsert inserts rows (none with a unique key) with COPY inside tx, with
// the outcome of sqlInsert: the same statuses, run_at, rounds, timestamps
// and notifications. One statement (sqlInsertRounds) reads the clock and
// the fresh round of every (queue, priority, key) with a due row, and
// notifies the queues that receive due rows (delivered at commit); the rows
// are then computed here and copied straight into instances. With p.block,
// due rows of K = 1 keys go in blocked as admission.InsertBlocked decides,
// and their keys are appended to p.blocked or p.behind (see insertPlan).
// Any error leaves tx to be rolled back: nothing of the batch is kept.
func (s *Store) copyInsert(ctx context.Context, tx copyer, p *insertPlan) error {
	rows := p.rows
	groupOf := make([]int, len(rows))
	index := map[roundGroupKey]int{}
	var groups []roundGroup
	for i, r := range rows {
		in := r.in
		k := roundGroupKey{in.Queue, int32(in.Priority), in.Key}
		g, ok := index[k]
		if !ok {
			g = len(groups)
			index[k] = g
			groups = append(groups, roundGroup{queue: k.queue, priority: k.priority, key: k.key})
		}
		groupOf[i] = g
		gr := &groups[g]
		if in.RunAt.IsZero() {
			d := micros(in.Delay)
			if gr.delayUS == nil || d < *gr.delayUS {
				gr.delayUS = &d
			}
		} else if at := in.RunAt; gr.runAt == nil || at.Before(*gr.runAt) {
			gr.runAt = &at
		}
	}
	var (
		queues = make([]string, len(groups))
		prios  = make([]int32, len(groups))
		keys   = make([]string, len(groups))
		runAts = make([]*time.Time, len(groups))
		delays = make([]*int64, len(groups))
		base   = make([]*admission.Fresh, len(groups))
		one    = make([]bool, len(groups)) // a K = 1 key
		state  = make([]admission.KeyState, len(groups))
		now    time.Time
	)
	for i, g := range groups {
		queues[i], prios[i], keys[i], runAts[i], delays[i] = g.queue, g.priority, g.key, g.runAt, g.delayUS
	}
	res, err := tx.Query(ctx, s.q(sqlInsertRounds), s.clockNow(), queues, prios, keys, runAts, delays, s.channel, p.block,
		admission.ReadyCap)
	if err != nil {
		return insertError(err)
	}
	var gi *int32
	var head, last, taken, turns *int64
	var isOne, isBusy *bool
	var ready *int64
	_, err = pgx.ForEachRow(res, []any{&now, &gi, &head, &last, &taken, &turns, &isOne, &isBusy, &ready}, func() error {
		if gi != nil {
			if head != nil && taken != nil && turns != nil {
				var l int64
				if last != nil {
					l = *last
				}
				f := admission.KeyFresh(*head, l, last != nil, int(*taken), int(*turns))
				base[*gi] = &f
			}
			one[*gi] = isOne != nil && *isOne
			state[*gi] = admission.KeyState{Busy: isBusy != nil && *isBusy}
			if ready != nil {
				state[*gi].Ready = int(*ready)
			}
		}
		return nil
	})
	if err != nil {
		return insertError(err)
	}

	// Each row's run_at and whether it is due, as sqlInsert computes them
	// (timestamps are microseconds in the database).
	at := make([]time.Time, len(rows))
	due := make([]bool, len(rows))
	for i, r := range rows {
		if r.in.RunAt.IsZero() {
			at[i] = now.Add(time.Duration(micros(r.in.Delay)) * time.Microsecond)
		} else {
			at[i] = r.in.RunAt.Truncate(time.Microsecond)
		}
		due[i] = !at[i].After(now)
	}
	// Rounds, as admission.Rounds decides (sqlInsert is its SQL form): a
	// due keyless row takes its group's fresh round; the due rows of one
	// key take their turns from it, in run_at then input order.
	round := make([]*int64, len(rows))
	var fresh []admission.RoundRow
	var freshOf []int
	for i, r := range rows {
		if !due[i] {
			continue
		}
		if base[groupOf[i]] == nil {
			return fmt.Errorf("insert: no round for queue %q priority %d key %q", r.in.Queue, r.in.Priority, r.in.Key)
		}
		fresh = append(fresh, admission.RoundRow{
			RoundGroup: admission.RoundGroup{Queue: r.in.Queue, Priority: r.in.Priority, Key: r.in.Key},
			At:         at[i], Seq: int64(i)})
		freshOf = append(freshOf, i)
	}
	rounds := admission.Rounds(fresh, func(g admission.RoundGroup) admission.Fresh {
		return *base[index[roundGroupKey{g.Queue, int32(g.Priority), g.Key}]]
	})
	for j, i := range freshOf {
		round[i] = &rounds[j]
	}
	// Which due rows of K = 1 keys go in blocked (sqlInsert decides the same in SQL).
	var waiting []admission.InsertRow
	var waitingOf []int
	for i, r := range rows {
		if due[i] && one[groupOf[i]] && r.blockedIn == "" {
			waiting = append(waiting, admission.InsertRow{Key: r.in.Key, Priority: r.in.Priority, At: at[i], Seq: int64(i)})
			waitingOf = append(waitingOf, i)
		}
	}
	keyState := map[string]admission.KeyState{} // the same in every group of the key
	for g, gr := range groups {
		if one[g] {
			keyState[gr.key] = state[g]
		}
	}
	blocked := make([]bool, len(rows))
	for j, b := range admission.InsertBlocked(waiting, func(k string) admission.KeyState { return keyState[k] }) {
		i := waitingOf[j]
		blocked[i] = b
		switch k := rows[i].in.Key; {
		case !b:
		case keyState[k].Busy || keyState[k].Ready > 0:
			p.blocked = append(p.blocked, k) // repeated per row: healInserted compacts
		default:
			p.behind = append(p.behind, k) // repeated too: afterInsert compacts
		}
	}
	for i := range rows {
		if r := &rows[i]; due[i] && r.blockedIn != "" {
			// In the gate's line, with the round it has as a row of its
			// first key (see blockAtGates).
			blocked[i] = true
			waitIn(&r.in, r.blockedIn)
		}
	}
	src := &copyRows{rows: rows, at: at, due: due, blocked: blocked, round: round, now: now}
	data, err := src.encode()
	if err != nil {
		return err
	}
	if _, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(data), s.q(sqlCopyInstances)); err != nil {
		return insertError(err)
	}
	return nil
}

// copyRows are the rows of copyInsert, computed.
type copyRows struct {
	rows    []insertRow
	at      []time.Time
	due     []bool
	blocked []bool // per row: goes in blocked
	round   []*int64
	now     time.Time
}

// encode writes the rows in PostgreSQL's binary COPY format, in the order
// of sqlCopyInstances' columns. pgx's CopyFrom planned the encoding of every value of
// every row through its type map (a map lookup per value, an interface per
// value): about two fifths of the Go side of a batch insert. The values
// are those sqlInsert would store: text as is, jsonb as version 1 and its
// text, timestamps in microseconds (truncated, as pgx does).
func (c *copyRows) encode() ([]byte, error) {
	b := make([]byte, 0, 19+len(c.rows)*320)
	b = append(b, "PGCOPY\n\xff\r\n\x00"...)
	b = binary.BigEndian.AppendUint32(b, 0) // flags
	b = binary.BigEndian.AppendUint32(b, 0) // header extension
	for i, r := range c.rows {
		in := r.in
		id, err := uuid.Parse(in.ID)
		if err != nil {
			return nil, err
		}
		status := statusScheduled
		switch {
		case c.due[i] && c.blocked[i]:
			status = "blocked"
		case c.due[i]:
			status = "ready"
		}
		b = binary.BigEndian.AppendUint16(b, copyFields)
		b = copyBytes(b, id[:])
		b = copyText(b, in.Workflow)
		b = copyInt32(b, int32(in.Version))
		b = copyText(b, in.Queue)
		b = copyInt32(b, int32(in.Priority))
		b = copyText(b, status)
		b = copyText(b, in.Step)
		if len(in.State) == 0 {
			b = copyNull(b)
		} else {
			b = binary.BigEndian.AppendUint32(b, uint32(1+len(in.State)))
			b = append(b, 1) // jsonb version
			b = append(b, in.State...)
		}
		if in.Key == "" {
			b = copyNull(b)
		} else {
			b = copyText(b, in.Key)
		}
		b = copyText(b, string(in.KeyIntent))
		b = copyTime(b, c.at[i])
		if c.round[i] == nil {
			b = copyNull(b)
		} else {
			b = binary.BigEndian.AppendUint32(b, 8)
			b = binary.BigEndian.AppendUint64(b, uint64(*c.round[i]))
		}
		if in.ParentID == "" {
			b = copyNull(b)
		} else {
			p, err := uuid.Parse(in.ParentID)
			if err != nil {
				return nil, err
			}
			b = copyBytes(b, p[:])
		}
		b = copyInt32(b, int32(r.joinGen))
		b = copyTime(b, c.now)
		b = copyTime(b, c.now)
		if len(in.Also) == 0 {
			b = copyNull(copyNull(b))
		} else {
			b = copyTextArray(b, in.Also, func(k store.KeyRef) string { return k.Key })
			b = copyTextArray(b, in.Also, func(k store.KeyRef) string { return string(k.Intent) })
		}
	}
	return binary.BigEndian.AppendUint16(b, 0xffff), nil // trailer: -1
}

// pgEpochMicros is 2000-01-01 UTC, the zero of PostgreSQL's binary
// timestamps, in Unix microseconds.
const pgEpochMicros = 946_684_800_000_000

func copyNull(b []byte) []byte { return binary.BigEndian.AppendUint32(b, 0xffffffff) }

func copyBytes(b, v []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

func copyText(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// textOID is the type of the elements of copyTextArray's arrays.
const textOID = 25

// copyTextArray writes a one-dimensional text[] of text(x) for each x of
// xs (not empty) in the binary format: the dimensions, the element type,
// then each element as copyText writes it.
func copyTextArray[T any](b []byte, xs []T, text func(T) string) []byte {
	at := len(b)
	b = binary.BigEndian.AppendUint32(b, 0) // the length, set below
	b = binary.BigEndian.AppendUint32(b, 1) // dimensions
	b = binary.BigEndian.AppendUint32(b, 0) // no NULL element
	b = binary.BigEndian.AppendUint32(b, textOID)
	b = binary.BigEndian.AppendUint32(b, uint32(len(xs)))
	b = binary.BigEndian.AppendUint32(b, 1) // lower bound
	for _, x := range xs {
		b = copyText(b, text(x))
	}
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	return b
}

func copyInt32(b []byte, v int32) []byte {
	b = binary.BigEndian.AppendUint32(b, 4)
	return binary.BigEndian.AppendUint32(b, uint32(v))
}

func copyTime(b []byte, t time.Time) []byte {
	b = binary.BigEndian.AppendUint32(b, 8)
	return binary.BigEndian.AppendUint64(b, uint64(t.UnixMicro()-pgEpochMicros))
}
