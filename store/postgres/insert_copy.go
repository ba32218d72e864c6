package postgres

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// copyInsertMin is the smallest batch (rows) that Insert and InsertTx write
// with COPY rather than with sqlInsert. Below it the COPY path's extra round
// trips (its transaction, the round query, the copy) eat what it saves per
// row: at 100 rows neither path was reliably ahead, at 500 COPY was (see
// "Batch insert with COPY" in BENCHMARKS.md).
const copyInsertMin = 500

// copyer is the part of a transaction that the COPY path needs.
type copyer interface {
	querier
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
}

// copyColumns are the instances columns the COPY path writes; the others
// take their defaults (unique_key and unique_statuses stay NULL: batches
// with unique keys take the sqlInsert path).
var copyColumns = []string{"id", "workflow", "version", "queue", "priority", "status", "step", "state",
	"key", "key_intent", "run_at", "round", "parent_id", "join_gen", "created_at", "updated_at"}

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
// the due rows of busy K = 1 keys go in blocked, and their keys are
// appended to p.blocked (see insertPlan). Any error leaves tx to be rolled
// back: nothing of the batch is kept.
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
		base   = make([]*int64, len(groups))
		busy   = make([]bool, len(groups))
		now    time.Time
	)
	for i, g := range groups {
		queues[i], prios[i], keys[i], runAts[i], delays[i] = g.queue, g.priority, g.key, g.runAt, g.delayUS
	}
	res, err := tx.Query(ctx, s.q(sqlInsertRounds), s.clockNow(), queues, prios, keys, runAts, delays, s.channel, p.block)
	if err != nil {
		return insertError(err)
	}
	var gi *int32
	var b *int64
	var blocked *bool
	_, err = pgx.ForEachRow(res, []any{&now, &gi, &b, &blocked}, func() error {
		if gi != nil {
			base[*gi] = b
			busy[*gi] = blocked != nil && *blocked
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
	// Rounds: a due keyless row takes its group's fresh round; the due rows
	// of one key take consecutive rounds from it, in run_at then input order.
	round := make([]*int64, len(rows))
	var keyed []int
	for i, r := range rows {
		if !due[i] {
			continue
		}
		g := base[groupOf[i]]
		if g == nil {
			return fmt.Errorf("insert: no round for queue %q priority %d key %q", r.in.Queue, r.in.Priority, r.in.Key)
		}
		if r.in.Key == "" {
			round[i] = g
		} else {
			keyed = append(keyed, i)
		}
	}
	slices.SortStableFunc(keyed, func(a, b int) int {
		if c := cmp.Compare(groupOf[a], groupOf[b]); c != 0 {
			return c
		}
		return at[a].Compare(at[b])
	})
	for j, i := range keyed {
		n := *base[groupOf[i]]
		if j > 0 && groupOf[keyed[j-1]] == groupOf[i] {
			n = *round[keyed[j-1]] + 1
		}
		round[i] = &n
	}
	for g, gr := range groups {
		if busy[g] {
			p.blocked = append(p.blocked, gr.key) // repeated per queue and priority: healInserted compacts
		}
	}
	src := &copyRows{rows: rows, at: at, due: due, blocked: busy, groupOf: groupOf, round: round, now: now}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{s.schema, "instances"}, copyColumns, src); err != nil {
		return insertError(err)
	}
	return nil
}

// copyRows is the pgx.CopyFromSource of copyInsert.
type copyRows struct {
	rows    []insertRow
	at      []time.Time
	due     []bool
	blocked []bool // per group: a busy K = 1 key
	groupOf []int
	round   []*int64
	now     time.Time
	i       int
	vals    []any
}

func (c *copyRows) Next() bool {
	if c.i >= len(c.rows) {
		return false
	}
	c.i++
	return true
}

func (c *copyRows) Values() ([]any, error) {
	i := c.i - 1
	in := c.rows[i].in
	id, err := uuid.Parse(in.ID)
	if err != nil {
		return nil, err
	}
	var parent any
	if in.ParentID != "" {
		p, err := uuid.Parse(in.ParentID)
		if err != nil {
			return nil, err
		}
		parent = [16]byte(p)
	}
	var key *string
	if in.Key != "" {
		key = &in.Key
	}
	status := statusScheduled
	switch {
	case c.due[i] && c.blocked[c.groupOf[i]]:
		status = "blocked"
	case c.due[i]:
		status = "ready"
	}
	if c.vals == nil {
		c.vals = make([]any, len(copyColumns))
	}
	v := c.vals
	v[0], v[1], v[2], v[3], v[4], v[5] = [16]byte(id), in.Workflow, int32(in.Version), in.Queue, int32(in.Priority), status
	v[6], v[7], v[8], v[9], v[10], v[11] = in.Step, jsonArg(in.State), key, string(in.KeyIntent), c.at[i], c.round[i]
	v[12], v[13], v[14], v[15] = parent, int32(c.rows[i].joinGen), c.now, c.now
	return v, nil
}

func (c *copyRows) Err() error { return nil }
