package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestInsertCopyMatchesStatement inserts the same mixed batch (queues,
// priorities, keys with earlier rows, explicit run_at in the past and the
// future, delays, parents) into two stores with the same clock, one through
// the single statement and one through COPY, and requires identical rows:
// status, run_at, round, timestamps, keys, and insertion order.
func TestInsertCopyMatchesStatement(t *testing.T) {
	now := time.Date(2031, 3, 4, 5, 6, 7, 891_234_567, time.UTC)
	clock := func(o *postgres.Options) { o.Clock = func() time.Time { return now } }
	stmt, cp := newEnv(t, clock), newEnv(t, clock)
	postgres.SetCopyInsertMin(stmt.s, math.MaxInt)
	postgres.SetCopyInsertMin(cp.s, 0)
	for _, e := range []*env{stmt, cp} {
		// A gate of 2 for the api keys of the rows of several keys: past
		// its free slots they go in blocked in its line (blockAtGates).
		_, err := e.s.SyncLimits(e.ctx, []gate.Limit{{Name: "api", Limit: 2}})
		require.NoError(t, err)
	}

	mk := func(n int, seed string) []store.NewInstance {
		ins := make([]store.NewInstance, n)
		parent := uuid.NewString()
		for i := range ins {
			in := store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Version: 1 + i%2,
				Queue: []string{"q", "r", ""}[i%3], Priority: i % 2, Step: "s",
				State: json.RawMessage(fmt.Sprintf(`{"i":%d,"s":%q}`, i, seed))}
			switch i % 7 {
			case 1:
				in.Key = fmt.Sprintf("acct:%d", i%5)
			case 2: // several keys, one of them spelled with what array literals escape
				in.Key = fmt.Sprintf("acct:%d", i%5)
				in.Also = []store.KeyRef{{Key: fmt.Sprintf("api:%d", i%3), Intent: gate.GateIntent}}
				if i%14 == 2 {
					in.Also = append(in.Also, store.KeyRef{Key: `zone:"a,{b}\\c" d`, Intent: gate.IdentityIntent})
				}
				if i%14 == 9 { // an account of its own: no row of it ahead
					in.Key = fmt.Sprintf("acct:u%d:%s", i, seed)
				}
			case 3:
				in.Key = fmt.Sprintf("acct:%d", i%5)
				in.RunAt = now.Add(-time.Duration(i) * time.Millisecond)
			case 4:
				in.Delay = time.Duration(i) * time.Second
			case 5:
				in.RunAt = now.Add(time.Hour + time.Duration(i)*time.Nanosecond)
			case 6:
				in.Delay = -time.Duration(i) * time.Microsecond
				in.Key = "acct:x"
			}
			if i%11 == 0 {
				in.ParentID = parent
			}
			ins[i] = in
		}
		return ins
	}
	first, second := mk(300, "a"), mk(700, "b")
	for _, e := range []*env{stmt, cp} {
		// The first batch always through the statement: earlier rows of
		// the keys, so that rounds start past 0.
		postgres.SetCopyInsertMin(e.s, math.MaxInt)
		_, err := e.s.Insert(e.ctx, first)
		require.NoError(t, err)
	}
	postgres.SetCopyInsertMin(cp.s, 0)
	rs, err := stmt.s.Insert(stmt.ctx, second)
	require.NoError(t, err)
	rc, err := cp.s.Insert(cp.ctx, second)
	require.NoError(t, err)
	require.Equal(t, rs, rc)

	dump := func(e *env) []string {
		rows, err := e.pool.Query(e.ctx, `SELECT id, workflow, version, queue, priority, status, step, state::text,
			coalesce(key, '-'), key_intent, run_at, coalesce(round, -1), coalesce(parent_id::text, '-'), join_gen,
			created_at, updated_at, unique_key IS NULL, unique_statuses IS NULL,
			coalesce(extra_keys::text, '-'), coalesce(extra_intents::text, '-')
			FROM instances ORDER BY seq`)
		require.NoError(t, err)
		var out []string
		for rows.Next() {
			vals, err := rows.Values()
			require.NoError(t, err)
			out = append(out, fmt.Sprint(vals...))
		}
		require.NoError(t, rows.Err())
		return out
	}
	a, b := dump(stmt), dump(cp)
	require.Len(t, a, 1000)
	require.Equal(t, a, b)
	for _, e := range []*env{stmt, cp} { // the other keys read back as given
		in, err := e.s.Get(e.ctx, second[2].ID)
		require.NoError(t, err)
		require.Len(t, second[2].Also, 2)
		require.Equal(t, second[2].Also, in.Also)
	}
	require.Positive(t, cp.scalar(`SELECT count(*) FROM instances WHERE status = 'blocked' AND key IS NOT NULL AND round > 0`))
	// Past admission.ReadyCap ready rows, a key's rows went in blocked.
	require.Positive(t, cp.scalar(`SELECT count(*) FROM instances i WHERE status = 'ready' AND key IS NOT NULL`))
	require.EqualValues(t, admission.ReadyCap, cp.scalar(`SELECT max(n) FROM (SELECT count(*) AS n FROM instances
		WHERE status = 'ready' AND key IS NOT NULL GROUP BY key) k`))
	require.Positive(t, cp.scalar(`SELECT count(*) FROM instances WHERE status = 'scheduled'`))
	// Past the api gate's free slots, rows of several keys went in blocked:
	// in its line, or in their account's behind a row of it going in ready.
	require.Positive(t, cp.scalar(`SELECT count(*) FROM instances WHERE status = 'blocked' AND key LIKE 'api:%' AND extra_keys IS NOT NULL`))
	require.Positive(t, cp.scalar(`SELECT count(*) FROM instances WHERE status = 'blocked' AND key LIKE 'acct:%' AND extra_keys IS NOT NULL`))
}

// TestInsertCopyAllOrNothing: a COPY batch with one row the database
// refuses (its state, its workflow name, or an id already in the batch)
// inserts nothing and notifies nobody; a row the store refuses fails the
// batch before anything is sent.
func TestInsertCopyAllOrNothing(t *testing.T) {
	e := newEnv(t)
	postgres.SetCopyInsertMin(e.s, 0)
	conn, err := pgx.Connect(e.ctx, e.pool.Config().ConnConfig.ConnString())
	require.NoError(t, err)
	defer conn.Close(e.ctx)
	_, err = conn.Exec(e.ctx, "LISTEN "+pgx.Identifier{postgres.Channel(e.schema)}.Sanitize())
	require.NoError(t, err)

	batch := func(bad func(in *store.NewInstance)) []store.NewInstance {
		ins := make([]store.NewInstance, 2000)
		for i := range ins {
			ins[i] = newInstance("")
		}
		bad(&ins[1234])
		return ins
	}
	for _, tc := range []struct {
		name string
		bad  func(in *store.NewInstance)
		want error
	}{
		// Valid JSON that jsonb refuses.
		{"state", func(in *store.NewInstance) { in.State = json.RawMessage(`{"a":"\u0000"}`) }, store.ErrInvalid},
		// A NUL byte is not text in PostgreSQL.
		{"workflow", func(in *store.NewInstance) { in.Workflow = "w\x00f" }, store.ErrInvalid},
		{"normalize", func(in *store.NewInstance) { in.ID = "not-a-uuid" }, store.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.s.Insert(e.ctx, batch(tc.bad))
			require.ErrorIs(t, err, tc.want)
			require.Zero(t, e.scalar(`SELECT count(*) FROM instances`))
		})
	}
	t.Run("duplicate id", func(t *testing.T) {
		ins := batch(func(*store.NewInstance) {})
		ins[1999].ID = ins[3].ID
		_, err := e.s.Insert(e.ctx, ins)
		require.ErrorIs(t, err, store.ErrDuplicate)
		require.Zero(t, e.scalar(`SELECT count(*) FROM instances`))
	})
	t.Run("in the caller's transaction", func(t *testing.T) {
		tx, err := e.pool.Begin(e.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(e.ctx) }()
		_, err = e.s.InsertTx(e.ctx, tx, batch(func(in *store.NewInstance) { in.State = json.RawMessage(`"\u0000"`) }))
		require.ErrorIs(t, err, store.ErrInvalid)
		require.NoError(t, tx.Rollback(e.ctx))
		require.Zero(t, e.scalar(`SELECT count(*) FROM instances`))
	})
	ctx, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	require.Error(t, err, "no notification expected, got %v", n)

	// And a good batch does notify.
	_, err = e.s.Insert(e.ctx, batch(func(*store.NewInstance) {}))
	require.NoError(t, err)
	ctx2, cancel2 := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel2()
	n, err = conn.WaitForNotification(ctx2)
	require.NoError(t, err)
	require.Equal(t, "q", n.Payload)
}

// TestInsertBeyondParameterLimit inserts 70,000 rows in one call, more
// than the 65,535 parameters a statement can carry were each value one,
// through COPY and through the statement.
func TestInsertBeyondParameterLimit(t *testing.T) {
	for _, path := range []string{"copy", "stmt"} {
		t.Run(path, func(t *testing.T) {
			e := newEnv(t)
			if path == "stmt" {
				postgres.SetCopyInsertMin(e.s, math.MaxInt)
			}
			const n = 70_000
			ins := make([]store.NewInstance, n)
			for i := range ins {
				key := ""
				if i%10 == 0 {
					key = fmt.Sprintf("acct:%d", i%100)
				}
				ins[i] = newInstance(key)
			}
			res, err := e.s.Insert(e.ctx, ins)
			require.NoError(t, err)
			require.Len(t, res, n)
			for i, r := range res {
				if r.ID != ins[i].ID || r.Duplicate {
					t.Fatalf("result %d: %+v", i, r)
				}
			}
			// Each of the 10 keys has its first admission.ReadyCap rows
			// ready and the rest blocked behind them.
			blocked := n/10 - 10*admission.ReadyCap
			require.EqualValues(t, n-blocked, e.scalar(`SELECT count(*) FROM instances WHERE status = 'ready'`))
			require.EqualValues(t, blocked, e.scalar(`SELECT count(*) FROM instances WHERE status = 'blocked'`))
			// The 700 rows of each key take the open round (-1 on an empty
			// queue), then a turn round each: 0, 2, ..., 1,396.
			require.EqualValues(t, -1, e.scalar(`SELECT min(round) FROM instances WHERE key = 'acct:10'`))
			require.EqualValues(t, 2*698, e.scalar(`SELECT max(round) FROM instances WHERE key = 'acct:10'`))
			require.EqualValues(t, 700, e.scalar(`SELECT count(DISTINCT round) FROM instances WHERE key = 'acct:10'`))
		})
	}
}
