package tzdata_test

import (
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/periodic"
	_ "github.com/godurable/godurable/periodic/tzdata"
)

// childEnv marks the run of this test binary inside a mount namespace
// where /usr/share/zoneinfo is empty (see TestZonesResolveWithoutTheSystemDatabase).
const childEnv = "GODURABLE_TZDATA_CHILD"

// TestZonesResolveWithoutTheSystemDatabase runs the test binary again with
// empty directories mounted over /usr/share/zoneinfo and over the copy of
// the database in the Go installation ($GOROOT/lib/time, which a test
// binary would read last; a program in a container has no $GOROOT), in a
// private mount namespace (as root), as in a container without the
// database: a schedule's time zone resolves from the embedded one.
func TestZonesResolveWithoutTheSystemDatabase(t *testing.T) {
	if os.Getenv(childEnv) == "1" {
		entries, err := os.ReadDir("/usr/share/zoneinfo")
		require.NoError(t, err)
		require.Empty(t, entries, "the system database is hidden")
		_, err = os.Stat(filepath.Join(build.Default.GOROOT, "lib", "time", "zoneinfo.zip"))
		require.True(t, os.IsNotExist(err), "Go's own copy is hidden: %v", err)
		spec, err := periodic.Parse("0 9 * * *", "America/New_York")
		require.NoError(t, err, "resolved from the embedded database")
		next := spec.Next(time.Date(2030, 7, 1, 0, 0, 0, 0, time.UTC))
		require.Equal(t, time.Date(2030, 7, 1, 13, 0, 0, 0, time.UTC), next.UTC(), "09:00 EDT")
		return
	}
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("hiding the system time zone database needs Linux and root (a private mount namespace)")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("hiding the system time zone database needs unshare (util-linux)")
	}
	if _, err := os.Stat("/usr/share/zoneinfo"); err != nil {
		t.Skip("no system time zone database to hide")
	}
	empty := t.TempDir()
	goTime := filepath.Join(build.Default.GOROOT, "lib", "time") // where package time looks last
	mountOverGo := ""
	if _, err := os.Stat(goTime); err == nil {
		mountOverGo = `mount --bind "$1" "$3" && `
	}
	cmd := exec.Command(unshare, "-m", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" /usr/share/zoneinfo && `+mountOverGo+
			`exec "$2" -test.run '^TestZonesResolveWithoutTheSystemDatabase$' -test.count=1`,
		"sh", empty, os.Args[0], goTime)
	cmd.Env = append(os.Environ(), childEnv+"=1", "ZONEINFO=")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "PASS")
}
