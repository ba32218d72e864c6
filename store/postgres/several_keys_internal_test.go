package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/gate"
	"github.com/godurable/godurable/internal/admission"
	"github.com/godurable/godurable/store"
)

// TestAdmitReadsAKeyOfSeveralAfterItsLock: the window reads whether a K =
// 1 key is busy before it tries the key's lock, for its rows of one key,
// and sqlClaim checks that read again for a row's key column only. A
// claim whose window read acct:a as free, and then took its lock after
// another claim made acct:a's holder executing and committed, must not
// admit a row of several keys that holds acct:a as another key: admit
// reads acct:a again under the lock; otherwise a row of one key and a row
// holding the same key as its other key run at once.
func TestAdmitReadsAKeyOfSeveralAfterItsLock(t *testing.T) {
	ctx := context.Background()
	s := newInternalStore(t)
	holder := uuid.NewString()
	_, err := s.Insert(ctx, []store.NewInstance{{ID: holder, Workflow: "wf", Queue: "q", Step: "s", Key: "acct:a"}})
	require.NoError(t, err)
	res, err := s.Claim(ctx, store.ClaimRequest{Queue: "q", Worker: "w", Limit: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1, "acct:a's holder executes, committed")

	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	// What the window of such a claim leaves: acct:a tried and had (its
	// row of one key read acct:a as free in the window's snapshot).
	_, err = tx.Exec(ctx, s.q(sqlKeyTryLock), []string{"acct:a"}, s.keySalt)
	require.NoError(t, err)
	multi, one := uuid.NewString(), uuid.NewString()
	cc := &claimContext{now: time.Now(), limit: 10, queue: "q", busyOne: map[string]bool{}, tried: map[string]bool{"acct:a": true},
		candidates: []admission.Candidate{
			{ID: multi, Key: "acct:0", Also: []admission.Need{{Key: "acct:a"}}},
			{ID: one, Key: "acct:a"},
		},
		multi: map[string]multiRow{multi: {key: store.KeyRef{Key: "acct:0"}, others: []store.KeyRef{{Key: "acct:a"}}}},
	}
	plan, _, err := s.admit(ctx, tx, cc, false)
	require.NoError(t, err)
	require.Empty(t, plan.Admitted, "acct:a is held")
	require.Equal(t, "acct:a", plan.BlockedOn[multi], "blocked on acct:a, read busy under its lock")
}

// TestAdmitLeavesAKeyOfTwoLimitsReady: a claim's window reads the limit of
// a key its rows wait in line for, and sqlKeyLimits, a later statement,
// reads it for the rows that hold it as another key; a limit change
// committed in between gives the key two limits in one claim. Its rows
// are then left ready for the next claim, whatever order they come in:
// decided under the limit the key no longer has, a row would be admitted
// over a lowered limit (the counters not yet reshaped) or blocked by a
// raised one (with nothing left to promote it until a slot frees).
func TestAdmitLeavesAKeyOfTwoLimitsReady(t *testing.T) {
	for _, tc := range []struct {
		name         string
		stored, then gate.Limit // the limit stored now, and the one the window read
	}{
		{"lowered", gate.Limit{Name: "stripe:big", Limit: 5, Shards: 1}, gate.Limit{Name: "stripe:big", Limit: 50, Shards: 5}},
		{"raised", gate.Limit{Name: "stripe:big", Limit: 50, Shards: 5}, gate.Limit{Name: "stripe", Limit: 5, Shards: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := newInternalStore(t)
			_, err := s.pool.Exec(ctx, s.q(`INSERT INTO {schema}.limits (name, "limit", shards) VALUES ('stripe', 5, 1), ($1, $2, $3)`),
				tc.stored.Name, tc.stored.Limit, tc.stored.Shards)
			require.NoError(t, err)
			// Five slots in use, over counters not yet reshaped for a
			// lowering (five shards of ten) or already reshaped for a raise.
			_, err = s.pool.Exec(ctx, s.q(`INSERT INTO {schema}.key_slots (key, shard, capacity, available)
				SELECT 'stripe:big', sh, 10, CASE WHEN sh = 0 THEN 5 ELSE 10 END FROM generate_series(0, 4) sh`))
			require.NoError(t, err)

			tx, err := s.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			stored, then := tc.stored, tc.then
			line, other := uuid.NewString(), uuid.NewString()
			cc := &claimContext{now: time.Now(), limit: 10, queue: "q", busyOne: map[string]bool{}, tried: map[string]bool{},
				candidates: []admission.Candidate{
					// Holds stripe:big as another key: its limit read by sqlKeyLimits, now.
					{ID: other, Key: "acct:b", Also: []admission.Need{{Key: "stripe:big", Gate: &stored}}},
					// Waits in stripe:big's line: its limit read by the window, before.
					{ID: line, Key: "stripe:big", Gate: &then, Also: []admission.Need{{Key: "acct:a"}}},
				},
				multi: map[string]multiRow{
					other: {key: store.KeyRef{Key: "acct:b"}, others: []store.KeyRef{{Key: "stripe:big", Intent: gate.GateIntent}}},
					line:  {key: store.KeyRef{Key: "stripe:big", Intent: gate.GateIntent}, others: []store.KeyRef{{Key: "acct:a"}}},
				},
			}
			plan, _, err := s.admit(ctx, tx, cc, false)
			require.NoError(t, err)
			require.Empty(t, plan.BlockedOn, "nothing is blocked under a limit read two ways")
			require.Empty(t, plan.Admitted, "nothing is admitted under a limit read two ways")
		})
	}
}

// TestRefusedByFullGates: walked in claim order, rows of several keys
// take their gates' free slots as read; the rows of several keys a gate
// has no slot left for are refused, a row of one gate key takes a slot
// too, and a gate with no counters read refuses nothing; the window fills
// a gate when its rows leave that gate no slot.
func TestRefusedByFullGates(t *testing.T) {
	g := &gate.Limit{Name: "api", Limit: 2, Shards: 1}
	row := func(id, key string, gated bool, also ...string) admission.Candidate {
		c := admission.Candidate{ID: id, Key: key}
		if gated {
			c.Gate = g
		}
		for _, k := range also {
			n := admission.Need{Key: k}
			if strings.HasPrefix(k, "api:") {
				n.Gate = g
			}
			c.Also = append(c.Also, n)
		}
		return c
	}
	window := []admission.Candidate{
		row("a", "acct:1", false, "api:x"),
		row("b", "api:x", true), // one key: takes the last free slot
		row("c", "acct:2", false, "api:x"),
		row("d", "api:x", true, "acct:3"),  // in the gate's line
		row("e", "acct:4", false, "api:y"), // api:y was not read
		row("f", "acct:5", false),
	}
	refused, filled := refusedByFullGates(window, map[string]int{"api:x": 2})
	require.Equal(t, map[string]bool{"c": true, "d": true}, refused)
	require.True(t, filled)
	refused, filled = refusedByFullGates(window, nil)
	require.Nil(t, refused, "nothing read, nothing refused")
	require.False(t, filled)
	refused, filled = refusedByFullGates(window, map[string]int{"api:x": 5, "api:y": 1})
	require.Nil(t, refused)
	require.True(t, filled, "the window takes api:y's last slot")
	refused, filled = refusedByFullGates(window, map[string]int{"api:x": 5, "api:y": 2})
	require.Nil(t, refused)
	require.False(t, filled, "slots to spare in both")
}
