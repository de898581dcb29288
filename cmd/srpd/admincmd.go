package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/cli"
)

var stdout io.Writer = os.Stdout

// adminFlags are the flags every administration command takes.
type adminFlags struct {
	data   string
	socket string
	json   bool

	aclLive bool // set by withService
}

func (a *adminFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.data, "data", DefaultData, "the daemon's data `DIR` (its admin socket is DIR/srpd.sock)")
	fs.StringVar(&a.socket, "socket", "", "admin socket `PATH` (default DIR/srpd.sock)")
	fs.BoolVar(&a.json, "json", false, "print JSON instead of a table")
}

// adminCmd is one administration subcommand as data: its words, its own
// flags, how its arguments are checked, and what it asks srpd. A group
// turns it into a cli.Command (adminFlags.command) that also takes the
// admin flags, counts the arguments against the synopsis, and runs
// against the daemon or, when none answers, the data directory.
type adminCmd struct {
	name, args, short, long string
	// flags registers the command's own flags, if it has any.
	flags func(fs *flag.FlagSet)
	// snap: the first two arguments are VOLUME SNAPSHOT, which the user
	// may also write VOLUME@SNAPSHOT; run gets them apart.
	snap bool
	// check, if set, validates the arguments and flags before srpd is
	// asked, so that a mistake is a usage error even with srpd down.
	check func(args []string) error
	// run asks s; show builds one that prints the answer.
	run func(s admin.Service, args []string) error
}

// group is a command word (volume, snapshot, ...) over subcommands that
// share af.
func (a *adminFlags) group(name, short string, cmds ...adminCmd) *cli.Command {
	g := &cli.Command{Name: name, Short: short}
	for _, c := range cmds {
		g.Sub = append(g.Sub, a.command(c))
	}
	return g
}

func (a *adminFlags) command(c adminCmd) *cli.Command {
	return &cli.Command{
		Name: c.name, Args: c.args, Short: c.short, Long: c.long,
		SetFlags: func(fs *flag.FlagSet) {
			a.register(fs)
			if c.flags != nil {
				c.flags(fs)
			}
		},
		Run: func(ctx context.Context, args []string) error {
			args, err := c.parse(args)
			if err != nil {
				return err
			}
			if c.check != nil {
				if err := c.check(args); err != nil {
					return err
				}
			}
			return a.withService(ctx, true, func(s admin.Service) error { return c.run(s, args) })
		},
	}
}

// parse counts the positional arguments against the synopsis: each word
// is one argument, a [BRACKETED] one optional.
func (c adminCmd) parse(args []string) ([]string, error) {
	for _, a := range args {
		// The admin API names things in its URL paths, where these
		// would come back as an HTTP status ("404 Not Found").
		if a == "" || a == "." || a == ".." || strings.TrimSpace(a) == "" {
			return nil, cli.Usagef("%q: want a name", a)
		}
	}
	lo, hi := 0, 0
	for _, w := range strings.Fields(c.args) {
		if !strings.HasPrefix(w, "[") {
			lo++
		}
		hi++
	}
	syn := c.args
	if syn == "" {
		syn = "no arguments"
	}
	if c.snap && len(args) >= 1 {
		if v, s, ok := strings.Cut(args[0], "@"); ok {
			if err := cli.NArgs(args, lo-1, hi-1, syn); err != nil {
				return nil, err
			}
			return append([]string{v, s}, args[1:]...), nil
		}
	}
	return args, cli.NArgs(args, lo, hi, syn)
}

// show returns a run that asks with call and prints the answer: as a
// table written by table, or as JSON under --json.
func show[T any](a *adminFlags, call func(s admin.Service, args []string) (T, error), table func(w *tabwriter.Writer, v T)) func(admin.Service, []string) error {
	return func(s admin.Service, args []string) error {
		v, err := call(s, args)
		if err != nil {
			return err
		}
		return a.print(v, func(w *tabwriter.Writer) { table(w, v) })
	}
}

// rows returns a table printer for a list: the header line, then a line
// written by row for each item.
func rows[T any](header string, row func(w io.Writer, x T)) func(w *tabwriter.Writer, xs []T) {
	return func(w *tabwriter.Writer, xs []T) {
		fmt.Fprintln(w, header)
		for _, x := range xs {
			row(w, x)
		}
	}
}

func (a *adminFlags) socketPath() string {
	if a.socket != "" {
		return a.socket
	}
	return filepath.Join(a.data, admin.SocketName)
}

// withService runs fn against the running daemon, or, when none answers on
// the socket, directly on the data directory (which then must not be in use).
func (a *adminFlags) withService(ctx context.Context, offlineOK bool, fn func(admin.Service) error) error {
	c := admin.NewClient(a.socketPath())
	st, err := c.Status(ctx)
	if err == nil {
		a.aclLive = st.ACLLive
		return fn(c.Service(ctx))
	}
	a.aclLive = true // offline: the next start reads access.json
	if !errors.Is(err, admin.ErrNotRunning) || !offlineOK {
		return err
	}
	if _, statErr := os.Stat(a.data); statErr != nil {
		return fmt.Errorf("srpd is not running and there is no data directory %s (start srpd, or pass --data)", a.data)
	}
	lock, err := lockDataDir(a.data)
	if err != nil {
		return fmt.Errorf("srpd does not answer on %s: %w", a.socketPath(), err)
	}
	defer lock.Close()
	// The store is the kind the last srpd served here: a pebble store
	// made beside a file backend's volumes once took the command, and
	// srpd never saw what it did.
	backend := canonicalBackend(lock.backend())
	if backend != "pebble" && backend != "file" {
		return fmt.Errorf("srpd is not running, and %s holds a %s-backend store, which only a running srpd can change: start srpd --backend %s --data %s, then run the command again", a.data, backend, backend, a.data)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	store, err := openStore(backend, a.data, log, nil)
	if err != nil {
		return fmt.Errorf("srpd does not answer on %s and the store cannot be opened: %w", a.socketPath(), err)
	}
	acc, err := loadAccess(a.data)
	if err != nil {
		store.Close()
		return err
	}
	ferr := fn(&service{store: store, access: acc})
	if cerr := store.Close(); ferr == nil {
		ferr = cerr
	}
	return ferr
}

func (a *adminFlags) print(v any, table func(w *tabwriter.Writer)) error {
	if a.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	table(w)
	return w.Flush()
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04")
}
