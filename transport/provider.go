package transport

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Provider is one verbs implementation: the software NIC, or libibverbs and
// librdmacm on real hardware. It owns its devices and its connection
// manager.
type Provider interface {
	// Name is the registry name, e.g. "emu" or "ibverbs".
	Name() string
	// Devices lists the device names this provider can open.
	Devices() ([]string, error)
	// OpenDevice returns the named device ("" picks the first). Devices are
	// shared: opening the same name twice returns the same Device, and the
	// device a connection request arrives on is that same object.
	OpenDevice(name string) (Device, error)
	// Listen starts accepting connection requests on addr (rdma_listen). The
	// address syntax is the provider's: host:port for IP-based wires. An
	// empty addr picks a fresh local address the provider can reach itself
	// on (loopback), which Listener.Addr reports.
	Listen(ctx context.Context, addr string) (Listener, error)
	// Resolve binds an active endpoint to the device that reaches addr
	// (rdma_resolve_addr and rdma_resolve_route); the caller then creates
	// its QP on Endpoint.Device and calls Endpoint.Connect.
	Resolve(ctx context.Context, addr string) (Endpoint, error)
	// Close releases every device, listener and connection of the provider.
	Close() error
}

// Options configure a provider at Open: key=value settings whose meaning is
// the provider's (the software NIC takes profile, wire, seed, …).
type Options map[string]string

// ParseOptions parses "k1=v1,k2=v2" into Options.
func ParseOptions(s string) (Options, error) {
	o := Options{}
	if strings.TrimSpace(s) == "" {
		return o, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("transport: option %q is not key=value: %w", kv, ErrInvalidArgument)
		}
		o[k] = strings.TrimSpace(v)
	}
	return o, nil
}

// OpenFunc creates a provider instance from options.
type OpenFunc func(Options) (Provider, error)

var registry struct {
	mu    sync.Mutex
	funcs map[string]OpenFunc
	hints map[string]string
}

// Register makes a provider available to Open under name. Providers call it
// from an init function; a second registration of one name panics, as
// database/sql.Register does, because it is a programming error.
func Register(name string, open OpenFunc) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.funcs == nil {
		registry.funcs = map[string]OpenFunc{}
	}
	if _, dup := registry.funcs[name]; dup {
		panic("transport: Register called twice for provider " + name)
	}
	registry.funcs[name] = open
}

// RegisterHint records why a known provider is missing from this build (for
// example "build with -tags ibverbs"), so Open can say how to get it.
func RegisterHint(name, hint string) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.hints == nil {
		registry.hints = map[string]string{}
	}
	registry.hints[name] = hint
}

// Providers lists the registered provider names, sorted.
func Providers() []string {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	names := make([]string, 0, len(registry.funcs))
	for n := range registry.funcs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Open creates an instance of the named provider.
func Open(name string, opts Options) (Provider, error) {
	registry.mu.Lock()
	open, ok := registry.funcs[name]
	hint := registry.hints[name]
	registry.mu.Unlock()
	if !ok {
		if hint != "" {
			return nil, fmt.Errorf("transport: provider %q is not in this build (%s): %w", name, hint, ErrNotFound)
		}
		return nil, fmt.Errorf("transport: unknown provider %q (have %v): %w", name, Providers(), ErrNotFound)
	}
	p, err := open(opts)
	if err != nil {
		return nil, fmt.Errorf("transport: open provider %q: %w", name, err)
	}
	return p, nil
}
