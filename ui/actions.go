package ui

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/godurable/godurable/store"
)

// confirmData is the confirmation page of an action: what will happen, and
// a form that does it.
type confirmData struct {
	Action string
	In     store.Instance
	// Question says what the action does to this instance.
	Question string
	// Name, Payload and Dedup are the signal to send (signal only).
	Name, Payload, Dedup string
	// Children counts the instance's children (cancel only): the page
	// then offers to cancel its descendants too (store.CancelTree).
	Children int
}

// mayChange is the gate of every action: it refuses, with a page saying
// why, a server in read-only mode and a form whose CSRF token does not
// match (from, the page to reload, is named in the refusal), and bounds the
// form's size. It reports whether the action may go on.
func (s *server) mayChange(w http.ResponseWriter, r *http.Request, from string) bool {
	if s.opts.ReadOnly {
		s.render(w, r, http.StatusForbidden, "message", "layout.html", page{Title: "Read-only",
			D: "This page is read-only: actions are turned off (durable ui -read-only)."})
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	if !s.checkCSRF(r) {
		s.render(w, r, http.StatusForbidden, "message", "layout.html", page{Title: "Refused",
			D: "Refused: the form's CSRF token is missing or does not match this browser. Reload " + from + " and try again."})
		return false
	}
	return true
}

// action runs signal, cancel or retry. A POST without confirm=yes changes
// nothing: it shows a confirmation page whose form posts confirm=yes.
func (s *server) action(w http.ResponseWriter, r *http.Request) {
	act := r.PathValue("action")
	if act != "signal" && act != "cancel" && act != "retry" {
		http.NotFound(w, r)
		return
	}
	if !s.mayChange(w, r, "the instance page") {
		return
	}
	id := r.PathValue("id")
	ctx := r.Context()
	in, err := s.st.Get(ctx, id)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, "Instance", err)
		return
	}
	switch {
	case act == "retry" && in.Status != store.StatusFailed && in.Status != store.StatusCanceled:
		s.render(w, r, http.StatusConflict, "message", "layout.html", page{Title: "Retry",
			D: fmt.Sprintf("Nothing done: the instance is %s; only failed or canceled instances can be retried.", in.Status)})
		return
	case act != "retry" && in.Status.Terminal():
		s.render(w, r, http.StatusConflict, "message", "layout.html", page{Title: act,
			D: fmt.Sprintf("Nothing done: the instance is %s (terminal).", in.Status)})
		return
	}
	c := confirmData{Action: act, In: in}
	var payload json.RawMessage
	switch act {
	case "signal":
		c.Name, c.Payload, c.Dedup = r.PostFormValue("name"), r.PostFormValue("payload"), r.PostFormValue("dedup")
		if c.Name == "" {
			s.render(w, r, http.StatusBadRequest, "message", "layout.html", page{Title: "Signal", D: "A signal needs a name."})
			return
		}
		if c.Payload != "" {
			if !json.Valid([]byte(c.Payload)) {
				s.render(w, r, http.StatusBadRequest, "message", "layout.html", page{Title: "Signal",
					D: `The payload is not valid JSON (quote strings: "text").`})
				return
			}
			payload = json.RawMessage(c.Payload)
		}
		c.Question = fmt.Sprintf("Send signal %q to this %s instance?", c.Name, in.Status)
	case "cancel":
		c.Question = fmt.Sprintf("Cancel this instance? It is %s at step %q.", in.Status, in.Step)
		if in.Status == store.StatusExecuting {
			c.Question += " Its running step (worker " + in.Worker + ") is stopped at its next heartbeat and its outcome discarded."
		}
		kids, err := s.st.Children(ctx, id)
		if err != nil {
			s.fail(w, r, http.StatusInternalServerError, "Instance", err)
			return
		}
		c.Children = len(kids)
	case "retry":
		c.Question = fmt.Sprintf("Retry this %s instance from its step %q, attempt 0?", in.Status, in.Step)
	}
	if r.PostFormValue("confirm") != "yes" {
		s.render(w, r, http.StatusOK, "confirm", "layout.html", page{Title: "Confirm " + act, Nav: "instances", D: c})
		return
	}

	var did string
	switch act {
	case "signal":
		res, err := s.st.Signal(ctx, store.SignalRequest{InstanceID: id, Name: c.Name, Payload: payload, DedupKey: c.Dedup})
		if err != nil {
			s.actionFailed(w, r, act, err)
			return
		}
		switch {
		case res.Duplicate:
			did = "signal-duplicate"
		case res.Woke:
			did = "signal-woke"
		default:
			did = "signal-stored"
		}
	case "cancel":
		if r.PostFormValue("children") == "yes" {
			if _, err := store.CancelTree(ctx, s.st, id, time.Time{}); err != nil {
				s.actionFailed(w, r, act, err)
				return
			}
			did = "canceled-tree"
			break
		}
		if err := s.st.Cancel(ctx, id, time.Time{}); err != nil {
			s.actionFailed(w, r, act, err)
			return
		}
		did = "canceled"
	case "retry":
		if err := s.st.Retry(ctx, id, time.Time{}); err != nil {
			s.actionFailed(w, r, act, err)
			return
		}
		did = "retried"
	}
	http.Redirect(w, r, s.opts.Prefix+"/instances/"+url.PathEscape(id)+"?did="+did, http.StatusSeeOther)
}

func (s *server) actionFailed(w http.ResponseWriter, r *http.Request, act string, err error) {
	switch {
	case errors.Is(err, store.ErrTerminal):
		s.render(w, r, http.StatusConflict, "message", "layout.html", page{Title: act,
			D: "Nothing done: the instance is terminal (done, failed or canceled)."})
	case errors.Is(err, store.ErrDuplicate):
		s.render(w, r, http.StatusConflict, "message", "layout.html", page{Title: act,
			D: "Nothing done: another live instance holds its unique key."})
	default:
		s.fail(w, r, http.StatusInternalServerError, act, fmt.Errorf("%s: %w", act, err))
	}
}

// queueConfirmData is the confirmation page of a queue's pause or resume.
type queueConfirmData struct {
	Action, Queue string
	// Question says what the action does to the queue.
	Question string
}

// queueAction pauses or resumes the queue of the form's queue field,
// fleet-wide (store.Store.PauseQueue). A POST without confirm=yes changes
// nothing: it shows a confirmation page whose form posts confirm=yes.
func (s *server) queueAction(w http.ResponseWriter, r *http.Request) {
	act := r.PathValue("action")
	if act != "pause" && act != "resume" {
		http.NotFound(w, r)
		return
	}
	if !s.mayChange(w, r, "the overview") {
		return
	}
	q := r.PostFormValue("queue")
	if q == "" {
		s.render(w, r, http.StatusBadRequest, "message", "layout.html", page{Title: act, D: "Which queue? The form names none."})
		return
	}
	c := queueConfirmData{Action: act, Queue: q}
	if act == "pause" {
		c.Question = fmt.Sprintf("Pause queue %q? Every engine stops starting its steps at its next claim; steps running now finish, "+
			"and its rows wait until it is resumed. The pause is stored: restarts keep it.", q)
	} else {
		c.Question = fmt.Sprintf("Resume queue %q? Engines claim its waiting rows again, in their usual order.", q)
	}
	if r.PostFormValue("confirm") != "yes" {
		s.render(w, r, http.StatusOK, "queueconfirm", "layout.html", page{Title: "Confirm " + act, Nav: "overview", D: c})
		return
	}
	if _, err := s.st.PauseQueue(r.Context(), q, act == "pause", time.Time{}); err != nil {
		if errors.Is(err, store.ErrInvalid) {
			s.render(w, r, http.StatusBadRequest, "message", "layout.html", page{Title: act, D: err.Error()})
			return
		}
		s.fail(w, r, http.StatusInternalServerError, act, fmt.Errorf("%s queue: %w", act, err))
		return
	}
	s.snap.forget()
	http.Redirect(w, r, s.opts.Prefix+"/", http.StatusSeeOther)
}
