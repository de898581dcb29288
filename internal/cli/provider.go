package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gosrp/gosrp/transport"
)

// OpenProvider opens a verbs provider by name with a one-line error a user
// can act on (for ibverbs on a default build: how to rebuild).
func OpenProvider(name string, opts transport.Options) (transport.Provider, error) {
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
