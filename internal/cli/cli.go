// Package cli is the small command-line toolkit srpd and srpc share: a
// subcommand dispatcher over the standard flag package with Go-style help,
// size parsing (KiB, MiB, GiB, TiB) and the exit-code convention (0 success,
// 1 failure with one clear line, 2 usage).
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// UsageError is a mistake on the command line: it is printed with a pointer
// to --help and the program exits 2.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Usagef returns a *UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// Command is one command or a group of subcommands.
type Command struct {
	// Name is the word that selects the command.
	Name string
	// Args is the synopsis of the positional arguments, e.g. "NAME".
	Args string
	// Short is a one-line description shown in the parent's list.
	Short string
	// Long is the help text shown by --help, after the synopsis.
	Long string
	// SetFlags registers the command's flags.
	SetFlags func(fs *flag.FlagSet)
	// Run runs the command with the positional arguments.
	Run func(ctx context.Context, args []string) error
	// Sub are subcommands; a command with Sub and no Run is a group.
	Sub []*Command

	// Flags is the parsed flag set, available to Run (for flag.Visit).
	Flags *flag.FlagSet

	parent *Command
}

// Path is the full command path, e.g. "srpd volume create".
func (c *Command) Path() string {
	if c.parent == nil {
		return c.Name
	}
	return c.parent.Path() + " " + c.Name
}

func (c *Command) flagSet() *flag.FlagSet {
	fs := flag.NewFlagSet(c.Path(), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if c.SetFlags != nil {
		c.SetFlags(fs)
	}
	return fs
}

// Usage writes the command's help.
func (c *Command) Usage(w io.Writer) {
	fs := c.flagSet()
	syn := c.Path()
	if len(c.Sub) > 0 {
		if c.Run == nil {
			syn += " COMMAND"
		} else {
			syn += " [COMMAND]"
		}
	}
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		syn += " [flags]"
	}
	if c.Args != "" {
		syn += " " + c.Args
	}
	fmt.Fprintf(w, "Usage: %s\n", syn)
	if c.Long != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimRight(c.Long, "\n"))
	} else if c.Short != "" {
		fmt.Fprintf(w, "\n%s.\n", c.Short)
	}
	if len(c.Sub) > 0 {
		fmt.Fprintf(w, "\nCommands:\n")
		width := 0
		for _, s := range c.Sub {
			width = max(width, len(s.Name))
		}
		for _, s := range c.Sub {
			fmt.Fprintf(w, "  %-*s  %s\n", width, s.Name, s.Short)
		}
		fmt.Fprintf(w, "\nRun '%s COMMAND --help' for the flags of a command.\n", c.Path())
	}
	if hasFlags {
		fmt.Fprintf(w, "\nFlags:\n")
		PrintFlags(w, fs)
	}
}

// PrintFlags lists every flag of fs in --kebab-case, one description each.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	var fl []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { fl = append(fl, f) })
	sort.Slice(fl, func(i, j int) bool { return fl[i].Name < fl[j].Name })
	for _, f := range fl {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + strings.ToUpper(name)
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
		if def := f.DefValue; def != "" && def != "false" && def != "0" && def != "[]" {
			if _, isStr := f.Value.(interface{ IsBoolFlag() bool }); !isStr {
				fmt.Fprintf(w, " (default %s)", quoteDefault(f, def))
			}
		}
		fmt.Fprintln(w)
	}
}

func quoteDefault(f *flag.Flag, def string) string {
	if g, ok := f.Value.(flag.Getter); ok {
		if _, isString := g.Get().(string); isString {
			return fmt.Sprintf("%q", def)
		}
	}
	return def
}

// Main runs the command tree on os.Args and exits.
func Main(ctx context.Context, root *Command) {
	os.Exit(Execute(ctx, root, os.Args[1:], os.Stdout, os.Stderr))
}

// Execute runs the command tree on args and returns the exit code. Errors
// are printed to stderr as one line prefixed by the program name.
func Execute(ctx context.Context, root *Command, args []string, stdout, stderr io.Writer) int {
	link(root, nil)
	c := root
	// Walk down the tree through group words.
	for {
		if len(c.Sub) == 0 || len(args) == 0 {
			break
		}
		a := args[0]
		if a == "help" && c.Run == nil {
			if len(args) > 1 {
				if s := c.find(args[1]); s != nil {
					s.Usage(stdout)
					return ExitOK
				}
			}
			c.Usage(stdout)
			return ExitOK
		}
		if strings.HasPrefix(a, "-") {
			if c.Run == nil {
				if moved, ok := c.hoist(args); ok {
					args = moved
					continue
				}
			}
			break
		}
		s := c.find(a)
		if s == nil {
			if c.Run != nil {
				break // a positional argument of c
			}
			fmt.Fprintf(stderr, "%s: unknown command %q\nRun '%s --help' for usage.\n", c.Path(), a, c.Path())
			return ExitUsage
		}
		c, args = s, args[1:]
	}
	fs := c.flagSet()
	pos, err := ParseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		c.Usage(stdout)
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", c.Path(), err, c.Path())
		return ExitUsage
	}
	c.Flags = fs
	if c.Run == nil {
		if len(pos) > 0 {
			fmt.Fprintf(stderr, "%s: unknown command %q\nRun '%s --help' for usage.\n", c.Path(), pos[0], c.Path())
		} else {
			c.Usage(stderr)
		}
		return ExitUsage
	}
	if err := c.Run(ctx, pos); err != nil {
		var ue *UsageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", c.Path(), ue.Msg, c.Path())
			return ExitUsage
		}
		fmt.Fprintf(stderr, "%s: %s\n", root.Name, OneLine(err))
		return ExitFailure
	}
	return ExitOK
}

// hoist moves flags written before a group's subcommand word to just
// after it ("srpc --target X list" runs as "srpc list --target X"), as go,
// git and kubectl accept them. A flag is known by the subcommands that
// define it, which also tells whether it takes a value; at the first word
// that is no such flag, nothing is moved and ok is false, and parsing
// reports it as before.
func (c *Command) hoist(args []string) (moved []string, ok bool) {
	sets := make([]*flag.FlagSet, len(c.Sub))
	for i, s := range c.Sub {
		sets[i] = s.flagSet()
	}
	lookup := func(name string) *flag.Flag {
		for _, fs := range sets {
			if f := fs.Lookup(name); f != nil {
				return f
			}
		}
		return nil
	}
	i := 0
	for i < len(args) && strings.HasPrefix(args[i], "-") && args[i] != "-" && args[i] != "--" {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		f := lookup(name)
		if f == nil {
			return nil, false
		}
		i++
		if b, isBool := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(isBool && b.IsBoolFlag()) {
			i++ // the flag's value is the next word
		}
	}
	if i == 0 || i >= len(args) || c.find(args[i]) == nil {
		return nil, false
	}
	moved = make([]string, 0, len(args))
	moved = append(moved, args[i])
	moved = append(moved, args[:i]...)
	return append(moved, args[i+1:]...), true
}

func link(c, parent *Command) {
	c.parent = parent
	for _, s := range c.Sub {
		link(s, c)
	}
}

func (c *Command) find(name string) *Command {
	for _, s := range c.Sub {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// OneLine flattens an error message onto one line.
func OneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// ParseInterspersed parses flags that may appear before, between or after
// positional arguments ("--" ends flags; "-" alone is positional) and returns
// the positional arguments.
func ParseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag stops at the first non-flag, or after "--".
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// NArgs checks the number of positional arguments.
func NArgs(args []string, min, max int, synopsis string) error {
	if len(args) < min {
		return Usagef("missing %s", synopsis)
	}
	if max >= 0 && len(args) > max {
		return Usagef("unexpected argument %q (want %s)", args[max], synopsis)
	}
	return nil
}
