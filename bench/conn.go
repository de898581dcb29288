package main

// A job's connection to the volume: one session to one target, or, with
// several --target paths, an initiator.Multipath of gateways that fails
// over (docs/gateways.md, "Multipath").

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/transport"
)

// benchVolume is what a job and the prefill use of a volume: an
// *initiator.Volume or an *initiator.MultipathVolume.
type benchVolume interface {
	Size() int64
	BlockSize() int
	ReadOnly() bool
	Submit(r *initiator.Request) error
	Flush(ctx context.Context) error
	WriteAtContext(ctx context.Context, p []byte, off int64) (int, error)
	Close() error
}

// conn is one job's (or the prefill's) connection: s and v for one
// target, m and mv through several paths; vol is whichever volume.
type conn struct {
	s  *initiator.Session
	v  *initiator.Volume
	m  *initiator.Multipath
	mv *initiator.MultipathVolume
	// vol is v or mv.
	vol benchVolume
}

// buffer returns n bytes for the job's requests: registered memory of the
// session's pool, on which I/O needs no bounce copy; through a Multipath
// plain memory, since each path's session registers its own and a
// buffer of one would be foreign to the others (MultipathVolume.Submit
// bounces every I/O through the path's per-credit buffers).
func (c *conn) buffer(n int) ([]byte, error) {
	if c.s == nil {
		return make([]byte, n), nil
	}
	return c.s.AllocBuffer(n)
}

// failovers counts the Multipath volume's failovers (0 for one target).
func (c *conn) failovers() int {
	if c.mv == nil {
		return 0
	}
	return c.mv.Failovers()
}

// path is the address the volume's I/O goes to now (addr: the one
// target's).
func (c *conn) path(addr string) string {
	if c.mv == nil {
		return addr
	}
	return c.mv.Path()
}

func (c *conn) close() error {
	var errs []error
	if c.vol != nil {
		errs = append(errs, c.vol.Close())
	}
	if c.s != nil {
		errs = append(errs, c.s.Close())
	}
	if c.m != nil {
		errs = append(errs, c.m.Close())
	}
	return errors.Join(errs...)
}

// dialConn opens a session (or, with several --target paths, a
// Multipath) by cfg to addr and opens --volume on it.
func dialConn(ctx context.Context, o *Options, cfg initiator.Config, addr string, ro bool) (*conn, error) {
	oo := initiator.OpenOptions{ReadOnly: ro}
	if !o.multipath() {
		cfg.Addr = addr
		s, err := initiator.Dial(ctx, cfg)
		if err != nil {
			return nil, err
		}
		v, err := s.Open(ctx, o.Volume, oo)
		if err != nil {
			err = openError(ctx, s, o.Volume, addr, err)
			s.Close()
			return nil, err
		}
		return &conn{s: s, v: v, vol: v}, nil
	}
	// No registered pool: nothing of a Multipath's could use it.
	cfg.BufferBytes = 0
	m, err := initiator.DialMultipath(ctx, initiator.MultipathConfig{Config: cfg, Addrs: o.Targets, FastFail: o.FastFail})
	if err != nil {
		return nil, err
	}
	mv, err := m.Open(ctx, o.Volume, oo)
	if err != nil {
		m.Close()
		return nil, err
	}
	return &conn{m: m, mv: mv, vol: mv}, nil
}

// errNoVolume is the start of openError's message, which needs no other
// context.
var errNoVolume = errors.New("no volume")

// openError says in one line that the target offers no volume name to
// this initiator, when that is why the open failed (the target's store
// said so in five nested layers); any other err is kept.
func openError(ctx context.Context, s *initiator.Session, name, addr string, err error) error {
	if errors.Is(err, initiator.ErrAccessDenied) || errors.Is(err, initiator.ErrNotReady) {
		return err
	}
	vols, lerr := s.Volumes(ctx)
	if lerr != nil || slices.ContainsFunc(vols, func(v initiator.VolumeInfo) bool { return v.Name == name }) {
		return err
	}
	return fmt.Errorf("%w %q on %s for this initiator (srpc list shows what it may open; --volume)", errNoVolume, name, addr)
}

// dialJob opens one job's session and volume.
func dialJob(ctx context.Context, o *Options, job int, p transport.Provider, addr string, secret []byte, log *slog.Logger) (*conn, error) {
	bsPage := pageRound(o.BS)
	cfg := initiator.Config{
		Provider: p, Name: o.Name, Secret: secret,
		Channels: o.Channels, Credits: o.IODepth, Mechanism: o.Mechanism, MaxTransfer: int(max(bsPage, int64(transport.PageSize))),
		BufferBytes: o.IODepth * int(o.BS), ReplayBuffer: int(o.ReplayBuf), Logger: log,
		Protocol: o.proto, SRPTargetPortID: o.srpPort, SRPInitiatorPortID: o.srpSessionPort(fmt.Sprintf("job%d", job)),
		ConnectTimeout: o.Timeout, LossTimeout: o.Timeout,
	}
	cfg.BufferBytes = int(pageRound(int64(cfg.BufferBytes)))
	return dialConn(ctx, o, cfg, addr, !o.writes() && !o.prefill())
}
