//go:build linux && cgo && ibverbs

package ibverbs

import (
	"errors"
	"testing"

	"github.com/gosrp/gosrp/transport"
)

// TestOptions: each option's accepted range, and a one-line refusal
// naming the option for anything else.
func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		opts transport.Options
		ok   bool
		want func(*Provider) bool
	}{
		{transport.Options{}, true, func(p *Provider) bool { return p.ackTimeout == 0 && p.retry == 7 && p.rnrRetry == 6 }},
		{transport.Options{"ack_timeout": "19"}, true, func(p *Provider) bool { return p.ackTimeout == 19 }},
		{transport.Options{"ack_timeout": "31"}, true, func(p *Provider) bool { return p.ackTimeout == 31 }},
		{transport.Options{"ack_timeout": "0"}, false, nil},
		{transport.Options{"ack_timeout": "32"}, false, nil},
		{transport.Options{"ack_timeout": "2s"}, false, nil},
		{transport.Options{"retry": "3", "rnr_retry": "7"}, true, func(p *Provider) bool { return p.retry == 3 && p.rnrRetry == 7 }},
		{transport.Options{"retry": "8"}, false, nil},
		{transport.Options{"busy_poll": "adaptive"}, true, func(p *Provider) bool { return p.adaptive }},
		{transport.Options{"busy_poll": "2s"}, false, nil},
		{transport.Options{"ack-timeout": "19"}, false, nil},
	} {
		p, err := New(tc.opts)
		switch {
		case tc.ok && err != nil:
			t.Errorf("New(%v): %v", tc.opts, err)
		case !tc.ok && !errors.Is(err, transport.ErrInvalidArgument):
			t.Errorf("New(%v): %v, want ErrInvalidArgument", tc.opts, err)
		case tc.ok && !tc.want(p):
			t.Errorf("New(%v) = %+v", tc.opts, p)
		}
	}
}
