package cli

import (
	"errors"
	"fmt"
	"log/slog"
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
func OpenProvider(name string, opts transport.Options, log *slog.Logger) (transport.Provider, error) {
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
