package durable_test

import (
	"testing"
	"time"

	"github.com/godurable/godurable/internal/enginetest"
	"github.com/godurable/godurable/store"
	"github.com/godurable/godurable/store/memory"
)

func TestMaxActiveAcrossEngines(t *testing.T) {
	st := memory.New(memory.Options{})
	enginetest.MaxActiveAcrossEngines(t, func() store.Store { return st })
}

func TestRateLimitAcrossEngines(t *testing.T) {
	st := memory.New(memory.Options{})
	enginetest.RateAcrossEngines(t, func() store.Store { return st }, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
}

func TestWakesWithoutPolling(t *testing.T) {
	enginetest.WakesWithoutPolling(t, func() store.Store { return memory.New(memory.Options{}) })
}

func TestClaimsOncePerRow(t *testing.T) {
	enginetest.ClaimsOncePerRow(t, func() store.Store { return memory.New(memory.Options{}) })
}

func TestClaimingOnlyWhileClaimsComeBackFull(t *testing.T) {
	enginetest.ClaimingOnlyWhileClaimsComeBackFull(t, func() store.Store { return memory.New(memory.Options{}) })
}

func TestGateSpreadsOverTheFleet(t *testing.T) {
	st := memory.New(memory.Options{})
	enginetest.GateSpreadsOverTheFleet(t, func() store.Store { return st })
}

func TestClaimedRowsDoNotWaitBehindChains(t *testing.T) {
	enginetest.ClaimedRowsDoNotWaitBehindChains(t, func() store.Store { return memory.New(memory.Options{}) })
}

func TestCancelOfAReservationMeansItNeverStarts(t *testing.T) {
	st := memory.New(memory.Options{})
	enginetest.CancelOfAReservationMeansItNeverStarts(t, func() store.Store { return st })
}

func TestPerKeyLimitLive(t *testing.T) {
	st := memory.New(memory.Options{})
	enginetest.PerKeyLimitLive(t, func() store.Store { return st })
}

func TestPerKeyLimitLiveSeveralKeys(t *testing.T) {
	st := memory.New(memory.Options{})
	enginetest.PerKeyLimitLiveSeveralKeys(t, func() store.Store { return st })
}
