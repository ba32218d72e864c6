package durable

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/godurable/godurable/store"
)

// queueMarkInterval is how often a running engine records the queues it
// works (store.Store.MarkQueuesWorked): several times within
// store.QueueWorkedWithin, so that a mark lost to a slow store does not
// make a queue look abandoned, and seldom enough to cost nothing. The
// claims themselves never write the record.
const queueMarkInterval = 10 * time.Second

// workedQueuesTTL is how long the engine's insert checks reuse the record
// of worked queues before reading it again.
const workedQueuesTTL = 5 * time.Second

// queueWatch is what an engine knows about the queues it inserts into and
// works: when it last marked its own, the fleet's record as last read, and
// the queues it has already warned about.
type queueWatch struct {
	mu       sync.Mutex
	lastMark time.Time // the engine's clock
	worked   map[string]time.Duration
	readAt   time.Time // wall clock; zero: never read
	warned   map[string]bool

	// stop ends the mark loop of a started engine; done is closed when it
	// has returned.
	stop context.CancelFunc
	done chan struct{}
}

// warnOnce reports whether the warning called id is new, and records it.
func (w *queueWatch) warnOnce(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.warned[id] {
		return false
	}
	if w.warned == nil {
		w.warned = map[string]bool{}
	}
	w.warned[id] = true
	return true
}

func (w *queueWatch) hasWarned(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.warned[id]
}

// ownQueues are the queues of Config.Queues, sorted.
func (e *Engine) ownQueues() []string { return slices.Sorted(maps.Keys(e.cfg.Queues)) }

// warnForeignQueue logs, once per queue, that def's queue is not one this
// engine works: its instances wait for another engine.
func (e *Engine) warnForeignQueue(def *definition) {
	if _, ok := e.cfg.Queues[def.queue]; ok || !e.queues.warnOnce("register/"+def.queue) {
		return
	}
	e.log.Warn("workflow registered on a queue this engine does not work: its instances wait for an engine whose Config.Queues has the queue",
		"workflow", def.name, "queue", def.queue, "engine_queues", e.ownQueues())
}

// checkQueueWorked logs, once per queue, an insert (or a spawn, or a
// schedule's tick) into a queue that neither this engine works nor any
// engine of the fleet has recorded working within store.QueueWorkedWithin:
// its instances would wait in silence. An engine counts its own queues as
// worked whether or not it is started, so that a program may insert before
// Start; the record costs a store read at most every workedQueuesTTL, and
// nothing for the engine's own queues.
func (e *Engine) checkQueueWorked(queue, workflow string) {
	if _, ok := e.cfg.Queues[queue]; ok || e.queues.hasWarned("insert/"+queue) {
		return
	}
	worked, ok := e.workedQueues()
	if !ok {
		return
	}
	if since, found := worked[queue]; found && since <= store.QueueWorkedWithin {
		return
	}
	if e.queues.warnOnce("insert/" + queue) {
		e.log.Warn("inserting into a queue no engine has claimed from recently: its instances wait until an engine whose Config.Queues "+
			"has the queue runs (durable health lists it as a queue nobody works)",
			"queue", queue, "workflow", workflow, "within", store.QueueWorkedWithin, "engine_queues", e.ownQueues())
	}
}

// workedQueues returns the fleet's record of worked queues (how long since
// each was last worked), at most workedQueuesTTL old, or false when the
// store could not be read.
func (e *Engine) workedQueues() (map[string]time.Duration, bool) {
	w := &e.queues
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.readAt.IsZero() && time.Since(w.readAt) < workedQueuesTTL {
		return w.worked, w.worked != nil
	}
	w.readAt = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	list, err := e.st.WorkedQueues(ctx, e.storeNow())
	if err != nil {
		e.log.Debug("read the record of worked queues", "err", err)
		w.worked = nil
		return nil, false
	}
	w.worked = make(map[string]time.Duration, len(list))
	for _, q := range list {
		w.worked[q.Queue] = q.Since
	}
	return w.worked, true
}

// markQueues records that this engine works its queues (see
// queueMarkInterval).
func (e *Engine) markQueues(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := e.st.MarkQueuesWorked(ctx, e.ownQueues(), e.storeNow()); err != nil {
		// The claims meet the same store: their errors are the ones worth
		// a warning.
		e.log.Debug("record the queues this engine works", "err", err)
		return
	}
	e.queues.mu.Lock()
	e.queues.lastMark = e.cfg.Clock.Now()
	e.queues.mu.Unlock()
}

// markQueuesIfDue marks this engine's queues when queueMarkInterval has
// passed on its clock since the last mark: Tick's form of the mark loop,
// on a fake clock as well as the wall clock.
func (e *Engine) markQueuesIfDue(ctx context.Context) {
	e.queues.mu.Lock()
	last := e.queues.lastMark
	e.queues.mu.Unlock()
	if last.IsZero() || e.cfg.Clock.Now().Sub(last) >= queueMarkInterval {
		e.markQueues(ctx)
	}
}

// startMarking starts the loop that marks this engine's queues every
// queueMarkInterval while it runs; stopMarking ends it.
func (e *Engine) startMarking() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	e.queues.mu.Lock()
	e.queues.stop, e.queues.done = cancel, done
	e.queues.mu.Unlock()
	go func() {
		defer close(done)
		t := time.NewTicker(queueMarkInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				e.markQueues(ctx)
			}
		}
	}()
}

func (e *Engine) stopMarking() {
	e.queues.mu.Lock()
	stop, done := e.queues.stop, e.queues.done
	e.queues.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	<-done
}

// PauseQueue pauses queue fleet-wide, in the store, so that engines
// started later and restarted ones keep it paused: no claim takes a row of
// it from the pause's commit on, and within one Config.PollInterval
// (at once when the store notifies) every engine has learned of it from a
// claim, or from a look at the paused queues, which an engine makes before
// it starts a row when its last claim or look began half an interval ago,
// and gives back the rows of the queue it holds claimed or reserved
// and has not started. So no step of the queue starts later than the
// pause's commit plus one poll interval. Steps already running finish and
// commit; timers, signals and children still make the queue's rows ready,
// and they wait. Health lists the paused queues with their waiting rows.
// Pausing a paused queue changes nothing; an empty name is
// store.DefaultQueue.
func (e *Engine) PauseQueue(ctx context.Context, queue string) error {
	return e.pauseQueue(ctx, queue, true)
}

// ResumeQueue lifts PauseQueue: engines claim the queue's rows again, in
// their usual order, from their next claim on (idle engines are notified
// when the store can). Resuming a queue that is not paused changes
// nothing.
func (e *Engine) ResumeQueue(ctx context.Context, queue string) error {
	return e.pauseQueue(ctx, queue, false)
}

func (e *Engine) pauseQueue(ctx context.Context, queue string, paused bool) error {
	if err := e.checkOpen(); err != nil {
		return err
	}
	changed, err := e.st.PauseQueue(ctx, queue, paused, e.storeNow())
	if err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	if changed {
		verb := "resumed"
		if paused {
			verb = "paused"
		}
		e.log.Info("queue "+verb, "queue", cmp.Or(queue, store.DefaultQueue))
	}
	return nil
}

// PausedQueues returns the paused queues of the fleet, sorted by name.
func (e *Engine) PausedQueues(ctx context.Context) ([]store.QueuePause, error) {
	if err := e.checkOpen(); err != nil {
		return nil, err
	}
	out, err := e.st.PausedQueues(ctx)
	if err != nil {
		return nil, fmt.Errorf("durable: %w", err)
	}
	return out, nil
}
