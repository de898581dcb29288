package initiator

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// FuzzCore drives a channel's core with arbitrary events: requests,
// partial and failed posts, completions of any posted WR with any status,
// answers for any tag with any invalidation, garbage IUs, ticks,
// teardowns and reconnects. Whatever the order, the core never panics,
// keeps its invariants (core.check after every event) and completes no
// request twice. It runs the traces' harness, one event per command.
func FuzzCore(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 3, 0, 0, 2, 1, 0})
	f.Add([]byte{0, 1, 1, 0, 0, 2, 1, 3, 1, 1, 2, 0, 0, 5, 1, 0})
	f.Add([]byte{0, 0, 3, 0, 2, 1, 1, 1, 2, 3, 0, 4, 2, 2, 1, 3, 1, 0, 6, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzCore(t, data, fuzzDialect{
			ops: []string{"read", "write", "flush", "discard", "list", "close"},
			connect: func(next func() int) []string {
				var args []string
				if next()%2 == 0 {
					args = append(args, "remote-inv")
				}
				if next()%2 == 0 {
					args = append(args, "path-notices")
				}
				return args
			},
			open:   func(func() int) []string { return nil },
			submit: func(func() int) []string { return nil },
			recv: func(h *coreHarness, next func() int, pick func() string) []string {
				var args []string
				switch next() % 4 {
				case 0:
					if k := pick(); h.keys[k] != 0 {
						args = append(args, "inv="+k)
					}
				case 1:
					args = append(args, "inv=bogus")
				}
				kind := []string{"response", "response", "control", "garbage", "notice"}[next()%5]
				args = append(args, "kind="+kind)
				if kind == "notice" {
					args = append(args, fmt.Sprintf("handle=%d", next()%4))
				}
				return append(args, "status="+[]string{"good", "good", "error", "standby"}[next()%4])
			},
		})
	})
}

// fuzzDialect is what a protocol personality's fuzz target adds to the
// events fuzzCore draws: each function draws its own choices and returns
// more arguments for one trace command.
type fuzzDialect struct {
	// srp puts the harness's core in SRP mode.
	srp bool
	// ops are the operations a submit picks from.
	ops []string
	// connect, open and submit add to those commands' arguments.
	connect, open, submit func(next func() int) []string
	// recv adds what comes between a receive's tag and its credits.
	recv func(h *coreHarness, next func() int, pick func() string) []string
	// done, when set, checks a request the core completed (failed is the
	// text after "done NAME:", empty for a success) and says what is wrong.
	done func(h *coreHarness, name, failed string) string
}

// fuzzCore is the driver both fuzz targets share: it reads the input as
// a series of choices (fuzzNext), turns them into trace commands for the
// traces' harness, one event per command, and after each step checks
// the core's invariants and that no request completed twice.
func fuzzCore(t *testing.T, data []byte, d fuzzDialect) {
	next := fuzzNext(&data)
	mech := "frmr"
	if next()%2 == 1 {
		mech = "mw"
	}
	cmd := fuzzCmd
	initArgs := []string{"credits=3", "mech=" + mech}
	if d.srp {
		initArgs = append(initArgs, "srp")
	}
	h := newCoreHarness(t, cmd("init", initArgs...))
	done := map[string]bool{}
	step := func(td *datadriven.TestData) {
		out := h.run(t, td)
		if err := h.core.check(); err != nil {
			t.Fatalf("after %s: %v\n%s", td.String(), err, out)
		}
		for _, line := range strings.Split(out, "\n") {
			name, ok := strings.CutPrefix(line, "done ")
			if !ok {
				continue
			}
			name, failed, _ := strings.Cut(name, ":")
			if done[name] {
				t.Fatalf("after %s: %s completed twice\n%s", td.String(), name, out)
			}
			done[name] = true
			if d.done == nil {
				continue
			}
			if bad := d.done(h, name, failed); bad != "" {
				t.Fatalf("after %s: %s\n%s", td.String(), bad, out)
			}
		}
	}
	connect := func() {
		args := []string{fmt.Sprintf("credits=%d", 1+next()%3), fmt.Sprintf("imm=%d", 4096*(next()%3))}
		step(cmd("connect", append(args, d.connect(next)...)...))
		step(cmd("open", append([]string{"vol=v0", "handle=1"}, d.open(next)...)...))
	}
	connect()
	var names []string
	pick := func() string { return names[next()%len(names)] }
	for len(data) > 0 && len(names) < 64 {
		switch next() % 8 {
		case 0:
			name := fmt.Sprintf("r%d", len(names))
			names = append(names, name)
			args := []string{"name=" + name, "op=" + d.ops[next()%len(d.ops)],
				fmt.Sprintf("off=%d", 4096*(next()%4)), fmt.Sprintf("len=%d", 4096*(1+next()%3))}
			step(cmd("submit", append(args, d.submit(next)...)...))
		case 1:
			step(fuzzDispatch(next))
		case 2:
			if len(h.labels) == 0 {
				continue
			}
			step(fuzzWC(len(h.labels), next))
		case 3, 4:
			if len(names) == 0 || len(h.recvFree) == 0 {
				continue
			}
			args := []string{"name=" + pick()}
			switch next() % 6 {
			case 0:
				args = append(args, "tag=stale")
			case 1:
				args = append(args, "tag=unknown")
			}
			args = append(args, d.recv(h, next, pick)...)
			args = append(args, fmt.Sprintf("credits=%d", next()%3))
			step(cmd("recv", args...))
		case 5:
			step(cmd("tick", fmt.Sprintf("ms=%d", 500*(next()%4))))
		case 6:
			step(cmd("teardown"))
			connect()
		case 7:
			if len(names) > 0 {
				step(cmd("abandon", "name="+pick()))
			}
		}
	}
}

// fuzzNext hands out the fuzz input's bytes one choice at a time, taking
// them off *data; a spent input chooses 0.
func fuzzNext(data *[]byte) func() int {
	return func() int {
		if len(*data) == 0 {
			return 0
		}
		b := (*data)[0]
		*data = (*data)[1:]
		return int(b)
	}
}

// fuzzCmd is a trace command as a fuzz target issues it: its name, then
// KEY=VALUE or bare KEY arguments.
func fuzzCmd(name string, args ...string) *datadriven.TestData {
	td := &datadriven.TestData{Pos: "fuzz", Cmd: name}
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		arg := datadriven.CmdArg{Key: k}
		if v != "" {
			arg.Vals = []string{v}
		}
		td.CmdArgs = append(td.CmdArgs, arg)
	}
	return td
}

// fuzzDispatch is a dispatch whose post succeeds, or stops after 0-3 WRs
// with a full queue or a lost connection.
func fuzzDispatch(next func() int) *datadriven.TestData {
	switch next() % 3 {
	case 1:
		return fuzzCmd("dispatch", fmt.Sprintf("post=%d", next()%4), "post-err=queue-full")
	case 2:
		return fuzzCmd("dispatch", fmt.Sprintf("post=%d", next()%4), "post-err=disconnected")
	}
	return fuzzCmd("dispatch")
}

// fuzzWC completes one of the posted WRs (labels of them) with success
// (half the time), a flush or a remote access error.
func fuzzWC(labels int, next func() int) *datadriven.TestData {
	st := []string{"success", "success", "flush", "rem-access"}[next()%4]
	return fuzzCmd("wc", fmt.Sprintf("wr=#%d", 1+next()%labels), "status="+st)
}
