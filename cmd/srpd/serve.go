package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/cli"
	"github.com/gosrp/gosrp/internal/gateway"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport"
	_ "github.com/gosrp/gosrp/transport/ibverbs" // RDMA hardware, or a hint on how to build it
)

var (
	serveFlags = defaultConfig()
	configPath string
)

func setServeFlags(fs *flag.FlagSet) {
	fs.StringVar(&configPath, "config", "", "read settings from `FILE` (JSON if it ends in .json, TOML otherwise); flags override it")
	serveFlags.register(fs)
}

const serveLong = `Serve the volumes of a data directory to initiators (the default command).

On a data directory with no volumes, srpd creates vol0 (1 GiB, 4096-byte
blocks) unless --no-default-volume is given. The admin socket DIR/srpd.sock
answers 'srpd volume', 'srpd snapshot', 'srpd acl', 'srpd secret' and
'srpd status'. SIGTERM or SIGINT stops accepting, drains in-flight I/O for
at most --shutdown-timeout, flushes the store and exits 0; a second signal
exits at once. A store that cannot close within another --shutdown-timeout
(an rbd cluster that does not answer) is left behind: srpd exits 1.`

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, cli.Usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, cli.Usagef("--log-format %q: want text or json", format)
}

// providerOptions are the options srpd opens its provider with: the
// emu flags, --provider-option's, and over real verbs cli.BusyPoll if
// they name no busy_poll. srpd adds it here, not leaving it to
// cli.OpenProvider, so that its serving line can say it.
func providerOptions(c *Config) transport.Options {
	o := transport.Options{}
	if c.Provider == "emu" {
		o["wire"] = c.Wire
		o["profile"] = c.Profile
	}
	for k, v := range c.ProviderOptions {
		o[k] = v
	}
	return cli.WithBusyPoll(c.Provider, o)
}

// dataDirMode is the mode srpd creates its data directory with: the
// volumes, secrets and admin socket in it are the daemon user's alone,
// whatever the umask.
const dataDirMode = 0o700

// makeDataDir creates the data directory if it is missing. One that
// exists with access for others is left as the operator made it, with a
// warning (unless log is nil: the caller has given it): everything under
// it is then reachable for them as far as each file's own mode allows.
func makeDataDir(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, dataDirMode); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 && log != nil {
		log.Warn("the data directory is open to other users; chmod 700 it to keep them from the volumes",
			"data", dir, "mode", fmt.Sprintf("%#o", perm))
	}
	return nil
}

// openStore opens the data directory's store with a logger for pebble's
// errors and a clear message when another srpd holds it. cfg supplies the
// space settings (nil: the defaults, as for the offline admin commands).
func openStore(backend, dir string, log *slog.Logger, cfg *Config) (block.Store, error) {
	warn := log
	if cfg != nil {
		warn = nil // serve made the directory and warned already
	}
	if backend == "" || backend == "pebble" {
		if err := makeDataDir(dir, warn); err != nil {
			return nil, err
		}
		o := &block.PebbleOptions{Logger: slog.NewLogLogger(log.Handler(), slog.LevelError), SpaceLog: log}
		if cfg != nil {
			o.SpaceReserve, o.MaxOvercommit = int64(cfg.SpaceReserve), cfg.MaxOvercommit
		}
		s, err := block.OpenPebbleStore(dir, o)
		if err != nil && lockHeld(err) {
			return nil, fmt.Errorf("data directory %s is in use by another srpd (%v)", dir, err)
		}
		return s, err
	}
	if backend == "file" {
		if err := makeDataDir(dir, warn); err != nil {
			return nil, err
		}
	}
	if backend == "rbd" {
		if cfg == nil {
			return nil, fmt.Errorf("--backend rbd: no pool given")
		}
		// Exclusive: srpd serves every image it opens, so it holds each
		// one's lock; another gateway must break it (fencing this one)
		// before it serves the image.
		return block.OpenRBDStore(block.RBDOptions{ConfFile: cfg.CephConf, Pool: cfg.RBDPool, Namespace: cfg.RBDNamespace, Exclusive: true})
	}
	return block.OpenStore(backend, dir)
}

// lockHeld reports whether opening a store failed because its lock is
// held: by another process (flock's EWOULDBLOCK), or by this one (pebble
// keeps a registry of the locks it holds). Any other failure (a read-only
// file system, a permission, a directory that is no store) must be told
// as what it is, not as another srpd.
func lockHeld(err error) bool {
	return errors.Is(err, syscall.EWOULDBLOCK) || strings.Contains(err.Error(), "lock held by")
}

// listenNeedsData reports whether the listen address is a socket path
// inside the data directory (shm), which must then exist before srpd
// listens on it.
func listenNeedsData(cfg Config) bool {
	if cfg.Provider != "emu" || cfg.Wire != "shm" {
		return false
	}
	rel, err := filepath.Rel(cfg.Data, filepath.Dir(cfg.Listen))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// warnOpenMetrics says so when the metrics endpoint, which has no
// authentication, listens on every interface (--metrics :9625).
func warnOpenMetrics(log *slog.Logger, addr net.Addr) {
	if ta, ok := addr.(*net.TCPAddr); ok && ta.IP.IsUnspecified() {
		log.Warn("the metrics endpoint listens on every interface, unauthenticated; give a host (--metrics 127.0.0.1:PORT) to keep it local",
			"metrics", addr.String())
	}
}

func runServe(ctx context.Context, fs *flag.FlagSet, args []string) error {
	if len(args) > 0 {
		return cli.Usagef("unexpected argument %q (serve takes only flags; see --help)", args[0])
	}
	cfg := serveFlags
	if configPath != "" {
		var err error
		if cfg, err = loadConfig(configPath); err != nil {
			return err
		}
		if err := cfg.applyFlags(fs); err != nil {
			return err
		}
		for k, v := range serveFlags.ProviderOptions {
			if cfg.ProviderOptions == nil {
				cfg.ProviderOptions = map[string]string{}
			}
			cfg.ProviderOptions[k] = v
		}
	}
	if cfg.Pprof && cfg.Metrics == "" {
		return cli.Usagef("--pprof serves on the --metrics address: give --metrics HOST:PORT too")
	}
	if err := checkBackend(cfg); err != nil {
		return err
	}
	if err := cli.SetProcs(cfg.Procs); err != nil {
		return err
	}
	log, err := newLogger(cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	slog.SetDefault(log)
	return serve(ctx, cfg, log)
}

// checkBackend refuses, before anything is opened, an rbd backend this
// build cannot serve or one with no pool.
func checkBackend(cfg Config) error {
	if cfg.Backend != "rbd" {
		return nil
	}
	if !block.RBDSupported {
		return errors.New("--backend rbd: srpd was built without Ceph support; build with -tags ceph,pacific")
	}
	if cfg.RBDPool == "" {
		return cli.Usagef("--backend rbd needs --rbd-pool POOL (or rbd_pool in the config file)")
	}
	return nil
}

func serve(ctx context.Context, cfg Config, log *slog.Logger) error {
	// Signals are caught from the start: a SIGTERM that comes while srpd
	// starts (a supervisor that stops it as soon as its admin socket
	// answers) waits for the start to finish, then drains and closes the
	// store, rather than killing srpd with its store open
	// (TestSignalWhileStarting). The first signal asks for the drain
	// (stop); a second exits at once.
	stop := make(chan os.Signal, 1)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	served := make(chan struct{})
	defer func() {
		signal.Stop(sigs)
		close(served)
	}()
	go func() {
		for n := 0; ; n++ {
			select {
			case s := <-sigs:
				if n == 0 {
					stop <- s
					continue
				}
				log.Error("second signal: exiting at once", "signal", s.String())
				os.Exit(1)
			case <-served:
				return
			}
		}
	}()
	popts := providerOptions(&cfg)
	prov, err := cli.OpenProvider(cfg.Provider, popts, log)
	if err != nil {
		return err
	}
	defer prov.Close()

	if cfg.SpaceReserve < 0 {
		return cli.Usagef("--space-reserve %d: want a size >= 0", cfg.SpaceReserve)
	}
	if _, err := block.ParseBackend(cfg.Backend); err != nil {
		return cli.Usagef("--backend %q: want %s", cfg.Backend, strings.Join(block.Backends, ", "))
	}
	if n := int64(cfg.DefaultSize); !cfg.NoDefaultVolume && (n <= 0 || n%DefaultBlockSize != 0) {
		// Checked before the store is made: a failed start leaves the
		// disk as it found it.
		return cli.Usagef("--default-volume-size %d: want a size above 0 in whole %d-byte blocks (e.g. 1GiB)", n, DefaultBlockSize)
	}
	if cfg.ShutdownTimeout <= 0 {
		// Zero left no time to close the store: every stop, idle or not,
		// exited 1 without closing it.
		return cli.Usagef("--shutdown-timeout %s: want a duration above zero", time.Duration(cfg.ShutdownTimeout))
	}
	if cfg.OpenWait < 0 {
		return cli.Usagef("--open-wait %s: want a duration of zero (the default) or more", time.Duration(cfg.OpenWait))
	}
	portGroup, err := cfg.srpPortGroup()
	if err != nil {
		return err
	}
	srpPort, err := cfg.srpTargetPort()
	if err != nil {
		return err
	}
	// Everything that can be refused by the host (the ports, the metrics
	// address) is taken before the store is opened, so a failed start
	// leaves the disk as it found it: no data directory, no vol0.
	if listenNeedsData(cfg) {
		if err := makeDataDir(cfg.Data, log); err != nil {
			return err
		}
	}
	ln, err := prov.Listen(ctx, cfg.Listen)
	if err != nil {
		return listenError("--listen", cfg.Listen, err)
	}
	lnOwned := true
	defer func() {
		if lnOwned {
			ln.Close()
		}
	}()
	var mln net.Listener
	if cfg.Metrics != "" {
		if mln, err = net.Listen("tcp", cfg.Metrics); err != nil {
			return listenError("--metrics", cfg.Metrics, err)
		}
		defer mln.Close() // after the server's own Close: a second Close only errs
		warnOpenMetrics(log, mln.Addr())
	}
	if err := makeDataDir(cfg.Data, log); err != nil {
		return err
	}
	lock, err := lockDataDir(cfg.Data)
	if err != nil {
		return err
	}
	defer lock.Close()
	store, err := openStore(cfg.Backend, cfg.Data, log, &cfg)
	if err != nil {
		return err
	}
	storeClosed := false
	defer func() {
		if !storeClosed {
			store.Close()
		}
	}()
	if err := lock.setBackend(canonicalBackend(cfg.Backend)); err != nil {
		return fmt.Errorf("data directory: record the backend: %w", err)
	}
	acc, err := loadAccess(cfg.Data)
	if err != nil {
		return err
	}
	// Read before vol0 is made: a state file that cannot be read fails
	// the start with the disk as it was.
	res := openReservations(cfg.Data)
	saved, err := res.LoadReservations()
	if err != nil {
		return fmt.Errorf("reservations: %w", err)
	}
	if _, err := openLUNFile(cfg.Data).LoadLUNs(); err != nil {
		return fmt.Errorf("SRP LUN map: %w", err)
	}
	marks, err := openDirtyMarks(cfg.Data, cfg.Backend == "file")
	if err != nil {
		return err
	}
	vols, err := store.List()
	if err != nil {
		return err
	}
	if len(vols) == 0 && !cfg.NoDefaultVolume {
		v, err := store.Create(DefaultVolume, int64(cfg.DefaultSize), DefaultBlockSize)
		switch {
		case errors.Is(err, block.ErrNoSpace):
			// A small disk under --max-overcommit: serve without vol0
			// rather than refuse to start.
			log.Warn("default volume not created: over the thin-provisioning bound (see --max-overcommit, --default-volume-size)",
				"volume", DefaultVolume, "size", cli.FormatSize(int64(cfg.DefaultSize)), "err", err)
		case err != nil:
			return fmt.Errorf("create default volume %s: %w", DefaultVolume, err)
		default:
			v.Close()
			log.Info("created default volume", "volume", DefaultVolume, "size", cli.FormatSize(int64(cfg.DefaultSize)),
				"block_size", DefaultBlockSize, "data", cfg.Data)
		}
	}

	// The gateway catalog serves a shared store's volumes (rbd) as one
	// gateway of several: active when it holds a volume's lock, standby
	// otherwise, and taking it over when an initiator asks; other
	// stores' volumes pass through, always active.
	cat := gateway.NewWithOptions(store, gateway.Options{Limit: gateway.Limit(cfg.BreakLimit)})
	// A shared store's reservations live with its volumes, where the
	// gateway that takes a volume over finds them (reservations.go).
	var resStore target.ReservationStore = res
	shared, isShared := store.(block.VolumeMetadata)
	if isShared = isShared && cat.Shared(); isShared {
		resStore = sharedReservations{shared}
		for name := range saved {
			// An srpd before this one kept a gateway's reservations
			// here, where the other gateways could not see them.
			log.Warn("reservations recorded in the data directory are not used by a gateway (it keeps them with the images): make them again",
				"volume", name, "file", filepath.Join(cfg.Data, reservationsFile))
		}
	}
	tgt, err := target.New(target.Config{
		Name: cfg.Name, Catalog: cat, ACL: acc.ACLPointer(), Secrets: acc.Secret,
		Credits: cfg.Credits, SRPCredits: cfg.SRPCredits, MaxTransfer: int(cfg.MaxTransfer), LoginTimeout: time.Duration(cfg.LoginTimeout),
		OpenWait:         time.Duration(cfg.OpenWait),
		MaxPendingLogins: cfg.MaxPendingLogins, MaxPendingPerSource: cfg.MaxPendingPerSource,
		MaxConnections: cfg.MaxConnections, MaxConnectionsPerSource: cfg.MaxConnectionsPerSource,
		SRPTargetPortID: srpPort, SRPPortGroup: portGroup, Logger: log, Reservations: resStore, DirtyMarks: marks, LUNs: openLUNFile(cfg.Data),
	})
	if err != nil {
		return err
	}
	// A volume's state change reaches the initiators that have it open
	// at once (a path notice), not at their next I/O.
	cat.OnStateChange(func(name string, s gateway.State) {
		log.Info("volume path state changed", "volume", name, "state", s)
		gateway.Tell(tgt, name, s)
	})
	if isShared {
		cat.BeforeActive(func(name string) error {
			err := sharedReservations{shared}.load(tgt, name)
			if err != nil {
				// The volume stays standby here, whoever asked: the
				// operator must learn why from this gateway's log.
				log.Error("volume not served: this gateway cannot use the reservations recorded with it",
					"volume", name, "key", reservationsKey, "err", err)
			}
			return err
		})
	}
	setLive(tgt, acc)

	lnOwned = false // tgt.Serve closes it
	serveErr := make(chan error, 3)
	go func() { serveErr <- tgt.Serve(context.Background(), ln) }()

	svc := &service{store: store, access: acc, tgt: tgt, cat: cat, status: admin.Status{
		Target: cfg.Name, Listen: ln.Addr(), Provider: cfg.Provider, Metrics: cfg.Metrics, Data: cfg.Data, Started: time.Now(), ACLLive: true,
		SRP: srpStatus(srpPort, ln.Addr(), portGroup),
	}}
	sockPath := filepath.Join(cfg.Data, admin.SocketName)
	// The store is ours (pebble's lock), so a socket file left here is stale.
	os.Remove(sockPath)
	adminLn, err := net.Listen("unix", sockPath)
	if err != nil {
		tgt.Shutdown(context.Background())
		return fmt.Errorf("admin socket: %w", err)
	}
	os.Chmod(sockPath, 0o600)
	adminSrv := &http.Server{Handler: admin.Handler(svc), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := adminSrv.Serve(adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			serveErr <- fmt.Errorf("admin socket: %w", err)
		}
	}()

	var metricsSrv *http.Server
	if mln != nil {
		mux := http.NewServeMux()
		var gw func() []gateway.VolumeStats
		if cat.Shared() {
			gw = cat.Stats
		}
		mux.Handle("/metrics", promhttp.HandlerFor(newRegistry(tgt, store, acceptErrors(prov), gw), promhttp.HandlerOpts{}))
		if cfg.Pprof {
			// The standard profiling endpoints, as net/http/pprof serves
			// them, only where the operator asked: they expose stacks.
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := metricsSrv.Serve(mln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				serveErr <- fmt.Errorf("metrics: %w", err)
			}
		}()
		svc.status.Metrics = mln.Addr().String()
	}
	vols, _ = store.List()
	names := make([]string, len(vols))
	for i, v := range vols {
		names[i] = v.Name
	}
	attrs := []any{"listen", ln.Addr(), "provider", cfg.Provider, "data", cfg.Data,
		"volumes", strings.Join(names, ","), "admin", sockPath, "metrics", svc.status.Metrics}
	if bp, ok := popts["busy_poll"]; ok {
		// How the CQ waiters wait decides latency and CPU use: say it.
		attrs = append(attrs, "busy_poll", bp)
	}
	log.Info("serving", attrs...)

	var runErr error
	select {
	case s := <-stop:
		log.Info("shutting down", "signal", s.String(), "deadline", time.Duration(cfg.ShutdownTimeout).String())
	case <-ctx.Done():
	case runErr = <-serveErr:
		log.Error("serve failed", "err", runErr)
	}

	adminSrv.Close()
	os.Remove(sockPath)
	sctx, cancel := context.WithTimeout(context.Background(), time.Duration(cfg.ShutdownTimeout))
	defer cancel()
	if err := tgt.Shutdown(sctx); err != nil {
		log.Warn("connections did not end before the shutdown deadline", "err", err)
	}
	if metricsSrv != nil {
		metricsSrv.Close()
	}
	storeClosed = true
	if err := closeStore(store, time.Duration(cfg.ShutdownTimeout)); err != nil {
		log.Error("closing the store", "err", err)
		if runErr == nil {
			runErr = err
		}
	} else {
		// A memory store forgets everything at exit, clean or not: its
		// marks stay, and the next start reports the loss to the SRP
		// hosts (target's volMark.volatile).
		if canonicalBackend(cfg.Backend) != "memory" {
			if err := marks.clearAll(); err != nil {
				log.Warn("clearing the dirty marks after a clean stop; the next start reports a lost write cache to SRP hosts", "err", err)
			}
		}
		log.Info("stopped; the store is flushed", "data", cfg.Data)
	}
	return runErr
}

// closeStore closes the store (flushing it), waiting at most within. A
// store whose cluster does not answer must not keep srpd from exiting:
// an rbd volume's requests wait for an OSD as long as it is stopped, and
// librbd's close waits for them (test/ceph TestRBDStopOSDStalled). Past
// within, the close is left to the process's exit, which ends it: what
// it had not flushed was never acknowledged as flushed to a host, whose
// connections are cut by then.
func closeStore(store block.Store, within time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- store.Close() }()
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("the store did not close within %v (its cluster does not answer?); exiting without it", within)
	}
}

// listenError says in one line why srpd cannot listen at addr (given by
// flag), without the layers between (provider, wire, net) each
// repeating the address.
func listenError(flag, addr string, err error) error {
	var why string
	switch addrErr, isAddr := errors.AsType[*net.AddrError](err); {
	case errors.Is(err, syscall.EADDRINUSE):
		why = "address in use: another srpd, or another service, has it; choose another " + flag
	case errors.Is(err, syscall.EACCES):
		why = "permission denied (a port below 1024 needs root)"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		why = "no interface of this host has that address"
	case isAddr:
		why = addrErr.Err + " (want HOST:PORT, e.g. 127.0.0.1:4420)"
	case errors.As(err, new(*net.DNSError)):
		why = "no such host"
	default:
		return fmt.Errorf("%s %s: %w", flag, addr, err)
	}
	return fmt.Errorf("%s %s: %s", flag, addr, why)
}
