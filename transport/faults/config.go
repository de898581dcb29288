package faults

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gosrp/gosrp/transport"
)

// Config sets the random fault rates, each a probability in [0, 1].
type Config struct {
	// Seed seeds the random choices; the same seed and the same sequence
	// of calls make the same faults.
	Seed int64
	// PostFail is the chance that a send WR is refused by PostSend,
	// with the WRs after it in the same call.
	PostFail float64
	// QPError is the chance that the QP goes to ERR just before a send
	// WR is handed to the device.
	QPError float64
	// DropCQE is the chance that a successful send completion is lost.
	DropCQE float64
	// CorruptCQE is the chance that a successful send completion reports
	// GENERAL_ERR instead, with the QP moved to ERR.
	CorruptCQE float64
	// LinkCut is the chance that the connection is cut after a send WR
	// is posted.
	LinkCut float64
	// PostLatency, if set, makes every PostSend return only this long
	// after it handed its WRs to the device. It is not a fault but a
	// device's right: a provider may carry small WRs out inside the post
	// call (rxe's requester can run in the caller's context), so their
	// completions are in the CQ before the post returns, and a consumer
	// that counts on a poll between its post and the completion misses
	// work it did.
	PostLatency time.Duration
	// DestroyLatency, if set, makes every QP's Close return only this
	// long after the QP underneath is gone. Like PostLatency it is a
	// device's right: rxe's destroy waits for the references the QP's
	// tasks still hold, for seconds (and, on Linux 6.12, was seen to
	// for minutes; docs/performance.md), so a consumer that holds
	// anything shared across a QP's Close stalls everything behind it.
	DestroyLatency time.Duration
}

// OptionPrefix starts the names of the provider options SplitOptions takes.
const OptionPrefix = "fault-"

// SplitOptions takes the fault options (fault-seed, fault-postfail,
// fault-qperror, fault-dropcqe, fault-corruptcqe, fault-linkcut, and the
// durations fault-postlatency and fault-destroylatency) out of opts. It returns their Config, the remaining options for the provider
// underneath, and whether any fault option was given.
func SplitOptions(opts transport.Options) (Config, transport.Options, bool, error) {
	var c Config
	rest := transport.Options{}
	any := false
	for k, v := range opts {
		name, ok := strings.CutPrefix(k, OptionPrefix)
		if !ok {
			rest[k] = v
			continue
		}
		any = true
		if name == "seed" {
			s, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return Config{}, nil, false, fmt.Errorf("provider option %s=%q: want an integer", k, v)
			}
			c.Seed = s
			continue
		}
		if d := map[string]*time.Duration{"postlatency": &c.PostLatency, "destroylatency": &c.DestroyLatency}[name]; d != nil {
			dur, err := time.ParseDuration(v)
			if err != nil || dur < 0 {
				return Config{}, nil, false, fmt.Errorf("provider option %s=%q: want a duration, such as 2s", k, v)
			}
			*d = dur
			continue
		}
		rate := map[string]*float64{
			"postfail": &c.PostFail, "qperror": &c.QPError, "dropcqe": &c.DropCQE,
			"corruptcqe": &c.CorruptCQE, "linkcut": &c.LinkCut,
		}[name]
		if rate == nil {
			return Config{}, nil, false, fmt.Errorf("provider option %s: unknown fault (want %sseed, postfail, qperror, dropcqe, corruptcqe, linkcut, postlatency or destroylatency)", k, OptionPrefix)
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			return Config{}, nil, false, fmt.Errorf("provider option %s=%q: want a probability between 0 and 1", k, v)
		}
		*rate = f
	}
	return c, rest, any, nil
}

// random reports whether any random fault can happen.
func (c Config) random() bool {
	return c.PostFail > 0 || c.QPError > 0 || c.DropCQE > 0 || c.CorruptCQE > 0 || c.LinkCut > 0
}
