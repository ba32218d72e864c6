package memory_test

import (
	"testing"

	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
	"github.com/godurable/godurable/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s := memory.New(memory.Options{})
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}
