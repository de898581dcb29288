package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
	"github.com/gosrp/gosrp/transport/faults"
)

// OpenProvider opens a verbs provider by name with a one-line error a user
// can act on (for ibverbs on a default build: how to rebuild). The
// software NIC gets the programs' retry settings (EmuRetryTimeoutMS) and
// log (nil: slog.Default()). Options named fault-* (transport/faults)
// wrap any provider with seeded faults.
//
// Over ibverbs the CQ waiters poll with BusyPoll unless opts has a
// busy_poll.
func OpenProvider(name string, opts transport.Options, log *slog.Logger) (transport.Provider, error) {
	opts = WithBusyPoll(name, opts)
	fc, rest, wrap, err := faults.SplitOptions(opts)
	if err != nil {
		return nil, fmt.Errorf("--provider %s: %w", name, err)
	}
	p, err := openProvider(name, rest, log)
	if err != nil || !wrap {
		return p, err
	}
	if log == nil {
		log = slog.Default()
	}
	log.Warn("injecting transport faults", "provider", name, "config", fmt.Sprintf("%+v", fc))
	return faults.Wrap(p, fc), nil
}

// BusyPoll is how srpd's, srpc's and bench's CQ waiters wait over real
// verbs unless --provider-option busy_poll says otherwise: each CQ polls
// for about twice its recent waits, up to 2 ms, and one whose waits
// outlast that polls 50 µs and sleeps (transport/ibverbs's doc,
// Waiting). The programs' defaults are for a machine given to storage,
// as SPDK's reactors take their cores: a steady stream of I/O is met
// polling instead of with a wake-up per completion, on both ends.
// busy_poll=50us (the library's own default) is for a host whose
// cores its applications need. docs/performance.md ("Polling on real
// verbs") has the measurements.
const BusyPoll = "adaptive"

// WithBusyPoll returns opts for provider name with BusyPoll added where
// the provider is ibverbs and opts has no busy_poll; opts itself is not
// changed.
func WithBusyPoll(name string, opts transport.Options) transport.Options {
	if _, ok := opts["busy_poll"]; name != "ibverbs" || ok {
		return opts
	}
	o := maps.Clone(opts)
	if o == nil {
		o = transport.Options{}
	}
	o["busy_poll"] = BusyPoll
	return o
}

func openProvider(name string, opts transport.Options, log *slog.Logger) (transport.Provider, error) {
	if name == "emu" {
		c, err := emu.ConfigFromOptions(opts)
		if err == nil {
			c.RetryTimeout, c.RetryCount = EmuRetryTimeoutMS*time.Millisecond, EmuRetryCount
			c.Logger = log
			var p *emu.Provider
			if p, err = emu.New(c); err == nil {
				return p, nil
			}
		}
		return nil, fmt.Errorf("--provider emu: %s", strings.TrimPrefix(err.Error(), "emu: "))
	}
	p, err := transport.Open(name, opts)
	if err == nil {
		return p, nil
	}
	msg := strings.TrimPrefix(err.Error(), "transport: ")
	if errors.Is(err, transport.ErrNotFound) {
		msg = strings.TrimSuffix(msg, ": "+transport.ErrNotFound.Error())
	}
	return nil, fmt.Errorf("--provider %s: %s", name, msg)
}
