package postgres

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/godurable/godurable/store"
)

// instanceColumnCount is the number of the instance columns (see sql.go).
const instanceColumnCount = 31

// rowScan is what scanInstanceRow scans one row into. Every destination
// handed to Scan escapes to the heap; kept together, they cost one
// allocation per row instead of one each (and the []any of the call).
type rowScan struct {
	r                                         instanceRow
	workflow, queue, status, step             internedText
	intent, worker                            internedText
	state, result                             jsonText
	timeoutAt, leaseAt, startedAt, readySince pgtype.Timestamptz
	extraKeys, extraIntents                   []string
	dest                                      [instanceColumnCount + 8]any
}

// scan scans the instance columns (see sql.go), then extra.
func (rs *rowScan) scan(row pgx.Row, extra ...any) (instanceRow, error) {
	in := &rs.r.Instance
	rs.dest = [len(rs.dest)]any{&in.ID, &rs.workflow, &in.Version, &rs.queue, &in.Priority, &rs.status, &rs.step, &rs.state,
		&in.Attempt, &in.Key, &rs.intent, &in.KeyShard, &in.RunAt, &in.AwaitSignal, &rs.timeoutAt, &rs.r.timedOut,
		&rs.worker, &in.Fence, &rs.leaseAt, &rs.result, &in.LastError, &in.ParentID, &in.PendingChildren,
		&in.UniqueKey, &in.CreatedAt, &in.UpdatedAt, &rs.startedAt, &in.CancelRequested, &rs.readySince,
		&rs.extraKeys, &rs.extraIntents}
	if err := row.Scan(append(rs.dest[:instanceColumnCount], extra...)...); err != nil {
		return instanceRow{}, err
	}
	in.Workflow, in.Queue, in.Step, in.Worker = string(rs.workflow), string(rs.queue), string(rs.step), string(rs.worker)
	in.Status = publicStatus(string(rs.status))
	in.KeyIntent = gateIntent(string(rs.intent))
	if in.Status == store.StatusBlocked {
		in.BlockedOn = in.Key
	}
	in.Also, in.AlsoShards = nil, nil
	if len(rs.extraKeys) > 0 {
		if err := severalKeys(in, rs.extraKeys, rs.extraIntents); err != nil {
			return instanceRow{}, err
		}
	}
	in.State, in.Result = []byte(rs.state), []byte(rs.result)
	var err error
	for _, t := range []struct {
		dst  *time.Time
		src  pgtype.Timestamptz
		name string
	}{{&in.TimeoutAt, rs.timeoutAt, "timeout_at"}, {&in.LeaseExpiresAt, rs.leaseAt, "lease_expires_at"},
		{&in.StartedAt, rs.startedAt, "started_at"}, {&in.ReadySince, rs.readySince, "ready_since"}} {
		if *t.dst, err = timeOf(t.src, t.name); err != nil {
			return instanceRow{}, err
		}
	}
	return rs.r, nil
}

// severalKeys fills the keys of a row of several keys from its key column
// and its extra keys: Key and Also in store.NormalizeKeys' order, which
// the key column holds only while the row executes (see migration 025).
func severalKeys(in *store.Instance, extra, intents []string) error {
	in.Also = make([]store.KeyRef, len(extra))
	for i, k := range extra {
		in.Also[i].Key = k
		if i < len(intents) {
			in.Also[i].Intent = gateIntent(intents[i])
		}
	}
	if err := store.NormalizeKeys(&in.Key, &in.KeyIntent, &in.Also); err != nil {
		return fmt.Errorf("instance %s: its keys: %w", in.ID, err)
	}
	return nil
}

// claimScan is what scanClaimed scans a row into (one allocation).
type claimScan struct {
	rowScan
	sigID      pgtype.Int8
	sigName    pgtype.Text
	sigPayload jsonText
	sigDedup   pgtype.Text
	sigCreated pgtype.Timestamptz
}

// timeOf is a nullable timestamptz as a time.Time, zero for NULL. An
// infinite timestamp is refused, as a *time.Time destination refuses it.
func timeOf(t pgtype.Timestamptz, col string) (time.Time, error) {
	if !t.Valid {
		return time.Time{}, nil
	}
	if t.InfinityModifier != pgtype.Finite {
		return time.Time{}, fmt.Errorf("can't scan %s: cannot scan %s into *time.Time", col, t.InfinityModifier)
	}
	return t.Time, nil
}

// jsonText scans a JSON column into a copy of its bytes, nil for NULL (a
// *[]byte destination copies them too, and the copy was then copied).
type jsonText []byte

// ScanBytes implements pgtype.BytesScanner.
func (j *jsonText) ScanBytes(b []byte) error {
	*j = bytes.Clone(b)
	return nil
}

// internedText scans a NOT NULL text column whose values repeat from row
// to row (workflow, queue, step, status, key intent, worker) into a shared
// string: one allocation per distinct value, not per row.
type internedText string

// ScanBytes implements pgtype.BytesScanner.
func (t *internedText) ScanBytes(b []byte) error {
	if b == nil {
		return errors.New("cannot scan NULL into *string")
	}
	*t = internedText(intern(b))
	return nil
}

// The interned strings: a map replaced (never changed) as it grows, read
// without a lock, of at most maxInterned strings of at most
// maxInternedLen bytes; past these bounds a value is copied per row.
var (
	interned   atomic.Pointer[map[string]string]
	internedMu sync.Mutex
)

const (
	maxInterned    = 4096
	maxInternedLen = 128
)

func intern(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if m := interned.Load(); m != nil {
		if s, ok := (*m)[string(b)]; ok {
			return s
		}
	}
	s := string(b)
	if len(b) > maxInternedLen {
		return s
	}
	internedMu.Lock()
	defer internedMu.Unlock()
	old := interned.Load()
	m := map[string]string{}
	if old != nil {
		if v, ok := (*old)[s]; ok {
			return v
		}
		if len(*old) >= maxInterned {
			return s
		}
		m = make(map[string]string, len(*old)+1)
		for k, v := range *old {
			m[k] = v
		}
	}
	m[s] = s
	interned.Store(&m)
	return s
}
