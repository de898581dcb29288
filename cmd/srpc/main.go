// Command srpc is the gosrp block client: it lists a target's volumes,
// imports and exports images with a progress bar, and mounts a volume as a
// file (DIR/disk) through FUSE so that losetup, mkfs and mount work on it.
//
//	srpc list
//	srpc import vol0 disk.img
//	srpc export vol0 - | sha256sum
//	srpc mount vol0 /mnt/srpc   # then: losetup --direct-io=on -f --show /mnt/srpc/disk
//
// Exit codes: 0 success, 1 I/O or connection failure (one line on stderr),
// 2 usage. Run 'srpc COMMAND --help' for every flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/cli"
	"github.com/gosrp/gosrp/transport"
	_ "github.com/gosrp/gosrp/transport/ibverbs" // RDMA hardware, or a hint on how to build it
)

func main() {
	cli.Main(context.Background(), rootCommand())
}

func rootCommand() *cli.Command {
	return &cli.Command{
		Name:  "srpc",
		Short: "the gosrp block client",
		Long: `srpc talks to a gosrp target (srpd): it lists volumes, copies images in
and out, and mounts a volume as a file for losetup.

The target, initiator name and secret come from flags or from the
environment: SRPC_TARGET, SRPC_NAME, SRPC_SECRET.`,
		Sub: []*cli.Command{listCommand(), infoCommand(), importCommand(), exportCommand(), mountCommand(), nbdCommand(), reserveCommand()},
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// connFlags are the connection flags every command takes.
type connFlags struct {
	target, name, secret, secretFile string
	provider, profile, wire          string
	protocol, srpTarget, srpInit     string
	providerOpts                     []string
	// paths: the --target addresses past the first (multipath.go);
	// targetSet: a --target was given, replacing the default.
	paths           []string
	targetSet       bool
	channels, procs int
	timeout         time.Duration
	fastFail        time.Duration // --fast-fail: the Multipath's FastFail
	replay          cli.SizeFlag  // 0 where registerReplay was not called
	// exclusive: --exclusive (registerExclusive); writes: the command
	// writes (registerReplay), so --read-only and --exclusive clash.
	exclusive, writes bool
}

// registerExclusive adds --exclusive, for the commands that open a
// volume to copy, mount or serve it.
func (c *connFlags) registerExclusive(fs *flag.FlagSet) {
	fs.BoolVar(&c.exclusive, "exclusive", false, "open the volume as its only writer: refused while another session has it open for writing "+
		"or another host reserved it, and while it lasts other sessions' writes fail (their reads work)")
}

func (c *connFlags) register(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	if host == "" {
		host = "srpc"
	}
	c.target = envOr("SRPC_TARGET", "127.0.0.1:4420")
	fs.Func("target", "target `ADDR`: HOST:PORT, or srpd's socket path with --wire shm (env SRPC_TARGET; default 127.0.0.1:4420); "+
		"given more than once (import, export, mount, nbd, reserve): gateways of the same volumes, one path each, failed over between; list and info ask the first that answers", c.addTarget)
	fs.StringVar(&c.name, "name", envOr("SRPC_NAME", host), "initiator `NAME` the target's ACL and secrets know (env SRPC_NAME; default the host name)")
	fs.StringVar(&c.secret, "secret", "", "shared `SECRET` for authentication (visible in ps; prefer --secret-file or SRPC_SECRET)")
	fs.StringVar(&c.secretFile, "secret-file", "", "read the shared secret from `FILE` (one line)")
	fs.StringVar(&c.provider, "provider", "emu", "verbs `PROVIDER`: emu (software NIC) or ibverbs (RDMA hardware; needs a build with -tags ibverbs)")
	fs.StringVar(&c.profile, "profile", "strict", "emu device quirk `PROFILE`: strict, ib, iwarp or rxe")
	fs.StringVar(&c.wire, "wire", "tcp", "emu `WIRE`: tcp (to another process or host) or shm (to srpd on this host, over shared memory)")
	fs.Func("provider-option", "extra provider option `KEY=VALUE` (repeatable); over ibverbs the CQs poll with busy_poll=adaptive unless one is given", func(s string) error {
		if !strings.Contains(s, "=") {
			return fmt.Errorf("want KEY=VALUE, got %q", s)
		}
		c.providerOpts = append(c.providerOpts, s)
		return nil
	})
	fs.StringVar(&c.protocol, "protocol", "gosrp", "`PROTOCOL`: gosrp (srpd's own), or srp: T10 SRP to a standard SRP target (the kernel's ib_srpt, srpd's SRP personality); "+
		"volumes are then the target's LUNs, named lun0, lun1, ...")
	fs.StringVar(&c.srpTarget, "srp-target-port", "", "with --protocol srp: the target port `ID`, 32 hex digits (id_ext then ioc_guid) or ID_EXT,IOC_GUID, as srpd status or the target's configuration names it; "+
		"default all zeros, which srpd accepts when it sets none")
	fs.StringVar(&c.srpInit, "srp-initiator-port", "", "with --protocol srp: the initiator port `ID` (32 hex digits) the target's ACL knows; default derived from --name")
	fs.IntVar(&c.channels, "channels", 1, "`N` connections (queue pairs) to spread I/O over")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "give up on a lost or unreachable target after `DURATION`")
	fs.DurationVar(&c.fastFail, "fast-fail", 0, "with several --target: fail a path's I/O over after it stayed down or silent for `DURATION` "+
		"(0: 1s); a gateway whose address refuses connections is left at once")
	cli.RegisterProcs(fs, &c.procs)
}

// defaultReplay is the replay buffer of the commands that write: 64 MiB
// of copies of unflushed writes covers about a second of writing at
// import speed between the flushes it forces.
const defaultReplay = 64 << 20

// registerReplay adds --replay-buffer, for the commands that write.
func (c *connFlags) registerReplay(fs *flag.FlagSet) {
	c.replay.N = defaultReplay
	c.writes = true
	fs.Var(&c.replay, "replay-buffer", "keep copies of up to `SIZE` of acknowledged, unflushed writes to replay if the target restarts "+
		"and lost them (when full, writes wait for a flush); 0: none, and such a restart fails the next flush")
}

// serveFlags are the flags of the commands that serve a volume on to
// another client, the kernel's FUSE (mount) or an NBD client (nbd): the
// connection's with --replay-buffer and --exclusive, then --read-only
// and --qd, the requests in flight to the target.
type serveFlags struct {
	connFlags
	ro bool
	qd int
}

// register adds the flags; roUsage says what --read-only does for the
// command.
func (f *serveFlags) register(fs *flag.FlagSet, roUsage string) {
	f.connFlags.register(fs)
	f.registerReplay(fs)
	f.registerExclusive(fs)
	fs.BoolVar(&f.ro, "read-only", false, roUsage)
	fs.IntVar(&f.qd, "qd", 64, "`N` requests in flight to the target")
}

// check is the usage check of the flags' values.
func (f *serveFlags) check() error {
	if f.qd < 1 || f.qd > 1024 {
		return cli.Usagef("--qd %d: want 1..1024", f.qd)
	}
	return nil
}

// session is a logged-in session and its provider, with the target
// address and initiator name it was dialled with, for messages.
type session struct {
	*initiator.Session                      // nil for a multipath (mp)
	mp                 *initiator.Multipath // several --target paths (multipath.go)
	prov               transport.Provider
	addr, name         string
}

// noVolume is the one-line message for a volume the target does not
// offer this initiator: missing, or hidden by its ACL, which a target
// does not tell apart.
func (s *session) noVolume(name string) error {
	return fmt.Errorf("no volume %q on %s for initiator %q (srpc list shows what you may open)", name, s.addr, s.name)
}

func (s *session) Close() error {
	var err error
	if s.mp != nil {
		err = s.mp.Close()
	} else {
		err = s.Session.Close()
	}
	s.prov.Close()
	return err
}

// open dials the target and opens volume name on the new session,
// read-only (with nothing to replay) when ro is set; the caller closes
// both.
func (c *connFlags) open(ctx context.Context, name string, ro bool, qd, bufBytes int) (*session, *initiator.Volume, error) {
	if ro && c.exclusive && c.writes {
		return nil, nil, cli.Usagef("--exclusive and --read-only exclude each other: an exclusive open makes this the volume's one writer")
	}
	if p, err := initiator.ParseProtocol(c.protocol); c.exclusive && err == nil && p == initiator.ProtocolSRP {
		// It came back from the initiator as "invalid request", with
		// a hint to srpc list, exit 1.
		return nil, nil, cli.Usagef("--exclusive is gosrp's protocol's: over --protocol srp, reserve the volume instead (srpc reserve --protocol srp)")
	}

	if ro {
		c.replay.N = 0
	}
	s, err := c.dial(ctx, qd, bufBytes)
	if err != nil {
		return nil, nil, err
	}
	// A read-only command with --exclusive (export) opens read-write, the
	// one writer, so that nothing changes the volume under it.
	// A target still opening the volume answers again and again; the
	// open gives up with the dial, after --timeout.
	octx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	v, err := openVolume(octx, s, name, ro && !c.exclusive, c.exclusive)
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	return s, v, nil
}

// list dials the target and lists the volumes this initiator may open;
// the caller closes the session. With several --target paths (gateways
// of the same volumes) it asks the first that answers.
func (c *connFlags) list(ctx context.Context) (*session, []initiator.VolumeInfo, error) {
	var errs []string
	for _, addr := range append([]string{c.target}, c.paths...) {
		s, err := c.dialAddr(ctx, addr, 4, 0)
		if err == nil {
			var vols []initiator.VolumeInfo
			if vols, err = s.Volumes(ctx); err == nil {
				return s, vols, nil
			}
			s.Close()
			err = ioError(err)
		}
		if len(c.paths) == 0 {
			return nil, nil, err
		}
		errs = append(errs, err.Error())
	}
	return nil, nil, fmt.Errorf("no --target answered: %s", strings.Join(errs, "; "))
}

func (c *connFlags) dial(ctx context.Context, qd, bufBytes int) (*session, error) {
	if len(c.paths) > 0 {
		return nil, cli.Usagef("--target given %d times: several paths (multipath) are for list, info, import, export, mount, nbd and reserve only", len(c.paths)+1)
	}
	return c.dialAddr(ctx, c.target, qd, bufBytes)
}

// dialAddr dials one target, addr, as the flags say.
func (c *connFlags) dialAddr(ctx context.Context, addr string, qd, bufBytes int) (*session, error) {
	cfg, prov, secret, err := c.config(qd, bufBytes)
	if err != nil {
		return nil, err
	}
	cfg.Addr = addr
	dctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	s, err := initiator.Dial(dctx, cfg)
	if err != nil {
		prov.Close()
		return nil, dialError(addr, c.name, secret != "", err)
	}
	return &session{Session: s, prov: prov, addr: addr, name: c.name}, nil
}

// config opens the provider and makes the session configuration the
// flags say (Addr: the first --target); the caller closes the provider.
func (c *connFlags) config(qd, bufBytes int) (cfg initiator.Config, prov transport.Provider, secret string, err error) {
	if err := cli.SetProcs(c.procs); err != nil {
		return cfg, nil, "", err
	}
	if c.timeout <= 0 {
		// Zero would give up before the first connect ("timed out"
		// with srpd up), and ConnectTimeout's zero means its default.
		return cfg, nil, "", cli.Usagef("--timeout %s: want a duration above zero", c.timeout)
	}
	opts := transport.Options{}
	if c.provider == "emu" {
		opts["wire"], opts["profile"] = c.wire, c.profile
	}
	for _, kv := range c.providerOpts {
		k, v, _ := strings.Cut(kv, "=")
		opts[k] = v
	}
	prov, err = cli.OpenProvider(c.provider, opts, quietLogger())
	if err != nil {
		return cfg, nil, "", err
	}
	secret = c.secret
	if secret == "" && c.secretFile != "" {
		b, err := os.ReadFile(c.secretFile)
		if err != nil {
			prov.Close()
			return cfg, nil, "", fmt.Errorf("--secret-file: %w", err)
		}
		secret = strings.TrimRight(string(b), "\r\n")
		if secret == "" {
			// Else SRPC_SECRET, or none, would be used behind the
			// operator's back.
			prov.Close()
			return cfg, nil, "", fmt.Errorf("--secret-file %s is empty", c.secretFile)
		}
	}
	if secret == "" {
		secret = os.Getenv("SRPC_SECRET")
	}
	if c.replay.N < 0 {
		prov.Close()
		return cfg, nil, "", cli.Usagef("--replay-buffer %d: want a size of 0 or more", c.replay.N)
	}
	if c.name == "" {
		// The initiator would log in under its library default, a name
		// no ACL or secret of the operator's names.
		prov.Close()
		return cfg, nil, "", cli.Usagef("--name is empty: want the initiator name the target's ACLs and secrets know")
	}
	proto, srpTarget, srpInit, err := c.srpFlags()
	if err != nil {
		prov.Close()
		return cfg, nil, "", err
	}
	cfg = initiator.Config{
		Provider: prov, Addr: c.target, Name: c.name, Channels: c.channels, Credits: qd,
		MaxTransfer: 1 << 20, BufferBytes: bufBytes, ReplayBuffer: int(c.replay.N),
		ConnectTimeout: c.timeout, LossTimeout: c.timeout,
		Logger:   quietLogger(),
		Protocol: proto, SRPTargetPortID: srpTarget, SRPInitiatorPortID: srpInit,
	}
	if secret != "" {
		cfg.Secret = []byte(secret)
	}
	return cfg, prov, secret, nil
}

// srpFlags reads --protocol and the SRP port identifiers.
func (c *connFlags) srpFlags() (proto initiator.Protocol, tgt, ini [16]byte, err error) {
	if proto, err = initiator.ParseProtocol(c.protocol); err != nil {
		return proto, tgt, ini, cli.Usagef("--protocol %q: want gosrp or srp", c.protocol)
	}
	if proto != initiator.ProtocolSRP {
		if c.srpTarget != "" || c.srpInit != "" {
			return proto, tgt, ini, cli.Usagef("--srp-target-port and --srp-initiator-port need --protocol srp")
		}
		return proto, tgt, ini, nil
	}
	if c.srpTarget != "" {
		if tgt, err = initiator.ParseSRPPortID(c.srpTarget); err != nil {
			return proto, tgt, ini, cli.Usagef("--srp-target-port %q: want 32 hex digits (id_ext then ioc_guid) or ID_EXT,IOC_GUID", c.srpTarget)
		}
	}
	if c.srpInit != "" {
		if ini, err = initiator.ParseSRPPortID(c.srpInit); err != nil {
			return proto, tgt, ini, cli.Usagef("--srp-initiator-port %q: want 32 hex digits", c.srpInit)
		}
	}
	return proto, tgt, ini, nil
}

func dialError(target, name string, haveSecret bool, err error) error {
	var le *initiator.LoginError
	switch {
	case errors.As(err, &le):
		why := le.Reason.String()
		if le.Message != "" && le.Message != why {
			why += ": " + le.Message
		}
		return fmt.Errorf("target %s refused the login of initiator %q: %s", target, name, why)
	case errors.Is(err, initiator.ErrAuth) && !haveSecret:
		return fmt.Errorf("target %s wants initiator %q to authenticate: pass its secret with --secret-file or SRPC_SECRET", target, name)
	case errors.Is(err, initiator.ErrAuth):
		// A target that checked our proof knows the secret and proves it
		// (target/core.go onProof); one that did not ask has no secret for
		// this initiator, or is not the target that shares it.
		return fmt.Errorf("target %s did not ask initiator %q for a secret: it has none for it (add one there with 'srpd secret set'), "+
			"or it is not the target that shares yours", target, name)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("cannot reach a target at %s: timed out", target)
	case errors.Is(err, syscall.ENOMEM):
		// Not the target's doing: the session's own buffers.
		return fmt.Errorf("not enough memory for the session: %s (lower --replay-buffer or --qd)", strings.TrimPrefix(err.Error(), "initiator: "))
	}
	// The address itself: the layers between (provider, wire, dial)
	// would each repeat it.
	if dnsErr, ok := errors.AsType[*net.DNSError](err); ok {
		return fmt.Errorf("cannot reach a target at %s: no such host %q", target, dnsErr.Name)
	}
	if addrErr, ok := errors.AsType[*net.AddrError](err); ok {
		return fmt.Errorf("cannot reach a target at %s: %s (want HOST:PORT, e.g. 127.0.0.1:4420)", target, addrErr.Err)
	}
	if fe, ok := errors.AsType[*transport.ForeignPeerError](err); ok {
		// srpd's default port, 4420, is NVMe/TCP's too.
		return fmt.Errorf("cannot connect to %s: something else listens there, not a gosrp target (it answered %q)", target, fe.Answer)
	}
	if errors.Is(err, transport.ErrRefused) || errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("cannot reach a target at %s: connection refused (is srpd running? --target or SRPC_TARGET)", target)
	}
	return fmt.Errorf("cannot connect to %s: %s", target, strings.TrimPrefix(err.Error(), "initiator: "))
}

// ioError shortens an initiator error to one line a user can act on.
func ioError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, initiator.ErrVolumeGone) {
		return errors.New("the target no longer has the volume since the connection was down (its LUN is not supported now: " +
			"deleted, or created again under another LUN): what was written to it may be lost; nothing was written elsewhere")
	}
	if errors.Is(err, initiator.ErrVolumeReplaced) {
		return errors.New("the volume was replaced by another of the same name while the connection was down " +
			"(deleted and created again, or another target at the address): what was written to the old one is not on it; " +
			"nothing was written to the new one")
	}
	if errors.Is(err, initiator.ErrVolumeLost) {
		return errors.New("the target restarted and lost the volume, which it kept in memory (srpd --backend memory), " +
			"what was flushed too: write the data again")
	}
	if errors.Is(err, initiator.ErrWriteCacheLost) {
		if _, scsi := errors.AsType[*initiator.SCSIError](err); scsi {
			// T10 SRP: the target's report (a restarted srpd's) is
			// all there is; the initiator cannot tell what was lost,
			// so it has nothing to replay.
			return errors.New("the target reports it lost writes it had acknowledged (it restarted), " +
				"so what they wrote is unknown: write the data again")
		}
		return errors.New("the target restarted and lost writes it had acknowledged but not yet flushed, " +
			"so what they wrote is unknown: write the data again (--replay-buffer, on by default, replays them instead)")
	}
	return errors.New(strings.TrimPrefix(err.Error(), "initiator: "))
}
