package emu

import (
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// Wire names.
const (
	WireLoop = "loop"
	WireTCP  = "tcp"
	WireShm  = "shm"
)

// Wires lists the wires this build supports.
func Wires() []string { return []string{WireLoop, WireTCP, WireShm} }

// Config.ShmPoll values.
const (
	ShmPollAdaptive = "adaptive"
	ShmPollEager    = "eager"
)

// RNRRetryForever is the Config.RNRRetry that never gives up on a
// receiver not ready: IBA's rnr_retry of 7 means retry without limit,
// and the SRP stacks use it (ib_srp's srp_send_req and ib_srpt's
// srpt_cm_req_recv set rnr_retry_count 7), so that a busy peer paces a
// sender instead of ending its connection.
const RNRRetryForever = 7

// Config configures a software NIC.
type Config struct {
	// Profile names a quirk bundle: strict (default), ib, iwarp, rxe.
	Profile string
	// Quirks, if set, replaces the profile's quirks knob by knob.
	Quirks *transport.Quirks
	// Wire is loop (default), tcp or shm.
	Wire string
	// Seed makes fault injection and generated keys reproducible. Zero
	// picks a seed from the clock; Provider.Seed reports it.
	Seed int64
	// Faults are random faults injected at the given rates.
	Faults Faults
	// RetryTimeout is how long a requester waits for an answer before a
	// retry (the IB local ACK timeout); RetryCount retries end in
	// RETRY_EXC_ERR. Defaults 3 retries after 20ms on the loop wire
	// (short, so tests stay fast) and 7 after 250ms on tcp and shm, whose
	// frames are never lost and whose peer may be descheduled for a long
	// while on a loaded machine.
	RetryTimeout time.Duration
	RetryCount   int
	// RNRTimeout and RNRRetry bound receiver-not-ready retries; defaults
	// 1ms and 6, as the ibverbs provider's rnr_retry. RNRRetryForever (7)
	// retries for as long as the receiver stays not ready, as IBA's
	// rnr_retry of 7 does; ib_srp and ib_srpt connect with it.
	RNRTimeout time.Duration
	RNRRetry   int
	// ShmPoll is how the shm wire's ring readers wait for answers to
	// their requests: ShmPollAdaptive (default) polls for them only while
	// the CPUs are not oversubscribed, ShmPollEager always polls up to
	// 200µs, as a dedicated polling core would (SPDK's poll mode): the
	// lowest latency when each process has a core to itself, CPU taken
	// from co-scheduled processes when not.
	ShmPoll string
	// PollPressure lets the tcp and shm readers ask the kernel's pressure
	// stall information (/proc/pressure/cpu, a host-wide figure) whether
	// the CPUs are oversubscribed before they poll. Off, a reader judges
	// from its own polls alone: one that finds itself descheduled stops
	// polling for a while. That is right on a machine given to gosrp;
	// turn it on (option poll-pressure=on) where gosrp shares a few cores
	// with other work, where PSI tells a neighbour's load from the
	// hypervisor's (docs/performance.md).
	PollPressure bool
	// Logger receives the NIC's log (QP errors and their reasons). Default:
	// slog.Default().
	Logger *slog.Logger
}

// Faults are probabilities in [0,1], applied per work request or per
// completion with the provider's seeded random source.
type Faults struct {
	// QPError moves the QP to ERR before a send WR executes.
	QPError float64
	// PostFail makes PostSend reject a WR with ErrQueueFull (the chain is
	// cut there, as ENOMEM from a real post would).
	PostFail float64
	// DropCQE loses a completion.
	DropCQE float64
	// CorruptCQE rewrites a successful completion's status to
	// GENERAL_ERR (SPDK's spdk_rdma_utils_inject_wc_error idea).
	CorruptCQE float64
	// Duplicate delivers a request twice on the wire.
	Duplicate float64
	// Delay holds a request back for up to MaxDelay before delivery.
	Delay    float64
	MaxDelay time.Duration
	// LinkCut cuts the wire before a request is transmitted.
	LinkCut float64
}

// rates names each fault rate of f as an option spells it: the field's
// name in lower case.
func (f *Faults) rates() map[string]*float64 {
	return map[string]*float64{
		"qperror": &f.QPError, "postfail": &f.PostFail, "dropcqe": &f.DropCQE, "corruptcqe": &f.CorruptCQE,
		"duplicate": &f.Duplicate, "delay": &f.Delay, "linkcut": &f.LinkCut,
	}
}

// ConfigFromOptions builds a Config from transport.Options: profile, wire,
// seed, shm-poll (adaptive or eager), poll-pressure (on or off), and fault rates named after the Faults fields in lower case
// (qperror, postfail, dropcqe, corruptcqe, duplicate, delay, linkcut).
func ConfigFromOptions(o transport.Options) (Config, error) {
	var c Config
	for k, v := range o {
		var err error
		switch k {
		case "profile":
			c.Profile = v
		case "wire":
			c.Wire = v
		case "shm-poll":
			c.ShmPoll = v
		case "poll-pressure":
			switch v {
			case "on":
				c.PollPressure = true
			case "off":
				c.PollPressure = false
			default:
				c.PollPressure, err = strconv.ParseBool(v)
			}
		case "seed":
			c.Seed, err = strconv.ParseInt(v, 0, 64)
		default:
			rate := c.Faults.rates()[k]
			if rate == nil {
				return c, fmt.Errorf("emu: unknown option %q: %w", k, transport.ErrInvalidArgument)
			}
			*rate, err = strconv.ParseFloat(v, 64)
		}
		if err != nil {
			return c, fmt.Errorf("emu: option %s=%q: %w", k, v, transport.ErrInvalidArgument)
		}
	}
	return c, nil
}

func init() {
	transport.Register("emu", func(o transport.Options) (transport.Provider, error) {
		c, err := ConfigFromOptions(o)
		if err != nil {
			return nil, err
		}
		return New(c)
	})
}
