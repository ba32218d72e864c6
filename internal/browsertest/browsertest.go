// Package browsertest drives a headless Chromium from tests (with
// github.com/chromedp/chromedp) and keeps screenshots of what it saw.
//
// The browser is found at $CHROMIUM_PATH, else as chromium,
// chromium-browser or google-chrome on PATH. When there is none the test is
// skipped, or fails when CI=true, so that CI never passes by skipping.
// Screenshots go to $UI_SCREENSHOT_DIR, else to durable-ui-screenshots in
// the system's temporary directory; they outlive the test run.
package browsertest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Timeout bounds one test's use of the browser.
const Timeout = 90 * time.Second

// Path returns the browser executable, or "" when none is installed.
func Path() string {
	if p := os.Getenv("CHROMIUM_PATH"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// New starts a headless browser for t, with a fresh profile and no
// network other than what the test serves, and returns the context of its
// first tab. The browser is closed when t ends.
func New(t *testing.T) context.Context {
	t.Helper()
	path := Path()
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("browsertest: no Chromium (CI=true, so this fails instead of skipping): " +
				"apt-get install -y chromium, or set CHROMIUM_PATH")
		}
		t.Skip("browsertest: no Chromium: apt-get install -y chromium, or set CHROMIUM_PATH")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1360, 900),
	}
	ctx, cancelTimeout := context.WithTimeout(context.Background(), Timeout)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
		cancelTimeout()
	})
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("browsertest: start %s: %v", path, err)
	}
	return bctx
}

// Dir is where screenshots go (created if needed).
func Dir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("UI_SCREENSHOT_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "durable-ui-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("browsertest: %v", err)
	}
	return dir
}

// Screenshot saves a PNG of the whole page as Dir/name.png and returns its path.
func Screenshot(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("browsertest: screenshot %s: %v", name, err)
	}
	p := filepath.Join(Dir(t), name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatalf("browsertest: %v", err)
	}
	t.Logf("screenshot: %s", p)
	return p
}
