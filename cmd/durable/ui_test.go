package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/godurable/godurable/internal/browsertest"
)

// startUI runs `durable ui` from the built binary against s and returns
// the address it printed; the process is interrupted when t ends.
func startUI(t *testing.T, s *seeded, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, binary, append([]string{"ui", "-schema", s.schema}, args...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = append(os.Environ(), "DATABASE_URL="+s.url, "DURABLE_UI_TOKEN=")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cancel()
		err := cmd.Wait()
		assert.True(t, err == nil || ctx.Err() != nil, "durable ui exited: %v\n%s", err, stderr.String())
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case line, ok := <-lines:
		require.True(t, ok, "durable ui printed nothing: %s", stderr.String())
		_, addr, found := strings.Cut(line, " at ")
		require.True(t, found, "durable ui printed %q", line)
		return addr
	case <-time.After(30 * time.Second):
		t.Fatalf("durable ui did not start: %s", stderr.String())
	}
	return ""
}

func TestCLIUIRefusesNonLoopbackWithoutToken(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		_, errOut, code := runBinary(t, []string{"DURABLE_UI_TOKEN="}, "ui", "-addr", addr)
		assert.Equal(t, 2, code, addr)
		assert.Contains(t, errOut, "is not a loopback address: pass -token", addr)
	}
}

// TestCLIUITokenOffLoopback serves on every interface with a token: no
// request gets in without it.
func TestCLIUITokenOffLoopback(t *testing.T) {
	t.Parallel()
	s := seed(t)
	page := startUI(t, s, "-addr", "0.0.0.0:0", "-token", "t0ken")
	require.Contains(t, page, "?token=t0ken")
	base, _, _ := strings.Cut(page, "?")
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(base)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	resp, err = noRedirect.Get(base + "instances/" + s.awaiting + "?token=wrong")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	resp, err = noRedirect.Get(page)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode, "the token sets its cookie")
	req, _ := http.NewRequest(http.MethodGet, base+"instances/"+s.awaiting, nil)
	req.Header.Set("Authorization", "Bearer t0ken")
	resp, err = noRedirect.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestCLIUIReadOnlyInBrowser opens `durable ui -read-only` in Chromium: the
// instance pages have no action, and the overview says so.
func TestCLIUIReadOnlyInBrowser(t *testing.T) {
	t.Parallel()
	s := seed(t)
	page := startUI(t, s, "-read-only", "-addr", "127.0.0.1:0")
	ctx := browsertest.New(t)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS("#read-only"))))
	for _, id := range []string{s.awaiting, s.failed, s.acctWaiting[0]} {
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(page+"instances/"+id), chromedp.WaitVisible(chromedp.CSS("#no-actions"))))
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('form[method="post"], button, #actions').length`))
		require.NoError(t, err)
		assert.Zero(t, n, "no action on %s", id)
	}
	browsertest.Screenshot(t, ctx, "instance-read-only")
}
