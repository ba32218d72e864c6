package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/godurable/godurable/ui"
)

// serveUI serves the web page (package ui) until ctx is done.
func serveUI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ui", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on (host:port; port 0 picks a free one)")
	token := fs.String("token", "", "token every request must carry (default $DURABLE_UI_TOKEN); required off loopback")
	readOnly := fs.Bool("read-only", false, "turn the actions (signal, cancel, retry) off")
	refresh := fs.Duration("refresh", ui.DefaultRefresh, "how often the overview refreshes itself")
	if _, err := parse(fs, args, 0, 0, ""); err != nil {
		return err
	}
	if *token == "" {
		*token = os.Getenv("DURABLE_UI_TOKEN")
	}
	if !ui.IsLoopback(*addr) && *token == "" {
		return usagef("ui: %s is not a loopback address: pass -token (or set DURABLE_UI_TOKEN) so that only people "+
			"with the token can read the page and act, or listen on 127.0.0.1 and reach it through an SSH tunnel", *addr)
	}
	if *refresh < time.Second {
		return usagef("ui: -refresh must be at least 1s")
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("ui: %w", err)
	}
	defer closeStore()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("ui: %w", err)
	}
	var h http.Handler = ui.Handler(st, ui.Options{Token: *token, ReadOnly: *readOnly, Refresh: *refresh})
	if *token == "" {
		h = ui.LoopbackHostsOnly(h)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	page := "http://" + ln.Addr().String() + "/"
	if *token != "" {
		page += "?token=" + url.QueryEscape(*token)
	}
	mode := ""
	if *readOnly {
		mode = " (read-only)"
	}
	fmt.Fprintf(stdout, "durable ui: schema %q%s at %s\n", db.schema, mode, page)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("ui: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("ui: shutdown: %w", err)
	}
	return nil
}
