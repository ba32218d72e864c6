package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/store"
	"github.com/jackc/pgx/v5"
)

// SyncLimits stores the concurrency limits of store.DefaultNamespace, its
// rate limits unchanged (see store.Store).
func (s *Store) SyncLimits(ctx context.Context, limits []gate.Limit) (store.LimitsResult, error) {
	if limits == nil {
		limits = []gate.Limit{}
	}
	return s.syncKeyLimits(ctx, store.DefaultNamespace, limits, nil, store.SyncOptions{})
}

// SyncKeyLimits makes the key limits namespace owns equal to want, in one
// transaction (see store.Store). Buckets of a name whose rate limit changed
// keep their tokens; they are deleted when it lost its rate limit or
// changed scope. Once it commits, existing counters of a changed name, or
// of a key whose own limit changed, are resized a few keys to a
// transaction, keeping the slots in use: a key never has more free slots
// than its new limit minus the rows its counters hold; a key left with
// free slots has as many of its blocked rows promoted in that transaction.
// Counters of a name that lost its limit are deleted (its keys run at K = 1
// from the next claim on). Then the live instances of the changed names
// and keys are counted (LimitsResult.Live) and the warning for them
// recorded (see syncKeyLimits).
func (s *Store) SyncKeyLimits(ctx context.Context, namespace string, want store.KeyLimits, o store.SyncOptions) (store.LimitsResult, error) {
	return s.syncKeyLimits(ctx, namespace, want.Limits, want.RateLimits, o)
}

// ownedLimit and ownedRate are stored limits with their namespace.
type ownedLimit struct {
	gate.Limit
	namespace string
}

type ownedRate struct {
	gate.RateLimit
	namespace string
}

// syncKeyLimits syncs namespace's limits unless limits is nil, and its
// rate limits unless rates is nil.
func (s *Store) syncKeyLimits(ctx context.Context, namespace string, limits []gate.Limit, rates []gate.RateLimit, o store.SyncOptions) (store.LimitsResult, error) {
	if err := s.check(); err != nil {
		return store.LimitsResult{}, err
	}
	wantLs, wantRs, err := store.ValidateKeyLimits(namespace, limits, rates)
	if err != nil {
		return store.LimitsResult{}, err
	}

	wantAll, wantRates := wantLs.All(), wantRs.All() // each sorted once
	if s.unchanged(ctx, namespace, limits != nil, rates != nil, wantAll, wantRates, o) {
		return store.LimitsResult{}, nil
	}
	names, rateNames := syncNames(wantAll, wantRates, o)
	var res store.LimitsResult
	stranded := &strandedKeys{}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlLimitsLock, lockSalt(s.schema, saltLimits)); err != nil {
			return err
		}
		// The entries the sync can change, the names' limits and the first
		// per-key limit of each name (sqlLimitsOwnedFor), not every stored
		// limit: every other entry is one nextOwned keeps as it is, one
		// whose K (its own limit) no change of these alters, and one
		// Validate judges as it judges the first per-key limit of its name.
		// So the writes, the changes and the checks are those of the whole
		// set, which a fleet with a per-key limit for each of many thousand
		// tenants would read at every `durable limits set`.
		oldLs, oldRs, err := s.readOwned(ctx, tx, names, rateNames, namespace, o.KeepOmitted || limits == nil, o.KeepOmitted || rates == nil, true)
		if err != nil {
			return err
		}
		nextLs, nextRs, err := nextOwned(oldLs, oldRs, wantAll, wantRates, namespace, limits != nil, rates != nil, o)
		if err != nil {
			return err
		}
		before, err := gate.NewLimits(limitsOf(oldLs))
		if err != nil {
			return fmt.Errorf("stored limits: %w", err)
		}
		after, err := gate.NewLimits(limitsOf(nextLs))
		if err == nil {
			err = after.Validate()
		}
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		if limits != nil {
			gone, put := writes(oldLs, nextLs, func(l ownedLimit) string { return l.Name })
			names, values, shards, owners := make([]string, len(put)), make([]int32, len(put)), make([]int32, len(put)), make([]string, len(put))
			for i, l := range put {
				names[i], values[i], shards[i], owners[i] = l.Name, int32(l.Limit.Limit), int32(l.Shards), l.namespace
			}
			b.Queue(s.q(sqlLimitsApply), gone, names, values, shards, owners)
			res.Changes = gate.Diff(before, after)
		}

		if rates != nil {
			rBefore, err := gate.NewRateLimits(ratesOf(oldRs))
			if err != nil {
				return fmt.Errorf("stored rate limits: %w", err)
			}
			rAfter, err := gate.NewRateLimits(ratesOf(nextRs))
			if err != nil {
				return err
			}
			gone, put := writes(oldRs, nextRs, func(r ownedRate) string { return r.Name })
			n := len(put)
			rn, rl, rp, rb, rk, ro := make([]string, n), make([]int32, n), make([]int64, n), make([]int32, n), make([]bool, n), make([]string, n)
			for i, r := range put {
				rn[i], rl[i], rp[i], rb[i], rk[i], ro[i] = r.Name, int32(r.Limit), r.TokenCredit(), int32(r.Burst), r.PerKey, r.namespace
			}
			b.Queue(s.q(sqlRatesApply), gone, rn, rl, rp, rb, rk, ro)
			res.RateChanges = gate.DiffRates(rBefore, rAfter)
			s.queueBucketChanges(b, res.RateChanges)
		}
		if b.Len() > 0 {
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
		}
		if o.DryRun {
			return errDryRun
		}
		return nil
	})
	if err != nil && !errors.Is(err, errDryRun) {
		return store.LimitsResult{}, fmt.Errorf("sync limits: %w", err)
	}
	dryRun := err != nil
	if !dryRun {
		changed := make([]string, len(res.Changes))
		for i, c := range res.Changes {
			changed[i] = c.Name
		}
		err = s.reshapeCounters(ctx, changed, stranded)
		s.heal(ctx, stranded, time.Time{})
		if err != nil {
			// The limits are stored: the reconciler re-shapes the counters
			// this could not at its next sweep.
			return res, fmt.Errorf("sync limits: stored, but re-shaping the counters of the changed keys failed (the reconciler repairs them): %w", err)
		}
	}
	// The live rows of the changed names and keys are counted once the
	// change is in force, outside its transaction, and the warning that
	// names them is recorded then: a name's count reads every live row of
	// the name, so it grows with the backlog, and in the transaction it
	// would hold the sync's lock and delay the new limit by as long.
	// The warning is advice: a sync that fails after its commit stores the
	// limits without it.
	if len(res.Changes)+len(res.RateChanges) == 0 {
		return res, nil
	}
	if err := s.countLive(ctx, &res); err != nil {
		return res, fmt.Errorf("sync limits: %s, but counting the live instances of the changed names failed: %w", storedOrNot(dryRun), err)
	}
	if dryRun {
		return res, nil
	}
	if ws := store.LiveChangeWarnings(res); len(ws) > 0 {
		names, messages, live := make([]string, len(ws)), make([]string, len(ws)), make([]int64, len(ws))
		for i, w := range ws {
			names[i], messages[i], live[i] = w.Name, w.Message, w.Live
		}
		if _, err := s.pool.Exec(ctx, s.q(sqlLimitChangesRecord), names, messages, live, nil); err != nil {
			return res, fmt.Errorf("sync limits: stored, but recording the warning for live instances failed: %w", err)
		}
	}
	return res, nil
}

// storedOrNot says what a sync that failed after its transaction left.
func storedOrNot(dryRun bool) string {
	if dryRun {
		return "dry run"
	}
	return "stored"
}

// errDryRun rolls back a sync that only reports.
var errDryRun = errors.New("dry run")

// nextOwned is what a sync of namespace stores, given what is stored: its
// wanted limits (or those stored, unless syncLimits) and rate limits (or
// those stored, unless syncRates), merged by desired; or the conflict of a
// wanted name that another namespace owns.
func nextOwned(oldLs []ownedLimit, oldRs []ownedRate, wantLs []gate.Limit, wantRs []gate.RateLimit, namespace string, syncLimits, syncRates bool, o store.SyncOptions) ([]ownedLimit, []ownedRate, error) {
	keep := o.KeepOmitted
	// Owners by name: a fleet may store a per-key limit for every tenant,
	// and a sync of all of them looks each one up.
	owner := make(map[string]string, len(oldLs))
	for _, x := range oldLs {
		owner[x.Name] = x.namespace
	}
	names := slices.Clone(o.RemoveLimits)
	for _, l := range wantLs {
		names = append(names, l.Name)
	}
	for _, name := range names {
		if ns, ok := owner[name]; ok && ns != namespace {
			return nil, nil, fmt.Errorf("limit %q: %w %q", name, store.ErrNamespaceConflict, ns)
		}
	}
	rateOwner := make(map[string]string, len(oldRs))
	for _, x := range oldRs {
		rateOwner[x.Name] = x.namespace
	}
	for _, r := range wantRs {
		if ns, ok := rateOwner[r.Name]; ok && ns != namespace {
			return nil, nil, fmt.Errorf("rate limit %q: %w %q", r.Name, store.ErrNamespaceConflict, ns)
		}
	}
	nextLs, nextRs := oldLs, oldRs
	if syncLimits {
		nextLs = desired(oldLs, wantLs, namespace, keep,
			func(x ownedLimit) (string, string) { return x.Name, x.namespace },
			func(l gate.Limit) ownedLimit { return ownedLimit{l, namespace} })
		if len(o.RemoveLimits) > 0 {
			remove := make(map[string]bool, len(o.RemoveLimits))
			for _, name := range o.RemoveLimits {
				remove[name] = true
			}
			nextLs = slices.DeleteFunc(nextLs, func(l ownedLimit) bool { return remove[l.Name] })
		}
	}
	if syncRates {
		nextRs = desired(oldRs, wantRs, namespace, keep,
			func(x ownedRate) (string, string) { return x.Name, x.namespace },
			func(r gate.RateLimit) ownedRate { return ownedRate{r, namespace} })
	}
	return nextLs, nextRs, nil
}

// unchanged reports whether a sync (see nextOwned) would store exactly
// what is stored, read without a lock: then the sync takes no lock, writes
// nothing and commits nothing. It is what an engine's Start finds whenever
// the fleet's limits did not change: in the statement log of one peers
// util run, the locked sync took 5 ms (a lock, two reads, a replace and a
// commit) before the first claim. A sync that changes something, or finds
// a name owned by another namespace, or cannot read, takes the locked
// path.
//
// It reads only the entries the sync can change (sqlLimitsOwnedOf): the
// names it wants or removes and, unless it keeps what it omits, the
// namespace's own. Every other stored entry is one nextOwned keeps as it
// is, so the sync changes nothing exactly when it changes none of these;
// a fleet may store a per-key limit for each of many thousand tenants,
// which an engine's Start would otherwise read.
func (s *Store) unchanged(ctx context.Context, namespace string, syncLimits, syncRates bool, wantLs []gate.Limit, wantRs []gate.RateLimit, o store.SyncOptions) bool {
	names, rateNames := syncNames(wantLs, wantRs, o)
	oldLs, oldRs, err := s.readOwned(ctx, s.pool, names, rateNames, namespace, o.KeepOmitted || !syncLimits, o.KeepOmitted || !syncRates, false)
	if err != nil {
		return false
	}
	nextLs, nextRs, err := nextOwned(oldLs, oldRs, wantLs, wantRs, namespace, syncLimits, syncRates, o)
	if err != nil {
		return false
	}
	// Rate limits compared as stored: the period in microseconds (TokenCredit).
	stored := func(rs []ownedRate) []ownedRate {
		out := make([]ownedRate, len(rs))
		for i, r := range rs {
			r.Period = time.Duration(r.TokenCredit()) * time.Microsecond
			out[i] = r
		}
		return out
	}
	return sameSet(oldLs, nextLs, func(a, b ownedLimit) int { return strings.Compare(a.Name, b.Name) }) &&
		sameSet(stored(oldRs), stored(nextRs), func(a, b ownedRate) int { return strings.Compare(a.Name, b.Name) })
}

// sameSet reports whether a and b hold the same elements, ordered by cmp
// (unique keys).
func sameSet[T comparable](a, b []T, cmp func(T, T) int) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, cmp)
	slices.SortFunc(b, cmp)
	return slices.Equal(a, b)
}

// batcher sends a batch: a transaction or the pool.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// ownedOfMax is the most limit names whose entries a sync reads apart
// (readOwned); a sync of more, a fleet's whole set of tenants' limits,
// reads every stored limit: every other entry is one it keeps as it is,
// so reading more decides the same, and for a sync of all of
// BenchmarkManyKeyLimits' 100,000 per-key limits one read of the table
// costs less than looking each name up.
var ownedOfMax = 1000

// syncNames are the limit names a sync wants or removes, and the rate
// limit names it wants.
func syncNames(wantLs []gate.Limit, wantRs []gate.RateLimit, o store.SyncOptions) (names, rateNames []string) {
	names = slices.Clone(o.RemoveLimits)
	for _, l := range wantLs {
		names = append(names, l.Name)
	}
	for _, r := range wantRs {
		rateNames = append(rateNames, r.Name)
	}
	return names, rateNames
}

// readOwned reads, with their owners, the limits sqlLimitsOwnedOf reads
// for names, namespace and keepLimits, or sqlLimitsOwnedFor when locked
// (every stored limit past ownedOfMax names), and the rate limits named in
// rateNames and, unless keepRates, those namespace owns (sqlRatesOwnedOf).
func (s *Store) readOwned(ctx context.Context, tx batcher, names, rateNames []string, namespace string, keepLimits, keepRates, locked bool) ([]ownedLimit, []ownedRate, error) {
	var ls []ownedLimit
	var rs []ownedRate
	b := &pgx.Batch{}
	var q *pgx.QueuedQuery
	switch {
	case len(names) > ownedOfMax:
		q = b.Queue(s.q(sqlLimitsOwned))
	case locked:
		q = b.Queue(s.q(sqlLimitsOwnedFor), names, namespace, keepLimits)
	default:
		q = b.Queue(s.q(sqlLimitsOwnedOf), names, namespace, keepLimits)
	}
	q.Query(func(rows pgx.Rows) error {
		var l ownedLimit
		_, err := pgx.ForEachRow(rows, []any{&l.Name, &l.Limit.Limit, &l.Shards, &l.namespace}, func() error {
			ls = append(ls, l)
			return nil
		})
		return err
	})
	b.Queue(s.q(sqlRatesOwnedOf), rateNames, namespace, keepRates).Query(func(rows pgx.Rows) error {
		var r ownedRate
		var periodUS int64
		_, err := pgx.ForEachRow(rows, []any{&r.Name, &r.Limit, &periodUS, &r.Burst, &r.PerKey, &r.namespace}, func() error {
			r.Period = time.Duration(periodUS) * time.Microsecond
			rs = append(rs, r)
			return nil
		})
		return err
	})
	return ls, rs, tx.SendBatch(ctx, b).Close()
}

// desired is the stored set after namespace syncs want: entries of other
// namespaces stay, the namespace's omitted entries go (unless keep), and
// want is added or replaces.
func desired[T, W any](current []T, want []W, namespace string, keep bool, key func(T) (name, owner string), own func(W) T) []T {
	wanted := map[string]bool{}
	var out []T
	for _, w := range want {
		t := own(w)
		name, _ := key(t)
		wanted[name] = true
		out = append(out, t)
	}
	for _, c := range current {
		name, owner := key(c)
		if wanted[name] || (owner == namespace && !keep) {
			continue
		}
		out = append(out, c)
	}
	return out
}

// writes is what a sync stores to turn the stored entries old into next
// (each unique by name): the names of old that next lacks, to delete, and
// the entries of next that are new or differ from old's, to upsert. A sync
// writes what it changes, not every stored entry: setting one tenant's
// limit among many rewrites one row.
func writes[T comparable](old, next []T, name func(T) string) (gone []string, put []T) {
	was := make(map[string]T, len(old))
	for _, x := range old {
		was[name(x)] = x
	}
	for _, x := range next {
		if w, ok := was[name(x)]; !ok || w != x {
			put = append(put, x)
		}
		delete(was, name(x))
	}
	for n := range was {
		gone = append(gone, n)
	}
	slices.Sort(gone)
	return gone, put
}

func limitsOf(ls []ownedLimit) []gate.Limit {
	out := make([]gate.Limit, len(ls))
	for i, l := range ls {
		out[i] = l.Limit
	}
	return out
}

func ratesOf(rs []ownedRate) []gate.RateLimit {
	out := make([]gate.RateLimit, len(rs))
	for i, r := range rs {
		out[i] = r.RateLimit
	}
	return out
}

// queueBucketChanges queues on b, the change's batch, the adjustment of the
// buckets of the names whose rate limit changed.
func (s *Store) queueBucketChanges(b *pgx.Batch, changes []gate.RateChange) {
	var drop, rescale []string
	var oldTC, newTC, caps []int64
	for _, c := range changes {
		switch {
		case !c.OldSet:
		case !c.NewSet || c.Old.PerKey != c.New.PerKey:
			drop = append(drop, c.Name)
		default:
			rescale = append(rescale, c.Name)
			oldTC, newTC, caps = append(oldTC, c.Old.TokenCredit()), append(newTC, c.New.TokenCredit()), append(caps, c.New.Capacity())
		}
	}
	if len(drop) > 0 {
		b.Queue(s.q(sqlBucketsDrop), drop)
	}
	if len(rescale) > 0 {
		b.Queue(s.q(sqlBucketsRescale), rescale, oldTC, newTC, caps)
	}
}

// countLive sets res.Live: the live instances of every name and key whose
// limit or rate limit changed. The counts run with sequential scans off
// (sqlNoSeqScan), as the hot paths do: each stops at gate.LiveCountCap
// rows, and under such a LIMIT a planner that judges the matching rows
// dense may choose a sequential scan that is to stop early, which on a
// table of millions of other rows reads far more than the index would.
func (s *Store) countLive(ctx context.Context, res *store.LimitsResult) error {
	res.Live = map[string]int64{}
	var all, keys, keyNames []string
	for _, c := range res.Changes {
		all = append(all, c.Name)
		if strings.Contains(c.Name, ":") {
			keys, keyNames = append(keys, c.Name), append(keyNames, gate.NameOf(c.Name))
		}
	}
	for _, c := range res.RateChanges {
		all = append(all, c.Name)
	}
	slices.Sort(all)
	all = slices.Compact(all)
	for _, n := range all {
		res.Live[n] = 0
	}
	b := &pgx.Batch{}
	b.Queue(s.q(sqlLiveByName), all, gate.LiveCountCap).Query(func(rows pgx.Rows) error {
		var name string
		var n int64
		_, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { res.Live[name] = n; return nil })
		return err
	})
	if len(keys) > 0 {
		b.Queue(s.q(sqlLiveByKey), keys, keyNames, gate.LiveCountCap).Query(func(rows pgx.Rows) error {
			var key string
			var n int64
			_, err := pgx.ForEachRow(rows, []any{&key, &n}, func() error { res.Live[key] = n; return nil })
			return err
		})
	}
	tx, err := s.beginBatch(ctx)
	if err != nil {
		return err
	}
	defer tx.end()
	return tx.send(ctx, b, true)
}

// limitChunk is how many keys' counters one transaction of a limit
// change re-shapes (see reshapeCounters).
var limitChunk = 10

// reshapeFreePasses is how many passes over the keys left a limit change
// makes with counters it need not wait for, before it waits for the rest
// one key at a time (see reshapeCounters).
var reshapeFreePasses = 50

// reshapeCounters re-shapes the counters of the keys of the changed names
// that run under them (not those of a limit of their own: see
// sqlSlotKeysOfNames) and of the changed keys to the limits stored when it
// runs, and promotes the blocked rows of the keys that have free slots
// after it, limitChunk keys to a transaction, after the change committed.
//
// A chunk never waits for a counter while it holds others: it locks the
// counters no claim or credit holds (SKIP LOCKED), re-shapes the keys it
// locked whole, commits, and leaves the keys of which a counter was held
// to the next pass, a few milliseconds later. A claim or a credit of a
// gate key therefore waits at most for one chunk's statements, not for
// the claims the change would have waited behind: a transaction that
// waited for a held counter kept every counter it had locked before it
// until the holder committed. Keys still held after reshapeFreePasses
// passes (a counter that some transaction holds nearly all the time) are
// re-shaped one key to a transaction, waiting for its counters, so that
// the change ends. A key of one counter that a chunk found held is
// re-shaped so right after that chunk commits: waiting for its one counter
// holds no other, a claim or a credit of the key waits for the change's
// statements as it would for another claim's, and a saturated key's
// counter is one that its claims and step ends hold nearly all the time,
// which passes without waiting would mostly find held
// (BenchmarkManyKeyLimits, "set one, its counters busy").
//
// A chunk takes the limits lock (as a sync does), then its keys' counters,
// then reads the limits: a sync that commits meanwhile waits for the
// chunk, and its own chunks, which come after its commit, re-shape after
// this one. Each key is re-shaped at once; the keys of one name run under
// the old limit or the new one until their chunk, as if the change had
// been made key by key, which the limits' semantics allow (a lowered
// limit binds as executing rows finish). Counters created after the commit
// take the new limit; counters created from the old limits by a claim that
// read them before the commit, which the key list may miss, are repaired
// by the reconciler, which re-shapes every counter to the stored limits.
func (s *Store) reshapeCounters(ctx context.Context, changed []string, st *strandedKeys) error {
	if len(changed) == 0 {
		return nil
	}
	rows, err := s.pool.Query(ctx, s.q(sqlSlotKeysOfNames), changed)
	if err != nil {
		return err
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for pass := 0; len(keys) > 0; pass++ {
		if pass > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(min(time.Millisecond<<min(pass, 5), 20*time.Millisecond)):
			}
		}
		wait, size := pass >= reshapeFreePasses, limitChunk
		if wait {
			size = 1
		}
		var held []string
		for len(keys) > 0 {
			chunk := keys[:min(len(keys), size)]
			keys = keys[len(chunk):]
			var stranded strandedKeys
			var lone []string
			if err := s.reshapeChunk(ctx, chunk, wait, &stranded, &held, &lone); err != nil {
				return err
			}
			for _, k := range lone {
				if err := s.reshapeChunk(ctx, []string{k}, true, &stranded, nil, nil); err != nil {
					return err
				}
			}
			st.keys, st.one = append(st.keys, stranded.keys...), append(st.one, stranded.one...)
		}
		keys = held
	}
	return nil
}

// queueLimitsFor queues on b the read of the stored limits that the keys
// after `after` up to and including upto (nil: every key after) and the
// keys of also run under (sqlLimitsFor); once the batch has run, the
// returned function gives them as gate.Limits, whose For answers for those
// keys alone. A repair reads these, not every stored limit, since a fleet
// may store a per-key limit for each of many thousand tenants.
func (s *Store) queueLimitsFor(b *pgx.Batch, after string, upto *string, also []string) func() (gate.Limits, error) {
	var stored []gate.Limit
	b.Queue(s.q(sqlLimitsFor), after, upto, also).Query(func(rows pgx.Rows) error {
		var l gate.Limit
		_, err := pgx.ForEachRow(rows, []any{&l.Name, &l.Limit, &l.Shards}, func() error {
			stored = append(stored, l)
			return nil
		})
		return err
	})
	return func() (gate.Limits, error) {
		ls, err := gate.NewLimits(stored)
		if err != nil {
			return ls, fmt.Errorf("stored limits: %w", err)
		}
		return ls, nil
	}
}

// reshapeChunk re-shapes the counters of keys (see reshapeCounters), in a
// transaction of two round trips: the first locks the counters, the second
// writes them and commits, so that the counters stay locked for one turn of
// this process between two batches. With wait false it locks only the
// counters no other transaction holds, and adds the keys of which it could
// not lock every counter to skipped, or to lone when a key has one counter:
// it re-shapes none of theirs. With wait true it leaves both alone.
func (s *Store) reshapeChunk(ctx context.Context, keys []string, wait bool, st *strandedKeys, skipped, lone *[]string) error {
	t, err := s.beginBatch(ctx)
	if err != nil {
		return err
	}
	defer t.end()
	counters := map[string]map[int]slotTarget{}
	b := &pgx.Batch{}
	b.Queue(sqlLimitsLock, lockSalt(s.schema, saltLimits))
	if wait {
		b.Queue(s.q(sqlSlotsOfKeys), keys).Query(scanCounters(counters))
	} else {
		b.Queue(s.q(sqlSlotsOfKeysFree), keys).Query(scanFreeCounters(counters, skipped, lone))
	}
	empty := "" // no range (nothing is after "" and at most ""): the chunk's keys
	storedLimits := s.queueLimitsFor(b, "", &empty, keys)
	if err := t.send(ctx, b, false); err != nil {
		return err
	}
	limits, err := storedLimits()
	if err != nil {
		return err
	}
	var (
		set         slotRows // counters read and locked above: overwritten
		create      slotRows // counters the read did not find: created only
		dropKeys    []string
		promoteKeys []string
		promoteNs   []int32
	)
	for _, k := range mapKeys(counters) {
		byShard := counters[k]
		l, limited := limits.For(k)
		if !limited {
			dropKeys = append(dropKeys, k)
			continue
		}
		used := map[int]int{}
		var existing []int
		for sh, c := range byShard {
			existing = append(existing, sh)
			if u := c.capacity - c.available; u > 0 {
				used[sh] = u
			}
		}
		target := resizeShards(l.ShardCapacities(), used, existing)
		free := 0
		for sh, t := range target {
			free += t.available
			if _, read := byShard[sh]; read {
				set.add(k, sh, t)
			} else {
				create.add(k, sh, t)
			}
		}
		if free > 0 {
			promoteKeys, promoteNs = append(promoteKeys, k), append(promoteNs, int32(free))
		}
	}
	b = &pgx.Batch{}
	set.queue(b, s.q(sqlSlotsInsert))
	// A claim that read the new limit may have created one of these since
	// the read above, and debited it: its counter is left as the claim made
	// it (sqlSlotsCreate), since overwriting it from this read would free
	// the slots of the claim's rows.
	create.queue(b, s.q(sqlSlotsCreate))
	if len(promoteKeys) > 0 {
		// A raised limit admits the key's blocked rows now, not at the
		// reconciler's next sweep; the rows are locked after the counters,
		// SKIP LOCKED, as a freeing transaction promotes them, and the keys
		// left stranded by skipped rows are healed after the change.
		b.Queue(s.q(sqlPromote), promoteKeys, promoteNs, nil, make([]bool, len(promoteKeys))).Query(func(rows pgx.Rows) error {
			_, err := scanPromoted(rows, &st.queues, func(k string) {
				st.keys, st.one = append(st.keys, k), append(st.one, false)
			}, nil)
			return err
		})
	}
	if len(dropKeys) > 0 {
		b.Queue(s.q(sqlSlotsDelete), dropKeys)
	}
	return t.send(ctx, b, true)
}

// Limits returns the stored limits sorted by name.
func (s *Store) Limits(ctx context.Context) ([]gate.Limit, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	ls, err := readLimits(ctx, s.pool, s.q(sqlLimitsAll))
	if err != nil {
		return nil, fmt.Errorf("limits: %w", err)
	}
	return ls, nil
}

// NameLimits returns the stored limits of key names, no per-key limit,
// sorted by name (see store.NameLimitsReader), through limits_of_names.
func (s *Store) NameLimits(ctx context.Context) ([]gate.Limit, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	ls, err := readLimits(ctx, s.pool, s.q(sqlLimitsOfNames))
	if err != nil {
		return nil, fmt.Errorf("name limits: %w", err)
	}
	return ls, nil
}

// RateLimits returns the stored rate limits sorted by name.
func (s *Store) RateLimits(ctx context.Context) ([]gate.RateLimit, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, s.q(sqlRatesAll))
	if err != nil {
		return nil, fmt.Errorf("rate limits: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (gate.RateLimit, error) {
		var rl gate.RateLimit
		var periodUS int64
		var ns string
		err := r.Scan(&rl.Name, &rl.Limit, &periodUS, &rl.Burst, &rl.PerKey, &ns)
		rl.Period = time.Duration(periodUS) * time.Microsecond
		return rl, err
	})
	if err != nil {
		return nil, fmt.Errorf("rate limits: %w", err)
	}
	return out, nil
}

func readLimits(ctx context.Context, q querier, stmt string) ([]gate.Limit, error) {
	rows, err := q.Query(ctx, stmt)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (gate.Limit, error) {
		var l gate.Limit
		return l, r.Scan(&l.Name, &l.Limit, &l.Shards)
	})
}
