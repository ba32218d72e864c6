package inflight

import (
	"sync"
	"testing"
)

func TestRecorderCountsOverlap(t *testing.T) {
	var r Recorder
	a1 := r.Enter("account:1", "fetch")
	a2 := r.Enter("account:1", "fetch")
	b := r.Enter("account:2", "apply")
	a1()
	a1() // a second call is a no-op
	a3 := r.Enter("account:1", "apply")
	n := r.Enter("", "wrap_up")
	a2()
	a3()
	b()
	n()

	if got := r.Max("account:1"); got != 2 {
		t.Errorf("Max(account:1) = %d, want 2", got)
	}
	if got := r.Entered("account:1"); got != 3 {
		t.Errorf("Entered(account:1) = %d, want 3", got)
	}
	if got := r.Max(NoKey); got != 1 {
		t.Errorf("Max(NoKey) = %d, want 1", got)
	}
	if got := r.Peak(); got != 4 {
		t.Errorf("Peak = %d, want 4", got)
	}
	if got := r.Steps("fetch"); got != 2 {
		t.Errorf("Steps(fetch) = %d, want 2", got)
	}
	if got := r.TotalSteps(); got != 5 {
		t.Errorf("TotalSteps = %d, want 5", got)
	}
	keys := r.Keys()
	want := []string{"account:1", "account:2", NoKey}
	if len(keys) != len(want) {
		t.Fatalf("Keys = %v, want %v", keys, want)
	}
	for i := range want {
		if keys[i] != want[i] {
			t.Fatalf("Keys = %v, want %v", keys, want)
		}
	}
}

func TestRecorderConcurrentUse(t *testing.T) {
	var r Recorder
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.Enter("k:1", "s")()
		}()
	}
	wg.Wait()
	if got := r.Entered("k:1"); got != 50 {
		t.Fatalf("Entered = %d, want 50", got)
	}
	if m := r.Max("k:1"); m < 1 || m > 50 {
		t.Fatalf("Max = %d, want 1..50", m)
	}
}
