package main

import (
	"context"
	"fmt"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// observer gathers the evidence of what limits a scenario while it runs:
// the CPU the bench process and its PostgreSQL backends used, how busy the
// machine was, what the backends were waiting on (sampled from
// pg_stat_activity) and the bench process's live heap.
type observer struct {
	url, db string
	every   time.Duration
	profile string // path prefix of CPU profiles ("" none)
	scen    int
	part    int
	prof    *os.File

	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	waits   map[string]int
	samples int
	heapMax uint64
	t0      time.Time
	self0   time.Duration
	mach0   [2]uint64
	pgCPU0  map[int]time.Duration
	pgPids  map[int]bool
}

// observation is what an observer saw between start and stop.
type observation struct {
	Wall        time.Duration  `json:"wall_ns"`
	BenchCPU    time.Duration  `json:"bench_cpu_ns"`
	PGCPU       time.Duration  `json:"pg_cpu_ns"`
	MachineBusy float64        `json:"machine_busy"` // fraction of all cores, any process
	HeapMaxMB   float64        `json:"heap_max_mb"`
	Waits       map[string]int `json:"waits"` // share of sampled backend-time, in percent
}

func newObserver(url, db string, every time.Duration) *observer {
	return &observer{url: url, db: db, every: every}
}

func (o *observer) start(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, o.url)
	if err != nil {
		return err
	}
	ctx, o.cancel = context.WithCancel(ctx)
	o.waits, o.samples, o.heapMax = map[string]int{}, 0, 0
	o.pgPids, o.pgCPU0 = map[int]bool{}, map[int]time.Duration{}
	if o.profile != "" && o.prof == nil {
		o.part++
		f, err := os.Create(fmt.Sprintf("%s-s%d-%d.prof", o.profile, o.scen, o.part))
		if err == nil && pprof.StartCPUProfile(f) == nil {
			o.prof = f
		}
	}
	o.t0, o.self0, o.mach0 = time.Now(), selfCPU(), machineCPU()
	o.wg.Add(2)
	go func() {
		defer o.wg.Done()
		defer func() { _ = conn.Close(context.Background()) }()
		if o.every > 0 {
			o.sampleWaits(ctx, conn)
		}
	}()
	go func() {
		defer o.wg.Done()
		o.sampleHeap(ctx)
	}()
	return nil
}

func (o *observer) stop() observation {
	o.cancel()
	o.wg.Wait()
	if o.prof != nil {
		pprof.StopCPUProfile()
		_ = o.prof.Close()
		o.prof = nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	wall := time.Since(o.t0)
	m1 := machineCPU()
	busy := 0.0
	if tot := m1[1] - o.mach0[1]; tot > 0 {
		busy = float64(m1[0]-o.mach0[0]) / float64(tot)
	}
	var pg time.Duration
	for pid, start := range o.pgCPU0 {
		if end, ok := procCPU(pid); ok { // a backend that exited meanwhile is not counted
			pg += end - start
		}
	}
	obs := observation{Wall: wall, BenchCPU: selfCPU() - o.self0, PGCPU: pg, MachineBusy: busy,
		HeapMaxMB: float64(o.heapMax) / (1 << 20), Waits: map[string]int{}}
	total := 0
	for _, n := range o.waits {
		total += n
	}
	for k, n := range o.waits {
		if pct := n * 100 / max(total, 1); pct > 0 {
			obs.Waits[k] = pct
		}
	}
	return obs
}

// record adds one sample: the wait states seen, and the first CPU reading
// of backends seen for the first time (stop reads the end).
func (o *observer) record(states []string, pids map[int]bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, k := range states {
		o.waits[k]++
	}
	o.samples++
	for pid := range pids {
		if o.pgPids[pid] {
			continue
		}
		if cpu, ok := procCPU(pid); ok {
			o.pgPids[pid] = true
			o.pgCPU0[pid] = cpu
		}
	}
}

// sampleWaits samples what the backends of the bench database do, and
// tracks their CPU time from /proc (PostgreSQL runs on the same machine).
func (o *observer) sampleWaits(ctx context.Context, conn *pgx.Conn) {
	t := time.NewTicker(o.every)
	defer t.Stop()
	for {
		rows, err := conn.Query(ctx, `
SELECT pid, state, coalesce(wait_event_type, ''), coalesce(wait_event, '')
FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'`, o.db)
		if err == nil {
			var pid int
			var state, wt, we string
			seen := map[int]bool{}
			var local []string
			_, err = pgx.ForEachRow(rows, []any{&pid, &state, &wt, &we}, func() error {
				seen[pid] = true
				switch {
				case state == "active" && wt == "":
					local = append(local, "active: CPU")
				case state == "active":
					local = append(local, "active: "+wt+":"+we)
				case state == "idle in transaction":
					local = append(local, "idle in transaction")
				}
				return nil
			})
			if err == nil { // a sample cut short by an error is not counted
				o.record(local, seen)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (o *observer) sampleHeap(ctx context.Context) {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		metrics.Read(s)
		if s[0].Value.Kind() == metrics.KindUint64 {
			o.mu.Lock()
			o.heapMax = max(o.heapMax, s[0].Value.Uint64())
			o.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// topWaits formats the most frequent wait samples.
func (obs observation) topWaits(n int) string {
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range obs.Waits {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v || all[i].v == all[j].v && all[i].k < all[j].k })
	var parts []string
	for i, e := range all {
		if i == n {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %d%%", e.k, e.v))
	}
	return strings.Join(parts, ", ")
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTick is USER_HZ, 100 on every Linux this runs on.
const clockTick = 10 * time.Millisecond

// procCPU reads the user+system CPU time of a process from /proc.
func procCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * clockTick, true
}

// machineCPU returns busy and total jiffies of all cores from /proc/stat.
func machineCPU() [2]uint64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return [2]uint64{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy, total uint64
	for i, v := range f[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return [2]uint64{busy, total}
}
