package emu

import (
	"errors"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// TestOptions checks the provider options a program passes through
// (srpd --provider-option, bench, srpc): each known key lands in the
// Config, and unknown keys or bad values fail with ErrInvalidArgument.
func TestOptions(t *testing.T) {
	c, err := ConfigFromOptions(transport.Options{"profile": "rxe", "wire": "shm", "seed": "7", "shm-poll": "eager", "duplicate": "0.5"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Profile != "rxe" || c.Wire != "shm" || c.Seed != 7 || c.ShmPoll != ShmPollEager || c.Faults.Duplicate != 0.5 {
		t.Fatalf("config %+v", c)
	}
	// Each fault rate has the option named after its field.
	c, err = ConfigFromOptions(transport.Options{"qperror": "0.1", "postfail": "0.2", "dropcqe": "0.3",
		"corruptcqe": "0.4", "duplicate": "0.5", "delay": "0.6", "linkcut": "0.7"})
	want := Faults{QPError: 0.1, PostFail: 0.2, DropCQE: 0.3, CorruptCQE: 0.4, Duplicate: 0.5, Delay: 0.6, LinkCut: 0.7}
	if err != nil || c.Faults != want {
		t.Errorf("fault options: %+v, %v; want %+v", c.Faults, err, want)
	}
	for v, want := range map[string]bool{"on": true, "off": false, "true": true, "0": false} {
		c, err := ConfigFromOptions(transport.Options{"poll-pressure": v})
		if err != nil || c.PollPressure != want {
			t.Errorf("poll-pressure=%s: %v, %v; want %v", v, c.PollPressure, err, want)
		}
	}
	for _, o := range []transport.Options{{"bogus": "1"}, {"seed": "x"}, {"linkcut": "often"}, {"poll-pressure": "sometimes"}} {
		if _, err := ConfigFromOptions(o); !errors.Is(err, transport.ErrInvalidArgument) {
			t.Errorf("%v: %v, want ErrInvalidArgument", o, err)
		}
	}
	if _, err := New(Config{ShmPoll: "sometimes"}); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Errorf("ShmPoll sometimes: %v, want ErrInvalidArgument", err)
	}
	p := newNIC(t, Config{})
	defer p.Close()
	if p.cfg.ShmPoll != ShmPollAdaptive {
		t.Errorf("default ShmPoll %q, want %q", p.cfg.ShmPoll, ShmPollAdaptive)
	}
	// Host-wide state is consulted only when asked for.
	if p.pressure != nil {
		t.Error("the default provider consults /proc/pressure/cpu")
	}
}

// newNIC makes a software NIC with cfg, failing the test if it cannot.
func newNIC(t *testing.T, cfg Config) *Provider {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
