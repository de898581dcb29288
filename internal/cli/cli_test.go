package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"maps"
	"runtime"
	"strings"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "256MiB": 256 << 20, "1GiB": 1 << 30, "1 GiB": 1 << 30,
		"2TiB": 2 << 40, "4KiB": 4096, "1.5GiB": 3 << 29, "10MB": 10e6, "64M": 64 << 20, "0x1000": 4096,
	} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1.3B", "9999999TiB", "GiB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) succeeded", in)
		}
	}
	if s := FormatSize(1 << 30); s != "1 GiB" {
		t.Errorf("FormatSize = %q", s)
	}
	if s := FormatSize(3 << 19); s != "1.5 MiB" {
		t.Errorf("FormatSize = %q", s)
	}
}

func TestExecute(t *testing.T) {
	var got []string
	var size SizeFlag
	var quiet bool
	root := &Command{Name: "prog", Sub: []*Command{{
		Name: "do", Args: "A B", Short: "does it",
		SetFlags: func(fs *flag.FlagSet) {
			fs.Var(&size, "size", "the `SIZE`")
			fs.BoolVar(&quiet, "quiet", false, "be quiet")
		},
		Run: func(_ context.Context, args []string) error {
			if err := NArgs(args, 2, 2, "A B"); err != nil {
				return err
			}
			got = args
			return nil
		},
	}}}
	var out, errb bytes.Buffer
	if code := Execute(context.Background(), root, []string{"do", "a", "--size", "1MiB", "-", "--quiet"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if len(got) != 2 || got[0] != "a" || got[1] != "-" || size.N != 1<<20 || !quiet {
		t.Fatalf("got %v size %d quiet %v", got, size.N, quiet)
	}
	if code := Execute(context.Background(), root, []string{"do", "a"}, &out, &errb); code != ExitUsage {
		t.Fatalf("missing arg: exit %d", code)
	}
	if code := Execute(context.Background(), root, []string{"nope"}, &out, &errb); code != ExitUsage {
		t.Fatalf("unknown command: exit %d", code)
	}
	if code := Execute(context.Background(), root, []string{"do", "--bogus"}, &out, &errb); code != ExitUsage {
		t.Fatalf("bad flag: exit %d", code)
	}
	out.Reset()
	if code := Execute(context.Background(), root, []string{"do", "--help"}, &out, &errb); code != 0 {
		t.Fatalf("help: exit %d", code)
	}
	for _, w := range []string{"Usage: prog do [flags] A B", "--size SIZE", "--quiet"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("help lacks %q:\n%s", w, out.String())
		}
	}
}

func TestSetProcs(t *testing.T) {
	prev := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(prev)
	var u *UsageError
	if err := SetProcs(-1); !errors.As(err, &u) {
		t.Fatalf("--procs -1: %v, want a usage error", err)
	}
	if err := SetProcs(0); err != nil || runtime.GOMAXPROCS(0) != prev {
		t.Fatalf("--procs 0: %v, GOMAXPROCS %d, want it left at %d", err, runtime.GOMAXPROCS(0), prev)
	}
	if err := SetProcs(prev + 1); err != nil || runtime.GOMAXPROCS(0) != prev+1 {
		t.Fatalf("--procs %d: %v, GOMAXPROCS %d", prev+1, err, runtime.GOMAXPROCS(0))
	}
}

// TestFlagsBeforeCommand: a group accepts its subcommands' flags before
// the subcommand word, as go, git and kubectl do; a word that is no flag
// of any subcommand is still reported.
func TestFlagsBeforeCommand(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		target   string
		quiet    bool
		pos      []string
		stderrIs string
	}{
		{args: []string{"--target", "x:1", "list"}, target: "x:1"},
		{args: []string{"--target=x:1", "--quiet", "list", "v"}, target: "x:1", quiet: true, pos: []string{"v"}},
		{args: []string{"-quiet", "--target", "x:1", "list", "--target", "y:2"}, target: "y:2", quiet: true},
		{args: []string{"--target", "list", "list"}, target: "list"},
		{args: []string{"--bogus", "list"}, code: ExitUsage, stderrIs: "prog: flag provided but not defined: -bogus\n"},
		{args: []string{"--target", "x:1"}, code: ExitUsage},
		{args: []string{"--target", "x:1", "nope"}, code: ExitUsage},
	} {
		var target string
		var quiet bool
		var pos []string
		root := &Command{Name: "prog", Sub: []*Command{{
			Name: "list",
			SetFlags: func(fs *flag.FlagSet) {
				fs.StringVar(&target, "target", "default", "the `ADDR`")
				fs.BoolVar(&quiet, "quiet", false, "be quiet")
			},
			Run: func(_ context.Context, args []string) error { pos = args; return nil },
		}}}
		var out, errb bytes.Buffer
		code := Execute(context.Background(), root, tc.args, &out, &errb)
		if code != tc.code {
			t.Errorf("%q: exit %d, want %d (%s)", tc.args, code, tc.code, errb.String())
			continue
		}
		if tc.stderrIs != "" && !strings.HasPrefix(errb.String(), tc.stderrIs) {
			t.Errorf("%q: stderr %q, want it to start %q", tc.args, errb.String(), tc.stderrIs)
		}
		if code == 0 && (target != tc.target || quiet != tc.quiet || strings.Join(pos, " ") != strings.Join(tc.pos, " ")) {
			t.Errorf("%q: target %q quiet %v args %q; want %q %v %q", tc.args, target, quiet, pos, tc.target, tc.quiet, tc.pos)
		}
	}
}

// TestWithBusyPoll: over ibverbs the programs poll adaptively unless the
// user named a busy_poll; other providers get none (emu would refuse
// it); the caller's options are never changed.
func TestWithBusyPoll(t *testing.T) {
	for _, tc := range []struct {
		provider string
		opts     transport.Options
		want     string // "" for none
	}{
		{"ibverbs", nil, BusyPoll},
		{"ibverbs", transport.Options{"retry": "7"}, BusyPoll},
		{"ibverbs", transport.Options{"busy_poll": "50us"}, "50us"},
		{"ibverbs", transport.Options{"busy_poll": "0"}, "0"},
		{"emu", transport.Options{"wire": "tcp"}, ""},
	} {
		before := maps.Clone(tc.opts)
		got := WithBusyPoll(tc.provider, tc.opts)
		if got["busy_poll"] != tc.want {
			t.Errorf("%s %v: busy_poll %q, want %q", tc.provider, tc.opts, got["busy_poll"], tc.want)
		}
		if !maps.Equal(tc.opts, before) {
			t.Errorf("%s: the caller's options changed to %v", tc.provider, tc.opts)
		}
	}
}
