package enginepg

import (
	"testing"

	"github.com/godurable/godurable/internal/enginetest"
	"github.com/godurable/godurable/store"
)

func TestWallClockPostgres(t *testing.T) {
	enginetest.WallClock(t, enginetest.WallClockOptions{
		NewStore: func(t *testing.T) store.Store {
			s, _ := pgStore(t)
			return s
		},
		Reserves: true,
	})
}
