// Command durable is the godurable operator CLI: what is running, what is
// blocked and why, and the few actions that fix it, against the PostgreSQL
// database the workers share.
//
//	durable migrate  [-down N] [-plan]          apply (or revert) the schema migrations; say what each locks first
//	durable health   [-json]                    queues, gates, warnings, the queues nobody works and the paused ones at a glance
//	durable ls       (newest first) [-workflow W] [-status S] [-key K] [-queue Q] [-after ID] [-limit N] [-json]
//	durable show     ID [-json]                 one instance: state (keys sorted by name), step, attempt, error, history
//	durable signal   ID NAME [JSON] [-dedup K]  send a signal
//	durable cancel   ID [-children]             cancel a non-terminal instance (-children: and its descendants)
//	durable retry    ID                         run a failed or canceled instance again
//	durable limits   ls [-json]                 the stored key limits
//	durable limits   sync FILE [-namespace NS]  replace the stored key (and rate) limits (FILE "-" is stdin)
//	durable limits   set NAME|KEY LIMIT [-shards N] [-namespace NS]  store one limit (a KEY: a per-key limit)
//	durable limits   unset NAME|KEY [-namespace NS]                  delete one limit
//	durable policies ls [-json]                 the stored queue policies (fleet-wide MaxActive)
//	durable policies sync FILE -namespace NS    replace a namespace's queue policies (FILE: an object or a bare array)
//	durable explain  KEY [-json]                who holds a key, who waits, which limit blocks it
//	durable ui       [-addr A] [-token T] [-read-only]  serve the web page (127.0.0.1:8080)
//	durable schedules ls [-json]                the stored schedules: state, last and next fire times
//	durable schedules pause|resume NAME         stop or restart a schedule's ticks, fleet-wide, without a deploy
//	durable queues ls [-json]                   the queues: paused or active, waiting and running rows
//	durable queues pause|resume QUEUE           stop or restart the steps of a queue, fleet-wide, without a deploy
//
// Every command takes -database-url (default $DATABASE_URL) and -schema
// (default "durable"), before or after the command; a command's own flags
// may come before or after its arguments. Every command line the CLI prints
// as a hint (the next page of ls, the migrate a schema needs) repeats the
// -database-url and -schema the user gave, so that it works as pasted.
// Errors go to stderr and the exit status is 1 (2 for a usage error).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "durable:", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

const usage = `usage: durable <command> [arguments] [flags]

commands:
  migrate              apply (or with -down N, revert) the schema migrations, saying first what each
                       locks (-plan: only say it)
  health               queues, gates, warnings, the queues nobody works and the paused ones (-json)
  ls                   list instances, newest first (-workflow, -status, -key, -queue, -after, -limit;
                       a filtered page looks at -scan instances at most, default 10000)
  show ID              one instance: state (object keys sorted by name), step, attempt, last error, history
  signal ID NAME [JSON]  send a signal (-dedup KEY makes a repeat a no-op)
  cancel ID            cancel a non-terminal instance (-children: and every descendant, parents first)
  retry ID             run a failed or canceled instance again from its step
  limits ls [NAME|KEY]  list the stored key limits (20 per-key limits a name at most; with NAME,
                       that name's and all its keys'; with KEY, its name's and its own; -json: all)
  limits sync FILE     replace the stored key limits with FILE's (JSON; "-" is stdin;
                       with "rate_limits", the rate limits too; -namespace NS)
  limits set NAME LIMIT  store one limit, leaving the others (-shards N, -namespace NS, -dry-run);
                       NAME "stripe:acct_big" is a per-key limit: that key's K over its name's
  limits unset NAME    delete one limit (-namespace NS, -dry-run)
  policies ls          list the stored queue policies (fleet-wide MaxActive, MaxActivePerKey)
  policies sync FILE   replace a namespace's queue policies (-namespace NS, -keep-omitted, -dry-run)
  explain KEY          who holds the key's slots, who waits, which limit blocks it
  ui                   serve the web page on 127.0.0.1:8080 (-addr, -token or $DURABLE_UI_TOKEN,
                       required off loopback; -read-only turns the actions off)
  schedules ls         list the stored schedules: paused or late, last and next fire times (-json)
  schedules pause NAME   stop a schedule's ticks fleet-wide (stored: survives deploys)
  schedules resume NAME  restart them from the next tick (the paused ones are not run)
  queues ls            list the queues: paused or active, waiting and running rows (-json)
  queues pause QUEUE   stop starting steps of a queue fleet-wide (stored: survives restarts;
                       running steps finish, its rows wait)
  queues resume QUEUE  let engines claim its rows again

every command takes (before or after the command):
  -database-url URL    PostgreSQL connection string (default $DATABASE_URL)
  -schema NAME         schema holding the tables (default "durable")
`

// usageError marks a command line that does not parse (exit status 2).
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// command is one subcommand: it parses its own flags from args.
type command func(ctx context.Context, args []string, stdout, stderr io.Writer) error

var commands = map[string]command{
	"migrate":   migrate,
	"health":    health,
	"ls":        list,
	"show":      show,
	"signal":    sendSignal,
	"cancel":    cancel,
	"retry":     retry,
	"limits":    limits,
	"policies":  policies,
	"explain":   explainCmd,
	"ui":        serveUI,
	"schedules": schedules,
	"queues":    queues,
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usagef("no command")
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	global, args, err := leadingGlobalFlags(args)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usagef("no command after the flags %v", global)
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprint(stderr, usage)
		return usagef("unknown command %q", args[0])
	}
	// Every command parses its flags wherever they appear, so the global
	// flags given before the command are handed to it after its arguments.
	return cmd(ctx, append(args[1:len(args):len(args)], global...), stdout, stderr)
}

// globalFlags are the flags every command takes, which may also come
// before the command: whether each takes a value.
var globalFlags = map[string]bool{"database-url": true, "schema": true}

// leadingGlobalFlags splits the global flags before the command (as in
// `durable -schema x health`) from the rest of args. Any other flag before
// the command is a usage error naming the flags allowed there.
func leadingGlobalFlags(args []string) (global, rest []string, err error) {
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && args[0] != "-" {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		if !globalFlags[name] {
			return nil, nil, usagef("flag %s before the command: only -database-url and -schema may come before it "+
				"(put the command's own flags after it)", args[0])
		}
		if hasValue {
			global, args = append(global, args[0]), args[1:]
			continue
		}
		if len(args) < 2 {
			return nil, nil, usagef("flag %s needs a value", args[0])
		}
		global, args = append(global, args[0], args[1]), args[2:]
	}
	return global, args, nil
}

// parse parses fs's flags wherever they appear in args and returns the
// other arguments in order; exactly want of them are required, or between
// want and want+optional.
func parse(fs *flag.FlagSet, args []string, want, optional int, names string) ([]string, error) {
	var pos []string
	// The flag package prints its error and the defaults itself; main
	// prints the error once, and the defaults only for -h.
	out := fs.Output()
	fs.SetOutput(io.Discard)
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(out)
				fs.PrintDefaults()
				return nil, usagef("%s: usage: durable %s %s [flags]", fs.Name(), fs.Name(), names)
			}
			return nil, usagef("%s: %v (see durable %s -h)", fs.Name(), err, fs.Name())
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) < want || len(pos) > want+optional {
		return nil, usagef("%s: want %s, got %d argument(s)", fs.Name(), names, len(pos))
	}
	return pos, nil
}
