// Package ui is the operator's web page for a godurable store: an overview
// of queues, gates, rate limits and warnings that refreshes itself, with
// the actions pause and resume of a queue, the explanation of one key, a
// list of instances and one instance with its history, inbox and the
// actions signal, cancel and retry.
//
// `durable ui` serves it from the CLI binary; a service mounts it on its own
// mux behind its own authentication:
//
//	mux.Handle("/durable/", ui.Handler(st, ui.Options{Prefix: "/durable", Engine: eng}))
//
// Every asset is embedded in the binary. Every value read from the store is
// escaped by html/template, the page's script and style come from the
// handler itself (a Content-Security-Policy forbids anything else), and
// every action is a POST that carries a CSRF token and asks for a
// confirmation first. Each page reads a bounded number of rows: the
// overview is one store Health call (bounded as store.Health documents),
// the stored queue policies and the paused queues; the instance list is a keyset page, and a
// filtered one looks at no more than Options.ScanLimit instances per page.
//
// Key ids appear on the pages (an operator looking for a key needs them)
// and nowhere else: the handler records no metrics and logs no key.
package ui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/godurable/godurable/durable"
	"github.com/godurable/godurable/store"
)

// Options configure a Handler. The zero value serves every page with the
// actions on, no token and a 5-second refresh.
type Options struct {
	// Prefix is the path the handler is mounted under, without a trailing
	// slash ("" for the root; "/durable" for mux.Handle("/durable/", h)).
	// Links and cookies are scoped to it.
	Prefix string
	// ReadOnly hides the actions (signal, cancel, retry, pause and resume
	// a queue) and refuses their POSTs with 403 Forbidden.
	ReadOnly bool
	// Token, when set, is required on every request: as the header
	// "Authorization: Bearer TOKEN", or as ?token=TOKEN once, which sets an
	// HttpOnly cookie and redirects to the same page without the token.
	// Leave it empty when the embedding service authenticates requests
	// itself.
	Token string
	// Refresh is how often the overview refreshes itself (default 5s).
	Refresh time.Duration
	// Engine, when set, adds what only a running engine knows to the
	// overview: its last reconciler sweep (the drift it repaired), its stale
	// outcomes and its deployment skew. Without it the overview says so.
	Engine *durable.Engine
	// CSRFKey signs the CSRF tokens (default: 32 random bytes per handler).
	// Give every replica behind one load balancer the same key.
	CSRFKey []byte
	// PageSize is the number of instances per page (default 50).
	PageSize int
	// ScanLimit is the most instances one page of the instance list looks
	// at when it filters (by workflow, status, queue or key; default
	// DefaultScanLimit): a page stops there even with few matches, says so,
	// and links to the next ones (see store.ListFilter.ScanLimit), so that a
	// rare key, queue or status never makes a page read the whole table.
	ScanLimit int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// DefaultScanLimit is Options.ScanLimit when it is zero.
const DefaultScanLimit = 10_000

// DefaultRefresh is the overview's refresh interval when Options.Refresh
// is zero.
const DefaultRefresh = 5 * time.Second

// server is the handler's state.
type server struct {
	st    store.Store
	opts  Options
	csrf  []byte
	pages *pages
	mux   *http.ServeMux
	snap  snapshot
}

const (
	tokenCookie = "durable_ui_token"
	csrfCookie  = "durable_ui_csrf"
	csrfField   = "csrf"
)

// Handler returns the web page for st. Mount it at opts.Prefix + "/".
func Handler(st store.Store, opts Options) http.Handler {
	opts.Prefix = strings.TrimRight(opts.Prefix, "/")
	if opts.Refresh <= 0 {
		opts.Refresh = DefaultRefresh
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 50
	}
	if opts.ScanLimit <= 0 {
		opts.ScanLimit = DefaultScanLimit
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &server{st: st, opts: opts, csrf: opts.CSRFKey, pages: mustParsePages()}
	if len(s.csrf) == 0 {
		s.csrf = make([]byte, 32)
		_, _ = rand.Read(s.csrf)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.overview)
	mux.HandleFunc("GET /live", s.overviewLive)
	mux.HandleFunc("GET /key", s.key)
	mux.HandleFunc("GET /instances", s.instances)
	mux.HandleFunc("GET /instances/{id}", s.instance)
	mux.HandleFunc("POST /instances/{id}/{action}", s.action)
	mux.HandleFunc("POST /queues/{action}", s.queueAction)
	files := http.FileServerFS(staticFS)
	mux.HandleFunc("GET /static/{file}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=300")
		files.ServeHTTP(w, r)
	})
	s.mux = mux
	return s
}

// ServeHTTP checks the token, sets the security headers and routes.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")

	path := r.URL.Path
	if s.opts.Prefix != "" {
		rest, ok := strings.CutPrefix(path, s.opts.Prefix)
		if !ok || (rest != "" && rest[0] != '/') {
			http.NotFound(w, r)
			return
		}
		if rest == "" {
			http.Redirect(w, r, s.opts.Prefix+"/", http.StatusFound)
			return
		}
		path = rest
	}
	if !s.authorized(w, r) {
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = path
	r2.URL.RawPath = ""
	s.mux.ServeHTTP(w, r2)
}

// authorized reports whether r carries the token (always, without one). A
// ?token= query that matches sets the cookie and redirects without it.
func (s *server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if s.opts.Token == "" {
		return true
	}
	if q := r.URL.Query().Get("token"); q != "" && r.Method == http.MethodGet && s.tokenMatches(q) {
		http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: q, Path: s.opts.Prefix + "/", HttpOnly: true,
			Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
		u := *r.URL
		v := u.Query()
		v.Del("token")
		u.RawQuery = v.Encode()
		http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
		return false
	}
	if auth, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && s.tokenMatches(auth) {
		return true
	}
	if c, err := r.Cookie(tokenCookie); err == nil && s.tokenMatches(c.Value) {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="durable ui"`)
	http.Error(w, "durable ui: a token is required: open the URL `durable ui` printed (it ends in ?token=...), "+
		"or send the header Authorization: Bearer TOKEN", http.StatusUnauthorized)
	return false
}

func (s *server) tokenMatches(got string) bool {
	a := sha256.Sum256([]byte(got))
	b := sha256.Sum256([]byte(s.opts.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// csrfToken returns the token the page's forms carry, setting the
// browser's CSRF cookie first when it has none. The token is the HMAC of
// the cookie's random value: a page on another site can neither read the
// cookie nor compute the token, and the cookie is SameSite=Strict besides.
func (s *server) csrfToken(w http.ResponseWriter, r *http.Request) string {
	var nonce string
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 32 {
		nonce = c.Value
	} else {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		nonce = hex.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: nonce, Path: s.opts.Prefix + "/", HttpOnly: true,
			Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	}
	return s.sign(nonce)
}

func (s *server) sign(nonce string) string {
	m := hmac.New(sha256.New, s.csrf)
	m.Write([]byte("durable-ui-csrf:" + nonce))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkCSRF reports whether a POST comes from one of this handler's forms:
// its csrf field is the signature of the browser's CSRF cookie, and the
// browser does not say the request comes from another site.
//
// A browser that sends Sec-Fetch-Site is believed on it (a reverse proxy
// that rewrites Host does not change it); an older one must send no Origin
// or the page's own.
func (s *server) checkCSRF(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		if site != "same-origin" && site != "none" {
			return false
		}
	} else if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" {
		return false
	}
	got := r.PostFormValue(csrfField)
	return got != "" && hmac.Equal([]byte(got), []byte(s.sign(c.Value)))
}

// IsLoopback reports whether addr (host:port, as for net.Listen) listens
// only on a loopback interface. An empty host listens on every interface.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// LoopbackHostsOnly wraps h so that it answers only requests whose Host is
// a loopback name or address (localhost, 127.0.0.1, [::1]), whatever the
// port: a page served without a token on 127.0.0.1 must not be readable by
// another site whose name a DNS rebinding points at 127.0.0.1.
func LoopbackHostsOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !IsLoopback(r.Host) {
			http.Error(w, "durable ui: this page answers only to localhost, 127.0.0.1 or [::1]", http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}
