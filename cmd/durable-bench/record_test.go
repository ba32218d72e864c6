package main

import (
	"slices"
	"testing"
	"time"
)

func TestTimelineAveragesEachInterval(t *testing.T) {
	// Samples every 5 ms; intervals of 20 ms hold four of them, the last
	// interval what is left.
	samples := []int32{0, 0, 4, 4, 10, 10, 10, 11, 3}
	if got, want := timeline(samples, 20*time.Millisecond), []int{2, 10, 3}; !slices.Equal(got, want) {
		t.Fatalf("timeline = %v, want %v", got, want)
	}
	// An interval shorter than the sampling keeps every sample.
	if got, want := timeline(samples[:3], time.Millisecond), []int{0, 0, 4}; !slices.Equal(got, want) {
		t.Fatalf("timeline = %v, want %v", got, want)
	}
	if got := timeline(nil, 100*time.Millisecond); len(got) != 0 {
		t.Fatalf("timeline of no samples = %v, want none", got)
	}
}
