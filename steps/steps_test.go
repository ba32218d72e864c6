package steps

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestRetryPolicyDelay(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 4, InitialInterval: 10 * time.Millisecond, MaxInterval: 35 * time.Millisecond, Multiplier: 2, RandomizationFactor: -1}
	var got []time.Duration
	for a := 0; ; a++ {
		d, ok := p.Delay(a)
		if !ok {
			assert.Equal(t, 3, a, "4 attempts in all: retries after attempts 0, 1 and 2")
			break
		}
		got = append(got, d)
	}
	assert.Equal(t, []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 35 * time.Millisecond}, got, "exponential, capped")

	d, ok := RetryPolicy{}.Delay(0)
	assert.True(t, ok)
	assert.InDelta(t, float64(time.Second), float64(d), float64(200*time.Millisecond), "defaults: 1s ± 20%")
	_, ok = RetryPolicy{}.Delay(9)
	assert.False(t, ok, "default MaxAttempts is 10")
}

func TestRetryPolicyDelayWithDrawsJitterFromTheGivenSource(t *testing.T) {
	p := RetryPolicy{InitialInterval: time.Second, Multiplier: 2, RandomizationFactor: 0.5}
	at := func(r float64) time.Duration {
		d, ok := p.DelayWith(1, func() float64 { return r })
		assert.True(t, ok)
		return d
	}
	assert.Equal(t, time.Second, at(0), "the low end: 2s - 50%")
	assert.Equal(t, 2*time.Second, at(0.5), "the middle: the exponential interval")
	assert.Equal(t, 2500*time.Millisecond, at(0.75))

	seeded := func() []time.Duration {
		src := rand.New(rand.NewPCG(1, 1))
		var out []time.Duration
		for a := 0; a < 5; a++ {
			d, _ := RetryPolicy{}.DelayWith(a, src.Float64)
			out = append(out, d)
		}
		return out
	}
	first := seeded()
	assert.Equal(t, first, seeded(), "one seed, one sequence of delays")
	for a, d := range first {
		base := float64(time.Second << a)
		assert.InDelta(t, base, float64(d), 0.2*base, "attempt %d: default jitter is ±20%%", a)
	}

	d, _ := RetryPolicy{RandomizationFactor: -1}.DelayWith(0, func() float64 { panic("no jitter, no draw") })
	assert.Equal(t, time.Second, d)
}
