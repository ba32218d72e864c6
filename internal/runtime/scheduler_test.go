package runtime

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An outage is logged once however many calls fail, a conflict between
// transactions is no outage, and a success within outageSettle of the last
// failure does not end it.
func TestStoreOutageLogsOnce(t *testing.T) {
	var buf bytes.Buffer
	o := &storeOutage{log: slog.New(slog.NewTextHandler(&buf, nil))}
	o.fail("claim", sqlErr("40P01"))
	require.False(t, o.isDown.Load(), "a deadlock is not an outage")
	require.Contains(t, buf.String(), "store conflict; retrying")
	buf.Reset()
	for range 5 {
		o.fail("claim", errors.New("connection refused"))
	}
	require.True(t, o.isDown.Load())
	require.Equal(t, 1, strings.Count(buf.String(), "store unavailable"))
	o.ok()
	require.True(t, o.isDown.Load(), "still down within outageSettle of the last failure")
	o.mu.Lock()
	o.lastFail = time.Now().Add(-2 * outageSettle)
	o.mu.Unlock()
	o.ok()
	require.False(t, o.isDown.Load())
	require.Contains(t, buf.String(), "store available again")
	require.Contains(t, buf.String(), "failed_calls=5")
}

func TestLeaseMargin(t *testing.T) {
	require.Equal(t, 1500*time.Millisecond, leaseMargin(30*time.Second))
	require.Equal(t, 5*time.Millisecond, leaseMargin(50*time.Millisecond))
	require.Equal(t, time.Second, maintenanceLeaseTTL(100*time.Millisecond))
	require.Equal(t, 90*time.Second, maintenanceLeaseTTL(30*time.Second))
}
