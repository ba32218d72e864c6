package chaos

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// FileRecorder is the outside recorder of one worker process: an append-only
// file of one line per event, each written with a single write(2), so that
// a process killed at any instant leaves only whole lines behind. The file
// is not synced: a killed process's writes are in the page cache, and the
// recorder only has to survive process deaths, not machine crashes.
type FileRecorder struct {
	f    *os.File
	proc string
}

// recordFile is the recorder file of process proc in dir.
func recordFile(dir, proc string) string { return filepath.Join(dir, "rec-"+proc+".log") }

// OpenRecorder opens (appending) the recorder file of process proc in dir.
func OpenRecorder(dir, proc string) (*FileRecorder, error) {
	f, err := os.OpenFile(recordFile(dir, proc), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &FileRecorder{f: f, proc: proc}, nil
}

func (r *FileRecorder) write(line string) {
	// One Write of one line: os.File serializes concurrent writers, and
	// O_APPEND makes each write land whole at the end of the file.
	_, _ = r.f.Write([]byte(line))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func undash(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

// Start implements Recorder.
func (r *FileRecorder) Start(token, instance, key string, attempt int, step, prev string, index int) {
	r.write(fmt.Sprintf("S %s %s %s %d %s %s %d %d\n", token, instance, dash(key), attempt, step, dash(prev), index, time.Now().UnixNano()))
}

// End implements Recorder.
func (r *FileRecorder) End(token, label string) {
	r.write(fmt.Sprintf("E %s %s %d\n", token, label, time.Now().UnixNano()))
}

// Bad implements Recorder.
func (r *FileRecorder) Bad(token, msg string) {
	r.write(fmt.Sprintf("B %s %s\n", token, strings.ReplaceAll(msg, "\n", " ")))
}

// Close closes the file.
func (r *FileRecorder) Close() error { return r.f.Close() }

// nopRecorder is the recorder of processes that never run steps.
type nopRecorder struct{}

func (nopRecorder) Start(string, string, string, int, string, string, int) {}
func (nopRecorder) End(string, string)                                     {}
func (nopRecorder) Bad(string, string)                                     {}

// StepRun is one recorded step body.
type StepRun struct {
	// Key is every key the run held, joined by "," ("" for none).
	Token, Instance, Key, Step, Prev, Proc string
	Attempt, Index                         int
	// Start and End are Unix nanoseconds; End is 0 when the body never
	// recorded its end (its process was killed).
	Start, End int64
	// Label is the transition kind, "error" or "panic" (empty without an end).
	Label string
}

// Records is everything the recorders wrote.
type Records struct {
	Runs map[string]*StepRun
	// Bad are the problems step bodies noticed themselves.
	Bad []string
	// Torn counts lines that could not be parsed (there should be none:
	// every line is one write).
	Torn int
}

// ReadRecords reads every recorder file in dir.
func ReadRecords(dir string) (*Records, error) {
	files, err := filepath.Glob(filepath.Join(dir, "rec-*.log"))
	if err != nil {
		return nil, err
	}
	recs := &Records{Runs: map[string]*StepRun{}}
	for _, name := range files {
		proc := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(name), "rec-"), ".log")
		if err := recs.read(name, proc); err != nil {
			return nil, err
		}
	}
	return recs, nil
}

func (recs *Records) read(name, proc string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	ends := map[string][2]string{}
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		switch {
		case fields[0] == "S" && len(fields) == 9:
			attempt, e1 := strconv.Atoi(fields[4])
			index, e2 := strconv.Atoi(fields[7])
			start, e3 := strconv.ParseInt(fields[8], 10, 64)
			if e1 != nil || e2 != nil || e3 != nil {
				recs.Torn++
				continue
			}
			recs.Runs[fields[1]] = &StepRun{Token: fields[1], Instance: fields[2], Key: undash(fields[3]), Attempt: attempt,
				Step: fields[5], Prev: undash(fields[6]), Index: index, Start: start, Proc: proc}
		case fields[0] == "E" && len(fields) == 4:
			ends[fields[1]] = [2]string{fields[2], fields[3]}
		case fields[0] == "B" && len(fields) >= 2:
			recs.Bad = append(recs.Bad, fmt.Sprintf("process %s, run %s: %s", proc, fields[1], strings.Join(fields[2:], " ")))
		default:
			recs.Torn++
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	for token, e := range ends {
		r := recs.Runs[token]
		end, err := strconv.ParseInt(e[1], 10, 64)
		if r == nil || err != nil {
			recs.Torn++
			continue
		}
		r.Label, r.End = e[0], end
	}
	return nil
}
