package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/godurable/godurable/store"
)

// schedules dispatches `schedules ls`, `schedules pause NAME` and
// `schedules resume NAME`. Schedules are defined in the workers' Go code
// (durable.Config.Schedules) and synced at their Start; the CLI lists them
// and pauses them without a deploy.
func schedules(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("schedules: want a subcommand: ls, pause NAME or resume NAME")
	}
	switch args[0] {
	case "ls":
		return schedulesList(ctx, args[1:], stdout, stderr)
	case "pause":
		return schedulePause(ctx, "schedules pause", true, args[1:], stdout, stderr)
	case "resume":
		return schedulePause(ctx, "schedules resume", false, args[1:], stdout, stderr)
	default:
		return usagef("schedules: unknown subcommand %q: want ls, pause NAME or resume NAME", args[0])
	}
}

func schedulesList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("schedules ls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON (per schedule: its definition and store.ScheduleHealth)")
	if _, err := parse(fs, args, 0, 0, ""); err != nil {
		return err
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("schedules ls: %w", err)
	}
	defer closeStore()
	scs, err := st.ListSchedules(ctx)
	if err != nil {
		return fmt.Errorf("schedules ls: %w", err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	hs := store.SchedulesHealth(scs, now)
	if *asJSON {
		type entry struct {
			store.ScheduleHealth
			Queue    string `json:"queue"`
			Overlap  string `json:"overlap"`
			CatchUp  string `json:"catch_up"`
			Instance string `json:"last_instance"`
		}
		out := make([]entry, len(scs))
		for i, sc := range scs {
			out[i] = entry{ScheduleHealth: hs[i], Queue: sc.Queue, Overlap: string(sc.Overlap), CatchUp: string(sc.CatchUp), Instance: sc.LastInstance}
		}
		return writeJSON(stdout, out)
	}
	if len(scs) == 0 {
		fmt.Fprintln(stdout, "no schedules (workers sync the ones their configuration names when they start)")
		return nil
	}
	printSchedules(stdout, scs, hs, now)
	return nil
}

// printSchedules writes one line per schedule: its definition, state, last
// and next fire times.
func printSchedules(w io.Writer, scs []store.Schedule, hs []store.ScheduleHealth, now time.Time) {
	tw := table(w)
	fmt.Fprintln(tw, "NAME\tNAMESPACE\tWORKFLOW\tKEYS\tCRON\tZONE\tSTATE\tLAST FIRED\tNEXT FIRE\tOVERLAP/CATCH-UP")
	for i, h := range hs {
		zone := h.TimeZone
		if zone == "" {
			zone = "UTC"
		}
		state := "active"
		switch {
		case h.Paused:
			state = "paused"
		case h.Late:
			state = "LATE"
		case h.Error != "":
			state = "error: " + h.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s/%s\n", h.Name, h.Namespace, h.Workflow,
			keyColumn(scs[i].KeyList()), h.Cron, zone, state,
			whenPtr(h.LastFiredAt, now), whenPtr(h.NextFire, now), scs[i].Overlap, scs[i].CatchUp)
	}
	tw.Flush()
}

// whenPtr is when for an optional time.
func whenPtr(t *time.Time, now time.Time) string {
	if t == nil {
		return "-"
	}
	return when(*t, now)
}

func schedulePause(ctx context.Context, name string, paused bool, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := addDBFlags(fs)
	pos, err := parse(fs, args, 1, 0, "NAME")
	if err != nil {
		return err
	}
	st, closeStore, err := db.open(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer closeStore()
	sc, err := st.PauseSchedule(ctx, pos[0], paused, time.Time{})
	if errors.Is(err, store.ErrScheduleNotFound) {
		return fmt.Errorf("%s: no schedule %q: `%s` lists the stored ones", name, pos[0], db.command("schedules", "ls"))
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if paused {
		fmt.Fprintf(stdout, "schedule %q paused: no tick fires until `%s` (engines re-syncing it keep the pause)\n", sc.Name, db.command("schedules", "resume", sc.Name))
		return nil
	}
	now := time.Now().UTC().Truncate(time.Second)
	h := store.SchedulesHealth([]store.Schedule{sc}, now)[0]
	fmt.Fprintf(stdout, "schedule %q resumed: next fire %s (ticks of the pause are not run)\n", sc.Name, whenPtr(h.NextFire, now))
	return nil
}
