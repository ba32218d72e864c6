package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// holdTracer measures, for each transaction of the limit change, how long
// it held gate counters: from the start of its first statement or batch
// that names key_slots to the end of its commit or rollback. That bounds
// from above what the change costs a gate step: a credit waits for the
// counters at most that long, and a claim skips them meanwhile. The
// counter probe (counterProbe) sees every wait, the change's among them,
// so its figure includes the claims' and credits' own.
type holdTracer struct {
	mu    sync.Mutex
	since map[*pgx.Conn]time.Time
	holds []time.Duration
}

func newHoldTracer() *holdTracer { return &holdTracer{since: map[*pgx.Conn]time.Time{}} }

func (h *holdTracer) touch(conn *pgx.Conn, sql string) {
	if !strings.Contains(sql, "key_slots") {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.since[conn]; !ok {
		h.since[conn] = time.Now()
	}
}

// TraceQueryStart notes a statement that names key_slots.
func (h *holdTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	h.touch(conn, data.SQL)
	return ctx
}

// TraceQueryEnd ends the hold of the connection's transaction at its
// commit or rollback.
func (h *holdTracer) TraceQueryEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	tag := strings.ToLower(data.CommandTag.String())
	if tag != "commit" && tag != "rollback" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if t, ok := h.since[conn]; ok {
		h.holds = append(h.holds, time.Since(t))
		delete(h.since, conn)
	}
}

// TraceBatchStart notes a batch with a statement that names key_slots.
func (h *holdTracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	for _, q := range data.Batch.QueuedQueries {
		h.touch(conn, q.SQL)
	}
	return ctx
}

// TraceBatchQuery ends the hold of the connection's transaction at a
// commit or rollback sent in a batch.
func (h *holdTracer) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	h.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{CommandTag: data.CommandTag, Err: data.Err})
}

// TraceBatchEnd does nothing: the transaction's end is the hold's.
func (h *holdTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// result describes the holds: how many transactions held counters, the
// longest and the median.
func (h *holdTracer) result() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.holds) == 0 {
		return "no transaction of the change held gate counters"
	}
	hs := slices.Clone(h.holds)
	slices.Sort(hs)
	return fmt.Sprintf("gate counters held by the change: %d transactions, longest %v, median %v (from the first statement naming key_slots to the commit)",
		len(hs), hs[len(hs)-1].Round(100*time.Microsecond), hs[len(hs)/2].Round(100*time.Microsecond))
}
