package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Get returns one instance, or store.ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (store.Instance, error) {
	if err := s.check(); err != nil {
		return store.Instance{}, err
	}
	if _, err := uuid.Parse(id); err != nil {
		return store.Instance{}, fmt.Errorf("get %s: %w", id, store.ErrNotFound)
	}
	in, err := scanInstance(s.pool.QueryRow(ctx, s.q(sqlGet), id))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Instance{}, fmt.Errorf("get %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return store.Instance{}, fmt.Errorf("get %s: %w", id, err)
	}
	return in, nil
}

// List returns instances matching f, ordered by id (by id descending with
// f.Newest); a zero f.Limit means no limit. Status ready includes rows
// whose run_at is in the future. It is ListPage's Rows.
func (s *Store) List(ctx context.Context, f store.ListFilter) ([]store.Instance, error) {
	p, err := s.ListPage(ctx, f)
	return p.Rows, err
}

// ListPage is List with the position it stopped at (see store.Page). With
// f.ScanLimit it reads at most f.ScanLimit rows of the primary key.
func (s *Store) ListPage(ctx context.Context, f store.ListFilter) (store.Page, error) {
	if err := s.check(); err != nil {
		return store.Page{}, err
	}
	var limit *int
	if f.Limit > 0 {
		limit = &f.Limit
	}
	statuses := []string{}
	if f.Status != "" {
		statuses = storedStatuses([]store.Status{f.Status})
	}
	var after *string
	if f.AfterID != "" {
		if _, err := uuid.Parse(f.AfterID); err != nil {
			return store.Page{}, fmt.Errorf("list: after id %q is not a UUID", f.AfterID)
		}
		after = &f.AfterID
	}
	// The filters are optional ("$1 = '' OR ..."): only a plan made for the
	// values given can pick the partial index they allow, so List never
	// runs on a cached generic plan (which scans the table).
	custom := pgx.QueryExecModeExec
	if f.ScanLimit > 0 {
		return s.listScan(ctx, f, custom, statuses, after, limit)
	}
	stmt := sqlList
	if f.Newest {
		stmt = sqlListNewest
	}
	rows, err := s.queryInstances(ctx, "list", s.q(stmt), custom, f.Workflow, statuses, f.Key, f.Queue, after, limit)
	if err != nil {
		return store.Page{}, err
	}
	p := store.Page{Rows: rows}
	if f.Limit > 0 && len(rows) == f.Limit {
		p.Next = rows[len(rows)-1].ID
	}
	return p, nil
}

// listScan is ListPage bounded by f.ScanLimit: the matching rows among the
// next f.ScanLimit, and the last of those as the cursor when fewer than
// f.Limit match.
func (s *Store) listScan(ctx context.Context, f store.ListFilter, custom pgx.QueryExecMode, statuses []string, after *string, limit *int) (store.Page, error) {
	stmt := sqlListScan
	if f.Newest {
		stmt = sqlListScanNewest
	}
	rows, err := s.pool.Query(ctx, s.q(stmt), custom, f.Workflow, statuses, f.Key, f.Queue, after, limit, f.ScanLimit)
	if err != nil {
		return store.Page{}, fmt.Errorf("list: %w", err)
	}
	defer rows.Close()
	var p store.Page
	for rows.Next() {
		var (
			hit bool
			n   int64
		)
		r, err := scanInstanceRow(rows, &hit, &n)
		if err != nil {
			return store.Page{}, fmt.Errorf("list: %w", err)
		}
		if f.Limit > 0 && len(p.Rows) == f.Limit {
			break // the ScanLimit-th row past a full page
		}
		if hit {
			p.Rows = append(p.Rows, r.Instance)
			if f.Limit > 0 && len(p.Rows) == f.Limit {
				p.Next = r.ID
				continue
			}
		}
		if n == int64(f.ScanLimit) {
			p.Next, p.ScanStopped = r.ID, true
		}
	}
	if err := rows.Err(); err != nil {
		return store.Page{}, fmt.Errorf("list: %w", err)
	}
	return p, nil
}

// Inbox returns the unconsumed signals of an instance, oldest first, at
// most limit (0: no limit).
func (s *Store) Inbox(ctx context.Context, id string, limit int) ([]store.Signal, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if _, err := uuid.Parse(id); err != nil {
		return nil, nil
	}
	var lim *int
	if limit > 0 {
		lim = &limit
	}
	rows, err := s.pool.Query(ctx, s.q(sqlInbox), id, lim)
	if err != nil {
		return nil, fmt.Errorf("inbox %s: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Signal, error) {
		var sg store.Signal
		err := r.Scan(&sg.ID, &sg.InstanceID, &sg.Name, &sg.Payload, &sg.DedupKey, &sg.CreatedAt)
		return sg, err
	})
	if err != nil {
		return nil, fmt.Errorf("inbox %s: %w", id, err)
	}
	return out, nil
}

// Children returns the children of a parent in creation order.
func (s *Store) Children(ctx context.Context, parentID string) ([]store.Instance, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if _, err := uuid.Parse(parentID); err != nil {
		return nil, nil
	}
	return s.queryInstances(ctx, "children", s.q(sqlChildren), parentID)
}

func (s *Store) queryInstances(ctx context.Context, op, stmt string, args ...any) ([]store.Instance, error) {
	rows, err := s.pool.Query(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Instance, error) { return scanInstance(r) })
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// History returns the recorded step runs of an instance, oldest first
// (none unless Options.History is set).
func (s *Store) History(ctx context.Context, id string) ([]store.HistoryEntry, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if _, err := uuid.Parse(id); err != nil {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, s.q(sqlHistory), id)
	if err != nil {
		return nil, fmt.Errorf("history %s: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.HistoryEntry, error) {
		var h store.HistoryEntry
		var started, finished *time.Time
		err := r.Scan(&h.InstanceID, &h.Step, &h.Attempt, &h.Key, &h.Worker, &started, &finished, &h.Outcome, &h.Error)
		h.StartedAt, h.FinishedAt = fromPtr(started), fromPtr(finished)
		if first, rest, several := strings.Cut(h.Key, "\x1f"); several {
			h.Key, h.Also = first, strings.Split(rest, "\x1f")
		}
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("history %s: %w", id, err)
	}
	return out, nil
}

// maxHolders bounds the holders KeyInfo lists.
const maxHolders = 1000

// KeyInfo explains a key: its K, its holders (at most 1000), its waiting
// rows (ready, delayed and blocked), the next in line, the longest waiting
// and the slots a claim could take now: for a gate, from its counters (the
// limit less its holders when no counter exists yet); for a K = 1 key, 1
// while none of its rows executes, else 0.
func (s *Store) KeyInfo(ctx context.Context, key string) (store.KeyInfo, error) {
	if err := s.check(); err != nil {
		return store.KeyInfo{}, err
	}
	if _, err := gate.Parse(key); err != nil || key == "" {
		return store.KeyInfo{}, fmt.Errorf("key info: %w", gate.ErrInvalidKey)
	}
	info := store.KeyInfo{Key: key, K: 1}
	var (
		limit, shards *int32
		counters      []slotRow
		next, oldest  []store.Instance
	)
	b := &pgx.Batch{}
	b.Queue(s.q(sqlLimitOf), key).Query(func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&limit, &shards, &info.LimitName}, func() error { return nil })
		return err
	})
	b.Queue(s.q(sqlKeyHolders), key, maxHolders).Query(func(rows pgx.Rows) error {
		var err error
		info.Holders, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Instance, error) { return scanInstance(r) })
		return err
	})
	b.Queue(s.q(sqlKeyWaiting), key).QueryRow(func(row pgx.Row) error { return row.Scan(&info.Waiting, &info.Blocked, &info.WaitingElsewhere) })
	b.Queue(s.q(sqlKeyNext), key).Query(func(rows pgx.Rows) error {
		var err error
		next, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Instance, error) { return scanInstance(r) })
		return err
	})
	b.Queue(s.q(sqlKeyOldest), key).Query(func(rows pgx.Rows) error {
		var err error
		oldest, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Instance, error) { return scanInstance(r) })
		return err
	})
	b.Queue(s.q(sqlKeySlots), key).Query(func(rows pgx.Rows) error {
		var r slotRow
		_, err := pgx.ForEachRow(rows, []any{&r.shard, &r.capacity, &r.available}, func() error {
			counters = append(counters, r)
			return nil
		})
		return err
	})
	b.Queue(s.q(sqlKeyRate), key).Query(func(rows pgx.Rows) error {
		var (
			limit, burst int
			periodUS     int64
			perKey       bool
			credit       *int64
			at           *time.Time
		)
		_, err := pgx.ForEachRow(rows, []any{&limit, &periodUS, &burst, &perKey, &credit, &at}, func() error {
			info.RateLimit = &gate.RateLimit{Name: gate.NameOf(key), Limit: limit, Period: time.Duration(periodUS) * time.Microsecond,
				Burst: burst, PerKey: perKey}
			if credit != nil {
				info.Bucket = &gate.Bucket{Credit: *credit, At: *at}
			}
			return nil
		})
		return err
	})
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return store.KeyInfo{}, fmt.Errorf("key info: %w", err)
	}
	if len(next) > 0 {
		info.NextInLine = &next[0]
	}
	if len(oldest) > 0 {
		info.OldestWaiting = &oldest[0]
	}
	if limit != nil {
		info.K, info.Shards = int(*limit), int(*shards)
		if len(counters) > 0 {
			// What a claim could admit now: free slots of the limit's shards,
			// and no more than the limit minus the slots in use.
			free, used := 0, 0
			for _, r := range counters {
				used += r.capacity - r.available
				if r.shard < info.Shards {
					free += r.available
				}
			}
			info.Available = max(0, min(free, info.K-used))
		} else {
			info.Available = max(0, info.K-len(info.Holders))
		}
	} else {
		// A K = 1 key: its one slot is free while none of its rows executes
		// (rows admitted under a limit since removed may hold more).
		info.Available = max(0, 1-len(info.Holders))
	}
	return info, nil
}
