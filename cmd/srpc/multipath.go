package main

// Several --target addresses: gateways of the same volumes, opened as one
// initiator.Multipath for import, export, mount, nbd and reserve; list and
// info ask the first that answers.

import (
	"context"
	"fmt"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/cli"
)

// addTarget is --target's flag function: the first replaces the default,
// each later one is another path.
func (c *connFlags) addTarget(s string) error {
	if s == "" {
		return fmt.Errorf("empty address")
	}
	if !c.targetSet {
		c.target, c.targetSet = s, true
		return nil
	}
	c.paths = append(c.paths, s)
	return nil
}

// copyVolume is what import and export use of a volume: an
// *initiator.Volume, or an *initiator.MultipathVolume when several
// --target paths were given.
type copyVolume interface {
	Name() string
	Size() int64
	BlockSize() int
	Submit(r *initiator.Request) error
	WriteAtContext(ctx context.Context, p []byte, off int64) (int, error)
	Flush(ctx context.Context) error
	Close() error
}

// pathVolume is everything import, export, mount and nbd use of a
// volume: an *initiator.Volume, or an *initiator.MultipathVolume.
type pathVolume interface {
	mountVolume
	WriteAtFUA(ctx context.Context, p []byte, off int64) (int, error)
	Extents(ctx context.Context, off, n int64) ([]initiator.Extent, error)
	Refresh(ctx context.Context) (int64, error)
}

// openCopy opens volume name for import, export, mount or nbd: on one
// target as open does, or through every --target as a Multipath (the
// session then has no *initiator.Session: its buffers are plain, every
// I/O bounced).
func (c *connFlags) openCopy(ctx context.Context, name string, ro bool, qd, bufBytes int) (*session, pathVolume, error) {
	if len(c.paths) == 0 {
		s, v, err := c.open(ctx, name, ro, qd, bufBytes)
		if err != nil {
			return nil, nil, err
		}
		return s, v, nil
	}
	if ro && c.exclusive && c.writes {
		return nil, nil, cli.Usagef("--exclusive and --read-only exclude each other: an exclusive open makes this the volume's one writer")
	}
	if ro {
		c.replay.N = 0
	}
	cfg, prov, secret, err := c.config(qd, 0)
	if err != nil {
		return nil, nil, err
	}
	addrs := append([]string{c.target}, c.paths...)
	dctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	m, err := initiator.DialMultipath(dctx, initiator.MultipathConfig{Config: cfg, Addrs: addrs, FastFail: c.fastFail})
	if err != nil {
		prov.Close()
		return nil, nil, dialError(fmt.Sprint(addrs), c.name, secret != "", err)
	}
	s := &session{prov: prov, mp: m, addr: fmt.Sprint(addrs), name: c.name}
	v, err := m.Open(dctx, name, initiator.OpenOptions{ReadOnly: ro && !c.exclusive, Exclusive: c.exclusive})
	if err != nil {
		s.Close()
		if terr := openTimedOut(name, fmt.Sprintf("the targets %v", addrs), err); terr != nil {
			return nil, nil, terr
		}
		return nil, nil, fmt.Errorf("cannot open volume %q through %v: %v", name, addrs, ioError(err))
	}
	return s, v, nil
}

// maxTransfer is the largest transfer the session's requests may carry.
func (s *session) maxTransfer() int {
	if s.Session == nil {
		return 1 << 20 // the Multipath's paths were dialed asking for it (config)
	}
	return s.MaxTransfer()
}

// allocBuffer is Session.AllocBuffer; a Multipath has no pool of its own
// (each path's session registers its own memory), so it says no.
func (s *session) allocBuffer(n int) ([]byte, error) {
	if s.Session == nil {
		return nil, fmt.Errorf("multipath: no registered buffers")
	}
	return s.AllocBuffer(n)
}
