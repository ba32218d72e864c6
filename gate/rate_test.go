package gate

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRateLimitValidateDefaults(t *testing.T) {
	r := RateLimit{Name: "stripe", Limit: 10}
	require.NoError(t, r.Validate())
	require.Equal(t, time.Second, r.Period)
	require.Equal(t, 10, r.Burst)
	require.Equal(t, int64(1_000_000), r.TokenCredit())
	require.Equal(t, int64(10_000_000), r.Capacity())

	for _, bad := range []RateLimit{
		{Name: "", Limit: 1},
		{Name: "a:b", Limit: 1},
		{Name: "x", Limit: 0},
		{Name: "x", Limit: 1, Period: time.Microsecond},
		{Name: "x", Limit: 1, Period: time.Millisecond + time.Nanosecond},
		{Name: "x", Limit: 1, Burst: -1},
		{Name: "x", Limit: 1, Period: 1000 * time.Hour, Burst: 1 << 30},
	} {
		require.Error(t, bad.Validate(), "%+v", bad)
	}
}

func TestRateLimitRefillIsExact(t *testing.T) {
	r := RateLimit{Name: "x", Limit: 3, Period: time.Second, Burst: 2}
	require.NoError(t, r.Validate())
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	b := Bucket{Credit: 0, At: t0}
	// Refilling in many small steps gives exactly what one big step gives.
	small := b
	for i := 1; i <= 1000; i++ {
		small = r.Refill(small, t0.Add(time.Duration(i)*333*time.Microsecond+time.Duration(i)*7))
	}
	big := r.Refill(b, small.At)
	require.Equal(t, big.Credit, small.Credit)
	require.Equal(t, int64(0), r.Tokens(r.Refill(b, t0.Add(333_333*time.Microsecond))), "3 per second: the first token after 333,334µs")
	require.Equal(t, int64(1), r.Tokens(r.Refill(b, t0.Add(333_334*time.Microsecond))))
	require.Equal(t, r.Capacity(), r.Refill(b, t0.Add(time.Hour)).Credit, "never above burst")
	require.True(t, r.IsFull(b, t0.Add(time.Second)))
	require.False(t, r.IsFull(b, t0.Add(600*time.Millisecond)))

	// Time running backwards adds nothing.
	later := r.Refill(b, t0.Add(time.Second/3))
	require.Equal(t, later, r.Refill(later, t0))

	// Due is the first instant the bucket holds n tokens.
	due := r.Due(b, 2)
	require.Equal(t, int64(1), r.Tokens(r.Refill(b, due.Add(-time.Microsecond))))
	require.Equal(t, int64(2), r.Tokens(r.Refill(b, due)))
	require.Equal(t, b.At, r.Due(r.Full(t0), 1))
}

func TestRateLimitBucketScope(t *testing.T) {
	require.Equal(t, "stripe", RateLimit{Name: "stripe"}.BucketFor("stripe:acme"))
	require.Equal(t, "stripe:acme", RateLimit{Name: "stripe", PerKey: true}.BucketFor("stripe:acme"))
}

func TestRateLimitJSON(t *testing.T) {
	r := RateLimit{Name: "stripe", Limit: 100, Period: time.Minute, Burst: 5, PerKey: true}
	b, err := json.Marshal(r)
	require.NoError(t, err)
	require.JSONEq(t, `{"name":"stripe","limit":100,"period":"1m0s","burst":5,"per_key":true}`, string(b))
	var back RateLimit
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, r, back)
	require.NoError(t, json.Unmarshal([]byte(`{"name":"a","limit":1,"period":1000000}`), &back))
	require.Equal(t, time.Millisecond, back.Period)
	require.Error(t, json.Unmarshal([]byte(`{"name":"a","limit":1,"period":"soon"}`), &back))
}

func TestDiffRates(t *testing.T) {
	old, err := NewRateLimits([]RateLimit{{Name: "a", Limit: 1}, {Name: "b", Limit: 2}})
	require.NoError(t, err)
	new, err := NewRateLimits([]RateLimit{{Name: "b", Limit: 2, PerKey: true}, {Name: "c", Limit: 3}})
	require.NoError(t, err)
	changes := DiffRates(old, new)
	require.Len(t, changes, 3)
	require.Equal(t, "a", changes[0].Name)
	require.True(t, changes[0].OldSet)
	require.False(t, changes[0].NewSet)
	require.Equal(t, "b", changes[1].Name)
	require.True(t, changes[1].New.PerKey)
	require.Empty(t, DiffRates(new, new))
	w := changes[2].LiveWarning(7)
	require.Equal(t, LiveKeysChanged, w.Kind)
	require.Equal(t, int64(7), w.Live)
	require.Contains(t, w.Message, `"c"`)
	_, err = NewRateLimits([]RateLimit{{Name: "a", Limit: 1}, {Name: "a", Limit: 2}})
	require.Error(t, err)
}

func TestRateLimitRescaleKeepsTokens(t *testing.T) {
	from := RateLimit{Name: "x", Limit: 10, Period: time.Second}
	to := RateLimit{Name: "x", Limit: 10, Period: time.Minute, Burst: 3}
	require.NoError(t, from.Validate())
	require.NoError(t, to.Validate())
	at := time.Unix(0, 0)
	b := to.Rescale(Bucket{Credit: 2_500_000, At: at}, from) // 2.5 tokens
	require.Equal(t, int64(2), to.Tokens(b))
	require.Equal(t, at, b.At)
	require.Equal(t, to.Capacity(), to.Rescale(Bucket{Credit: from.Capacity()}, from).Credit, "clamped to the new burst")
	huge := RateLimit{Name: "x", Limit: 1, Period: 1000 * time.Hour, Burst: 1000}
	require.NoError(t, huge.Validate())
	require.Equal(t, huge.Capacity(), huge.Rescale(Bucket{Credit: 1 << 61}, RateLimit{Name: "x", Limit: 1, Period: time.Millisecond}).Credit)
}
