package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/gosrp/gosrp/internal/cli"
	"github.com/gosrp/gosrp/internal/gateway"
)

// Defaults of the daemon.
const (
	DefaultListen     = "127.0.0.1:4420"
	DefaultData       = "./srpd-data"
	DefaultVolume     = "vol0"
	DefaultVolumeSize = 1 << 30
	DefaultBlockSize  = 4096
)

// Config is srpd's configuration: the --config file (JSON or TOML, keys as
// below) with command-line flags layered on top.
type Config struct {
	Listen          string            `json:"listen" toml:"listen"`
	Data            string            `json:"data" toml:"data"`
	Backend         string            `json:"backend" toml:"backend"`
	Provider        string            `json:"provider" toml:"provider"`
	Profile         string            `json:"profile" toml:"profile"`
	Wire            string            `json:"wire" toml:"wire"`
	ProviderOptions map[string]string `json:"provider_options" toml:"provider_options"`
	Metrics         string            `json:"metrics" toml:"metrics"`
	Pprof           bool              `json:"pprof" toml:"pprof"`
	Procs           int               `json:"procs" toml:"procs"`
	LogLevel        string            `json:"log_level" toml:"log_level"`
	LogFormat       string            `json:"log_format" toml:"log_format"`
	Name            string            `json:"name" toml:"name"`
	NoDefaultVolume bool              `json:"no_default_volume" toml:"no_default_volume"`
	DefaultSize     Size              `json:"default_volume_size" toml:"default_volume_size"`
	Credits         int               `json:"credits" toml:"credits"`
	SRPCredits      int               `json:"srp_credits" toml:"srp_credits"`
	MaxTransfer     Size              `json:"max_transfer" toml:"max_transfer"`
	LoginTimeout    Duration          `json:"login_timeout" toml:"login_timeout"`
	// OpenWait is target.Config.OpenWait (0: the target's default).
	OpenWait Duration `json:"open_wait" toml:"open_wait"`
	// MaxPendingLogins and MaxPendingPerSource are target.Config's caps
	// on connections not logged in yet (0: the target's defaults,
	// negative: no cap).
	MaxPendingLogins    int `json:"max_pending_logins" toml:"max_pending_logins"`
	MaxPendingPerSource int `json:"max_pending_per_source" toml:"max_pending_per_source"`
	// MaxConnections and MaxConnectionsPerSource are target.Config's
	// caps on all connections, logged in or not (0: the target's
	// defaults, negative: no cap).
	MaxConnections          int      `json:"max_connections" toml:"max_connections"`
	MaxConnectionsPerSource int      `json:"max_connections_per_source" toml:"max_connections_per_source"`
	ShutdownTimeout         Duration `json:"shutdown_timeout" toml:"shutdown_timeout"`
	// SpaceReserve and MaxOvercommit are the pebble store's
	// block.PebbleOptions of the same names (0: the defaults).
	SpaceReserve  Size    `json:"space_reserve" toml:"space_reserve"`
	MaxOvercommit float64 `json:"max_overcommit" toml:"max_overcommit"`
	// SRPIDExt and SRPIOCGUID are the SRP target port identifier's two
	// halves in hex (srp.go): the id_ext and ioc_guid an ib_srp
	// add_target line names. Empty: any is accepted.
	SRPIDExt   string `json:"srp_id_ext" toml:"srp_id_ext"`
	SRPIOCGUID string `json:"srp_ioc_guid" toml:"srp_ioc_guid"`
	// SRPPortGroup is target.Config.SRPPortGroup: this gateway's ALUA
	// target port group for SRP hosts (0: ALUA off).
	SRPPortGroup int `json:"srp_port_group" toml:"srp_port_group"`
	// RBDPool, RBDNamespace and CephConf place the rbd backend's volumes
	// (block.RBDOptions); the data directory then holds only the admin
	// socket and access.json.
	RBDPool      string `json:"rbd_pool" toml:"rbd_pool"`
	RBDNamespace string `json:"rbd_namespace" toml:"rbd_namespace"`
	CephConf     string `json:"ceph_conf" toml:"ceph_conf"`
	// BreakLimit is gateway.Options.Limit: how often this gateway may
	// break one volume's lock ("3/1m"; empty: no bound).
	BreakLimit BreakLimit `json:"break_limit" toml:"break_limit"`
}

func defaultConfig() Config {
	return Config{
		Listen: DefaultListen, Data: DefaultData, Backend: "pebble", Provider: "emu", Profile: "strict",
		Wire: "tcp", LogLevel: "info", LogFormat: "text", Name: "gosrp",
		DefaultSize: Size(DefaultVolumeSize), ShutdownTimeout: Duration(30 * time.Second),
		LoginTimeout: Duration(10 * time.Second),
	}
}

// register binds the serve flags to c.
func (c *Config) register(fs *flag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "serve initiators on `ADDR`: HOST:PORT, or a socket path with --wire shm")
	fs.StringVar(&c.Data, "data", c.Data, "`DIR` holding the volume store, the admin socket srpd.sock and access.json")
	fs.StringVar(&c.Backend, "backend", c.Backend, "volume store `KIND`: pebble, file, memory (forgets everything at exit) or rbd (Ceph RBD images; needs a build with -tags ceph,pacific)")
	fs.StringVar(&c.Provider, "provider", c.Provider, "verbs `PROVIDER`: emu (software NIC) or ibverbs (RDMA hardware; needs a build with -tags ibverbs)")
	fs.StringVar(&c.Profile, "profile", c.Profile, "emu device quirk `PROFILE`: strict, ib, iwarp or rxe")
	fs.StringVar(&c.Wire, "wire", c.Wire, "emu `WIRE` between the hosts: tcp (between processes or hosts), shm (between processes on this host, over shared memory) or loop (in-process only)")
	fs.Func("provider-option", "extra provider option `KEY=VALUE` (repeatable), e.g. seed=1; over ibverbs srpd polls with busy_poll=adaptive unless one is given", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VALUE, got %q", s)
		}
		if c.ProviderOptions == nil {
			c.ProviderOptions = map[string]string{}
		}
		c.ProviderOptions[k] = v
		return nil
	})
	fs.StringVar(&c.Metrics, "metrics", c.Metrics, "serve Prometheus /metrics on `HOST:PORT` (off when empty)")
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "also serve Go's /debug/pprof/ profiles on the --metrics address")
	cli.RegisterProcs(fs, &c.Procs)
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log `LEVEL`: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log `FORMAT`: text or json")
	fs.StringVar(&c.Name, "name", c.Name, "target `NAME` reported to initiators at login")
	fs.BoolVar(&c.NoDefaultVolume, "no-default-volume", c.NoDefaultVolume, "do not create vol0 when the store has no volumes")
	fs.Var(&c.DefaultSize, "default-volume-size", "`SIZE` of the default volume vol0 (KiB, MiB, GiB, TiB)")
	fs.IntVar(&c.Credits, "credits", c.Credits, "`N` requests one connection may have outstanding (0: the target default, 32)")
	fs.IntVar(&c.SRPCredits, "srp-credits", c.SRPCredits, "`N` requests one SRP channel may have outstanding, its login's request limit (0: the target default, 64, which lets ib_srp's default queue of 62 run full: it keeps one credit for task management; each costs a --max-transfer buffer)")
	fs.Var(&c.MaxTransfer, "max-transfer", "largest transfer of one command, a `SIZE` (0: the target default, 1MiB)")
	fs.Var(&c.LoginTimeout, "login-timeout", "`DURATION` a new connection has to log in")
	fs.Var(&c.OpenWait, "open-wait", "`DURATION` a login or OPEN waits for a volume's store to open it before it answers NOT READY for that volume and adds it once it opens (0: the target default, 5s)")
	fs.IntVar(&c.MaxPendingLogins, "max-pending-logins", c.MaxPendingLogins,
		"refuse connections beyond `N` accepted and not logged in yet (0: the target default, 64; negative: no cap)")
	fs.IntVar(&c.MaxPendingPerSource, "max-pending-per-source", c.MaxPendingPerSource,
		"refuse connections beyond `N` not logged in yet from one source host (0: the target default, 16; negative: no cap)")
	fs.IntVar(&c.MaxConnections, "max-connections", c.MaxConnections,
		"refuse connections beyond `N`, logged in or not (0: the target default, 1024; negative: no cap)")
	fs.IntVar(&c.MaxConnectionsPerSource, "max-connections-per-source", c.MaxConnectionsPerSource,
		"refuse connections beyond `N` from one source host, logged in or not (0: the target default, 256; negative: no cap)")
	fs.Var(&c.ShutdownTimeout, "shutdown-timeout", "on SIGTERM, the `DURATION` in-flight I/O may take to drain")
	fs.Var(&c.SpaceReserve, "space-reserve", "free `SIZE` the pebble store keeps on its file system; writes fail with ENOSPC below it (0: max(64MiB, 1% of the file system, two memtables), at most a quarter of it)")
	fs.StringVar(&c.SRPIDExt, "srp-id-ext", c.SRPIDExt, "SRP target port identifier extension `ID`, 16 hex digits: the id_ext of the kernel ib_srp's add_target line (with --srp-ioc-guid; unset: any is accepted)")
	fs.Var(&c.BreakLimit, "break-limit", "with --backend rbd: break one volume's lock at most `N/DURATION` times (e.g. 3/1m), refusing takeovers past that unless the lock is free; bounds the blocklist entries of hosts that take a volume back and forth (default: no bound)")
	fs.IntVar(&c.SRPPortGroup, "srp-port-group", c.SRPPortGroup, "this gateway's ALUA target port group `N` (1-65535, a different one on each gateway of an rbd image) for SRP hosts: INQUIRY then reports ALUA, REPORT TARGET PORT GROUPS a volume's state here, and SET TARGET PORT GROUPS takes it over (0: ALUA off)")
	fs.StringVar(&c.SRPIOCGUID, "srp-ioc-guid", c.SRPIOCGUID, "SRP I/O controller `GUID`, 16 hex digits (colons allowed): the ioc_guid of ib_srp's add_target line (with --srp-id-ext)")
	fs.StringVar(&c.RBDPool, "rbd-pool", c.RBDPool, "with --backend rbd: the Ceph `POOL` holding the volumes (RBD images)")
	fs.StringVar(&c.RBDNamespace, "rbd-namespace", c.RBDNamespace, "with --backend rbd: an RBD `NAMESPACE` of the pool (optional; must exist)")
	fs.StringVar(&c.CephConf, "ceph-conf", c.CephConf, "with --backend rbd: the cluster's ceph.conf `FILE` (empty: $CEPH_CONF, then /etc/ceph/ceph.conf)")
	fs.Float64Var(&c.MaxOvercommit, "max-overcommit", c.MaxOvercommit, "volume sizes may total at most `RATIO` times the file system's size (thin provisioning; 0: 10, negative: unbounded)")
}

// loadConfig reads a JSON (.json) or TOML (anything else) config file over
// the defaults; unknown keys are an error.
func loadConfig(path string) (Config, error) {
	c := defaultConfig()
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	if strings.EqualFold(filepath.Ext(path), ".json") {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return c, fmt.Errorf("config %s: %w", path, err)
		}
		return c, nil
	}
	md, err := toml.Decode(string(b), &c)
	if err != nil {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return c, fmt.Errorf("config %s: unknown key %q", path, und[0].String())
	}
	return c, nil
}

// applyFlags copies the flags set on the command line (fs, bound to
// another Config) onto c, so that flags override the file.
func (c *Config) applyFlags(fs *flag.FlagSet) error {
	over := flag.NewFlagSet("config", flag.ContinueOnError)
	c.register(over)
	var err error
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "config" || err != nil {
			return
		}
		if f.Name == "provider-option" {
			return // accumulated into the flag-bound map; merged below
		}
		if over.Lookup(f.Name) != nil {
			err = over.Set(f.Name, f.Value.String())
		}
	})
	return err
}

// Size is a byte count that reads "256MiB" or a plain number.
type Size int64

func (s *Size) String() string { return (&cli.SizeFlag{N: int64(*s)}).String() }

// Set implements flag.Value.
func (s *Size) Set(v string) error {
	n, err := cli.ParseSize(v)
	*s = Size(n)
	return err
}

// UnmarshalText reads a size string.
func (s *Size) UnmarshalText(b []byte) error { return s.Set(string(b)) }

// UnmarshalJSON reads a number or a size string.
func (s *Size) UnmarshalJSON(b []byte) error {
	if n, err := strconv.ParseInt(string(b), 10, 64); err == nil {
		*s = Size(n)
		return nil
	}
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return fmt.Errorf("size: want a number or a string like \"1GiB\"")
	}
	return s.Set(str)
}

// UnmarshalTOML reads an integer or a size string.
func (s *Size) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case int64:
		*s = Size(x)
		return nil
	case string:
		return s.Set(x)
	}
	return fmt.Errorf("size: want an integer or a string like \"1GiB\"")
}

// Duration is a time.Duration that reads "30s".
type Duration time.Duration

func (d *Duration) String() string { return time.Duration(*d).String() }

// Set implements flag.Value.
func (d *Duration) Set(v string) error {
	x, err := time.ParseDuration(v)
	*d = Duration(x)
	return err
}

// UnmarshalText reads a duration string.
func (d *Duration) UnmarshalText(b []byte) error { return d.Set(string(b)) }

// BreakLimit is a gateway.Limit that reads "N/DURATION" ("" or "0": no
// bound).
type BreakLimit gateway.Limit

func (l *BreakLimit) String() string {
	if l.Burst <= 0 {
		return ""
	}
	return fmt.Sprintf("%d/%v", l.Burst, l.Window)
}

// Set implements flag.Value.
func (l *BreakLimit) Set(v string) error {
	if v == "" || v == "0" {
		*l = BreakLimit{}
		return nil
	}
	n, d, ok := strings.Cut(v, "/")
	burst, err := strconv.Atoi(n)
	if !ok || err != nil || burst < 1 {
		return fmt.Errorf("break limit %q: want N/DURATION, e.g. 3/1m, with N ≥ 1", v)
	}
	w, err := time.ParseDuration(d)
	if err != nil || w <= 0 {
		return fmt.Errorf("break limit %q: want N/DURATION, e.g. 3/1m, with a positive duration", v)
	}
	*l = BreakLimit{Burst: burst, Window: w}
	return nil
}

// UnmarshalText reads "N/DURATION".
func (l *BreakLimit) UnmarshalText(b []byte) error { return l.Set(string(b)) }
