package postgres_test

import (
	"testing"

	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return newEnv(t).s
	})
}
