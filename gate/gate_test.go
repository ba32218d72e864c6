package gate

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	k, err := Parse("stripe:acct:42")
	require.NoError(t, err)
	assert.Equal(t, "stripe", k.Name())
	assert.Equal(t, "acct:42", k.ID(), "the id keeps every ':' after the first")
	assert.Equal(t, "stripe:acct:42", k.String())

	zero, err := Parse("")
	require.NoError(t, err)
	assert.True(t, zero.IsZero())
	assert.Equal(t, "", zero.String())

	for _, bad := range []string{"nocolon", ":id", "name:", "na\x00me:1", "name:\x07", "name:\xff", strings.Repeat("a", 200) + ":" + strings.Repeat("b", 60)} {
		_, err := Parse(bad)
		assert.ErrorIs(t, err, ErrInvalidKey, "%q", bad)
	}
	_, err = New("a", "b", Intent("weird"))
	assert.ErrorIs(t, err, ErrInvalidKey)
	for _, k := range []ConcurrencyKey{Key("", "x"), Identity("account", ""), Gate("a:b", "1")} {
		assert.ErrorIs(t, k.Err(), ErrInvalidKey, "no panic on bad parts: the key carries the error")
		assert.False(t, k.IsZero(), "an invalid key is not the zero key")
		_, err := Parse(k.String())
		assert.Error(t, err, "an invalid key's text parses to no valid key")
	}
	assert.NoError(t, Key("a", "1").Err())
	assert.NoError(t, ConcurrencyKey{}.Err())
}

func TestIntentConstructors(t *testing.T) {
	assert.Equal(t, IdentityIntent, Identity("order", "1").Intent())
	assert.Equal(t, GateIntent, Gate("stripe", "1").Intent())
	assert.Equal(t, Unspecified, Key("x", "1").Intent())
}

func TestLimitsLookupAndK(t *testing.T) {
	ls, err := NewLimits([]Limit{{Name: "stripe", Limit: 100, Shards: 4}, {Name: "openai", Limit: 3}})
	require.NoError(t, err)
	assert.Equal(t, 100, ls.K("stripe:t1"))
	assert.Equal(t, 3, ls.K("openai:x"))
	assert.Equal(t, 1, ls.K("account:7"), "unconfigured names are K = 1")
	l, ok := ls.Lookup("openai")
	require.True(t, ok)
	assert.Equal(t, 1, l.Shards, "shards default to 1")
	assert.Equal(t, []string{"openai", "stripe"}, []string{ls.All()[0].Name, ls.All()[1].Name})

	for _, bad := range [][]Limit{
		{{Name: "", Limit: 1}}, {{Name: "a:", Limit: 1}}, {{Name: ":b", Limit: 1}}, {{Name: "a", Limit: 0}},
		{{Name: "a:b", Limit: 2, Shards: 3}}, {{Name: "a:b", Limit: 1}, {Name: "a:b", Limit: 2}},
		{{Name: "a", Limit: 2, Shards: 3}}, {{Name: "a", Limit: 1}, {Name: "a", Limit: 2}},
	} {
		_, err := NewLimits(bad)
		assert.Error(t, err, "%+v", bad)
	}
}

// TestLimitsFor: a key runs under its own limit, else its name's, else
// none; a per-key limit needs its name's in a stored set.
func TestLimitsFor(t *testing.T) {
	ls, err := NewLimits([]Limit{{Name: "stripe", Limit: 5}, {Name: "stripe:big", Limit: 50, Shards: 5}, {Name: "stripe:big:eu", Limit: 7}})
	require.NoError(t, err)
	require.NoError(t, ls.Validate())
	for _, c := range []struct {
		key, from string
		k         int
	}{
		{"stripe:big", "stripe:big", 50},
		{"stripe:big:eu", "stripe:big:eu", 7},
		{"stripe:small", "stripe", 5},
		{"stripe:bigger", "stripe", 5},
		{"stripe", "stripe", 5},
		{"account:1", "", 1},
	} {
		l, ok := ls.For(c.key)
		assert.Equal(t, c.from != "", ok, c.key)
		assert.Equal(t, c.from, l.Name, c.key)
		assert.Equal(t, c.k, ls.K(c.key), c.key)
	}
	l, _ := ls.For("stripe:big")
	assert.True(t, l.PerKey())
	assert.Equal(t, []int{10, 10, 10, 10, 10}, l.ShardCapacities(), "shards follow the per-key limit")
	assert.Equal(t, []Limit{{Name: "stripe", Limit: 5, Shards: 1}}, ls.Gates(), "gates are names only")
	_, ok := ls.Lookup("stripe:small")
	assert.False(t, ok, "Lookup is the exact entry")

	orphan, err := NewLimits([]Limit{{Name: "account:1", Limit: 3}})
	require.NoError(t, err, "one namespace may own a key's limit and another its name's")
	assert.ErrorIs(t, orphan.Validate(), ErrPerKeyWithoutGate)

	w, _ := NewLimits([]Limit{{Name: "stripe", Limit: 5}})
	assert.Equal(t, []Change{{Name: "stripe:big", OldK: 5, NewK: 50, NewSet: true}, {Name: "stripe:big:eu", OldK: 5, NewK: 7, NewSet: true}},
		Diff(w, ls), "a per-key change compares the key's K: its name's before")
	assert.Equal(t, []Change{{Name: "stripe:big", OldK: 50, NewK: 5, OldSet: true}, {Name: "stripe:big:eu", OldK: 7, NewK: 5, OldSet: true}},
		Diff(ls, w))
	assert.Contains(t, Change{Name: "stripe:big", OldK: 5, NewK: 50}.LiveWarning(3).Message, `for key "stripe:big"`)
}

func TestLiveCountSaysAtLeastAtTheCap(t *testing.T) {
	assert.Equal(t, "0", LiveCount(0))
	assert.Equal(t, "9999", LiveCount(LiveCountCap-1))
	assert.Equal(t, "at least 10000", LiveCount(LiveCountCap))
	c := Change{Name: "stripe", OldK: 5, NewK: 50}
	assert.Contains(t, c.LiveWarning(LiveCountCap).Message, "for at least 10000 live instance(s)")
	assert.Contains(t, c.LiveWarning(12).Message, "for 12 live instance(s)")
	r := RateChange{Name: "stripe", NewSet: true, New: RateLimit{Name: "stripe", Limit: 1, Period: 1e9}}
	assert.Contains(t, r.LiveWarning(LiveCountCap).Message, "affects at least 10000 live instance(s)")
}

func TestShardCapacities(t *testing.T) {
	assert.Equal(t, []int{3, 3, 2, 2}, Limit{Name: "x", Limit: 10, Shards: 4}.ShardCapacities())
	assert.Equal(t, []int{5}, Limit{Name: "x", Limit: 5}.ShardCapacities())
	for limit := 1; limit < 50; limit++ {
		for shards := 1; shards <= limit; shards++ {
			sum := 0
			for _, c := range (Limit{Limit: limit, Shards: shards}).ShardCapacities() {
				assert.GreaterOrEqual(t, c, 1)
				sum += c
			}
			assert.Equal(t, limit, sum)
		}
	}
}

func TestShardsFor(t *testing.T) {
	assert.Equal(t, 10, ShardsFor(1000, time.Millisecond, 100*time.Millisecond), "the seed's example")
	assert.Equal(t, 1, ShardsFor(10, time.Millisecond, time.Second))
	assert.Equal(t, 5, ShardsFor(5, 10*time.Millisecond, time.Millisecond), "never more shards than slots")
	assert.Equal(t, 1, ShardsFor(0, time.Millisecond, time.Millisecond))
}

func TestCheckWarnings(t *testing.T) {
	ls, err := NewLimits([]Limit{{Name: "order", Limit: 5}})
	require.NoError(t, err)
	w, found := ls.Check(Identity("order", "42"))
	require.True(t, found)
	assert.Equal(t, IdentityCaptured, w.Kind)
	assert.Equal(t, "order", w.Name)
	assert.NotContains(t, w.Message, "42", "warnings never carry key ids")
	assert.True(t, errors.Is(w.Error(), ErrPrefixCapture))

	w, found = ls.Check(Gate("stripe", "t1"))
	require.True(t, found)
	assert.Equal(t, GateWithoutLimit, w.Kind)

	_, found = ls.Check(Identity("account", "1"))
	assert.False(t, found)
	_, found = ls.Check(Gate("order", "1"))
	assert.False(t, found)
	_, found = ls.Check(Key("order", "1"))
	assert.False(t, found, "no declared intent, no warning")
	_, found = ls.Check(ConcurrencyKey{})
	assert.False(t, found)
}

func TestDiff(t *testing.T) {
	old, _ := NewLimits([]Limit{{Name: "a", Limit: 2}, {Name: "b", Limit: 3}, {Name: "c", Limit: 4, Shards: 2}})
	cur, _ := NewLimits([]Limit{{Name: "a", Limit: 2}, {Name: "b", Limit: 5}, {Name: "c", Limit: 4, Shards: 4}, {Name: "d", Limit: 1}})
	changes := Diff(old, cur)
	var names []string
	for _, c := range changes {
		names = append(names, c.Name)
	}
	assert.Equal(t, []string{"b", "c", "d"}, names, "d: a configured limit of 1 is still a change of kind (counter vs index)")
	assert.Equal(t, 3, changes[0].OldK)
	assert.Equal(t, 5, changes[0].NewK)
	assert.Contains(t, changes[0].LiveWarning(7).Message, "7 live")
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"a:b", "stripe:acct:1", "", ":", "x", "a:\x00", "ü:ö"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("error %v does not wrap ErrInvalidKey", err)
			}
			return
		}
		if s == "" {
			if !k.IsZero() {
				t.Fatal("empty string must parse to the zero key")
			}
			return
		}
		if k.String() != s {
			t.Fatalf("round trip: %q -> %q", s, k.String())
		}
		if NameOf(s) != k.Name() || strings.Contains(k.Name(), ":") || k.ID() == "" || len(s) > MaxKeyLength {
			t.Fatalf("bad parse of %q: %q / %q", s, k.Name(), k.ID())
		}
		again, err := Parse(k.String())
		if err != nil || again != k {
			t.Fatalf("reparse of %q: %v", s, err)
		}
	})
}

func FuzzLimitMatch(f *testing.F) {
	f.Add("stripe", "stripe:1")
	f.Add("order", "orders:1")
	f.Add("0:0", "0:0")
	f.Add("stripe:acct", "stripe:acct_big")
	f.Fuzz(func(t *testing.T, name, key string) {
		ls, err := NewLimits([]Limit{{Name: name, Limit: 7}})
		if err != nil {
			return
		}
		k, err := Parse(key)
		if err != nil || k.IsZero() {
			return
		}
		// A limit applies to a key whose name is exactly the limit's
		// name, or, for a per-key limit, to exactly that key.
		want := 1
		if k.Name() == name || k.String() == name {
			want = 7
		}
		if got := ls.K(key); got != want {
			t.Fatalf("K(%q) under limit %q = %d, want %d (a limit matches a key's name or the whole key exactly, never by prefix)", key, name, got, want)
		}
	})
}
