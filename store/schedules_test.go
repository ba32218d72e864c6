package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/store"
)

func TestSchedulesHealth(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	scs := []store.Schedule{
		{Name: "on-time", Cron: "@hourly", Anchor: t0},
		{Name: "late", Cron: "@hourly", Anchor: t0.Add(-3 * time.Hour), LastTick: t0.Add(-2 * time.Hour)},
		{Name: "paused", Cron: "@hourly", Anchor: t0.Add(-3 * time.Hour), Paused: true},
		{Name: "broken", Cron: "every hour", Anchor: t0},
	}
	hs := store.SchedulesHealth(scs, t0.Add(30*time.Minute))
	require.Len(t, hs, 4)
	require.Equal(t, t0.Add(time.Hour), *hs[0].NextFire)
	require.False(t, hs[0].Late)
	require.Equal(t, t0.Add(-time.Hour), *hs[1].NextFire, "overdue: the first due tick")
	require.True(t, hs[1].Late)
	require.Equal(t, t0.Add(-2*time.Hour), *hs[1].LastTick)
	require.True(t, hs[2].Paused)
	require.False(t, hs[2].Late, "a paused schedule is never late")
	require.Nil(t, hs[2].NextFire, "nothing fires until it is resumed")
	require.Nil(t, hs[3].NextFire)
	require.Contains(t, hs[3].Error, `cron "every hour"`)
}
