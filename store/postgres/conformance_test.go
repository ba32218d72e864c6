package postgres_test

import (
	"testing"

	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/postgres"
	"github.com/godurable/godurable/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return newEnv(t).s
	})
}

// TestConformanceCopy runs the suite with every batch without unique keys
// inserted by the COPY path, whatever its size, so that the contract's
// insert rules (rounds, run_at, delays, notifications, validation) are
// checked against it too.
func TestConformanceCopy(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s := newEnv(t).s
		postgres.SetCopyInsertMin(s, 0)
		return s
	})
}
