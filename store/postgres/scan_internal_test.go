package postgres

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
)

// instanceColumns is the column list scanInstance scans (the instance
// columns of sql.go), as every statement that reads instances writes it
// (TestRulesAreWrittenAlike), for the scan tests' own queries.
const instanceColumns = `id::text, workflow, version, queue, priority, status, step, state, attempt,
	coalesce(key, ''), key_intent, coalesce(key_shard, -1), run_at,
	CASE WHEN status = 'awaiting' THEN await_signal ELSE '' END,
	timeout_at, timed_out, coalesce(worker, ''), fence, lease_expires_at, result,
	coalesce(last_error, ''), coalesce(parent_id::text, ''), pending_children,
	coalesce(unique_key, ''), created_at, updated_at, started_at, cancel_requested, ready_since, extra_keys, extra_intents`

// oldScanInstanceRow is scanInstanceRow as it was before rowScan: every
// destination on its own, nullable times through *time.Time, JSON copied
// after the scan. The new scan must give the same values.
func oldScanInstanceRow(row pgx.Row, extra ...any) (instanceRow, error) {
	var (
		r                             instanceRow
		status, intent                string
		state, result                 []byte
		timeoutAt, leaseAt, startedAt *time.Time
		readySince                    *time.Time
		extraKeys, extraIntents       []string
	)
	in := &r.Instance
	dest := []any{&in.ID, &in.Workflow, &in.Version, &in.Queue, &in.Priority, &status, &in.Step, &state,
		&in.Attempt, &in.Key, &intent, &in.KeyShard, &in.RunAt, &in.AwaitSignal, &timeoutAt, &r.timedOut,
		&in.Worker, &in.Fence, &leaseAt, &result, &in.LastError, &in.ParentID, &in.PendingChildren,
		&in.UniqueKey, &in.CreatedAt, &in.UpdatedAt, &startedAt, &in.CancelRequested, &readySince,
		&extraKeys, &extraIntents}
	if err := row.Scan(append(dest, extra...)...); err != nil {
		return instanceRow{}, err
	}
	if in.Status == store.StatusBlocked {
		in.BlockedOn = in.Key
	}
	if len(extraKeys) > 0 {
		if err := severalKeys(in, extraKeys, extraIntents); err != nil {
			return instanceRow{}, err
		}
	}
	clone := func(b []byte) json.RawMessage {
		if b == nil {
			return nil
		}
		return slices.Clone(b)
	}
	in.Status, in.KeyIntent = publicStatus(status), gateIntent(intent)
	in.State, in.Result = clone(state), clone(result)
	in.TimeoutAt, in.LeaseExpiresAt, in.StartedAt, in.ReadySince = fromPtr(timeoutAt), fromPtr(leaseAt), fromPtr(startedAt), fromPtr(readySince)
	return r, nil
}

func TestScanInstanceRowUnchanged(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	var ins []store.NewInstance
	for i, key := range []string{"", "", "", "acct:1", "acct:1", "api:x", "acct:2"} {
		in := store.NewInstance{ID: uuid.NewString(), Workflow: "wf", Queue: "q", Step: "s", Key: key, State: json.RawMessage(`{"n":1}`)}
		if i == 2 {
			in.State = nil
		}
		if key == "acct:2" {
			in.Also = []store.KeyRef{{Key: "api:z", Intent: gate.GateIntent}}
		}
		ins = append(ins, in)
	}
	_, err := s.Insert(ctx, ins)
	require.NoError(t, err)
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 3, Lease: time.Minute})
	require.NoError(t, err)
	require.NotEmpty(t, res.Claimed)
	outs := []store.Outcome{{ID: res.Claimed[0].ID, Fence: res.Claimed[0].Fence, Kind: store.OutcomeDone, Step: "s", Result: json.RawMessage(`{"r":[1,2]}`)}}
	if len(res.Claimed) > 1 {
		outs = append(outs, store.Outcome{ID: res.Claimed[1].ID, Fence: res.Claimed[1].Fence, Kind: store.OutcomeAwait, Step: "s",
			AwaitSignal: "go", Timeout: time.Hour, State: json.RawMessage(`{}`)})
	}
	_, err = s.Complete(ctx, "w", outs, time.Time{})
	require.NoError(t, err)

	for _, q := range []string{`SELECT ` + instanceColumns + ` FROM {schema}.instances ORDER BY id`,
		`SELECT ` + instanceColumns + `, 42::bigint, 'sig'::text, '{"a":1}'::jsonb, 'dk'::text, '2026-01-02 03:04:05.123456+00'::timestamptz FROM {schema}.instances ORDER BY id`,
		`SELECT ` + instanceColumns + `, NULL::bigint, NULL::text, NULL::jsonb, NULL::text, NULL::timestamptz FROM {schema}.instances ORDER BY id`,
	} {
		withSignal := q != `SELECT `+instanceColumns+` FROM {schema}.instances ORDER BY id`
		read := func(scan func(pgx.Rows) (store.Claimed, error)) []store.Claimed {
			rows, err := s.pool.Query(ctx, s.q(q))
			require.NoError(t, err)
			var out []store.Claimed
			for rows.Next() {
				c, err := scan(rows)
				require.NoError(t, err)
				out = append(out, c)
			}
			require.NoError(t, rows.Err())
			return out
		}
		var cs claimScan // shared by the rows, as the store's queries share one
		got := read(func(rows pgx.Rows) (store.Claimed, error) {
			if withSignal {
				return scanClaimed(rows, &cs)
			}
			r, err := scanInstanceRow(rows)
			return store.Claimed{Instance: r.Instance, TimedOut: r.timedOut}, err
		})
		want := read(func(rows pgx.Rows) (store.Claimed, error) {
			if !withSignal {
				r, err := oldScanInstanceRow(rows)
				return store.Claimed{Instance: r.Instance, TimedOut: r.timedOut}, err
			}
			var (
				sigID      *int64
				sigName    *string
				sigPayload []byte
				sigDedup   *string
				sigCreated *time.Time
			)
			r, err := oldScanInstanceRow(rows, &sigID, &sigName, &sigPayload, &sigDedup, &sigCreated)
			c := store.Claimed{Instance: r.Instance, TimedOut: r.timedOut}
			if sigID != nil {
				c.Signal = &store.Signal{ID: *sigID, InstanceID: r.ID, Name: *sigName,
					Payload: json.RawMessage(slices.Clone(sigPayload)), DedupKey: *sigDedup, CreatedAt: *sigCreated}
			}
			return c, err
		})
		require.Len(t, got, len(ins))
		require.Equal(t, want, got, q)
		var sawLease, sawTimeout, sawResult, sawNilState bool
		for _, c := range got {
			sawLease = sawLease || !c.LeaseExpiresAt.IsZero()
			sawTimeout = sawTimeout || !c.TimeoutAt.IsZero()
			sawResult = sawResult || c.Result != nil
			sawNilState = sawNilState || c.State == nil
		}
		require.True(t, sawLease && sawTimeout && sawResult && sawNilState, "the rows cover NULL and non-NULL columns")
	}
}

func TestInternIsBounded(t *testing.T) {
	long := string(make([]byte, maxInternedLen+1))
	require.Equal(t, "", intern([]byte{}))
	require.Equal(t, "wf", intern([]byte("wf")))
	require.Equal(t, long, intern([]byte(long)))
	for i := range maxInterned + 10 {
		b := []byte(uuid.NewString())
		require.Equal(t, string(b), intern(b), i)
	}
	require.LessOrEqual(t, len(*interned.Load()), maxInterned)
	_, ok := (*interned.Load())[long]
	require.False(t, ok, "a long value is not interned")
	b := []byte("wf")
	s := intern(b)
	b[0] = 'x'
	require.Equal(t, "wf", s, "an interned string does not share the scanned bytes")
}

// uuidArg sends canonical ids in binary and leaves any other spelling to
// PostgreSQL, as text; both read back as the same ids.
func TestUUIDArg(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	id := uuid.NewString()
	upper := strings.ToUpper(id)
	_, ok := uuidArg([]string{id, upper}).(ptrArray[pgtype.UUID])
	require.True(t, ok, "canonical ids go in binary")
	braces := "{" + id + "}"
	require.Equal(t, []string{id, braces}, uuidArg([]string{id, braces}))
	require.Equal(t, []string{"nope"}, uuidArg([]string{"nope"}))
	for _, ids := range [][]string{{id, upper}, {id, braces}, {}} {
		var got []string
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT coalesce(array_agg(x::text), '{}') FROM unnest($1::uuid[]) x`, uuidArg(ids)).Scan(&got))
		want := make([]string, len(ids))
		for i := range want {
			want[i] = id
		}
		require.Equal(t, want, got)
	}
	for _, ids := range [][]string{nil, {}} {
		var isNull, wasNull bool
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT $1::uuid[] IS NULL, $2::uuid[] IS NULL`, uuidArg(ids), ids).Scan(&isNull, &wasNull))
		require.Equal(t, wasNull, isNull, "nil is NULL, empty is empty, as with a []string")
	}
	_, err := s.pool.Exec(ctx, `SELECT $1::uuid[]`, uuidArg([]string{"nope"}))
	require.Error(t, err, "an invalid id is still refused by PostgreSQL")
}
