package steps

import (
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
