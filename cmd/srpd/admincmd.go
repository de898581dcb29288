package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/cli"
)

var stdout io.Writer = os.Stdout

func (a *adminFlags) socketPath() string {
	if a.socket != "" {
		return a.socket
	}
	return filepath.Join(a.data, admin.SocketName)
}

// withService runs fn against the running daemon, or, when none answers on
// the socket, directly on the data directory (which then must not be in use).
func (a *adminFlags) withService(ctx context.Context, offlineOK bool, fn func(admin.Service) error) error {
	c := admin.NewClient(a.socketPath())
	st, err := c.Status(ctx)
	if err == nil {
		a.aclLive = st.ACLLive
		return fn(c.Service(ctx))
	}
	a.aclLive = true // offline: the next start reads access.json
	if !errors.Is(err, admin.ErrNotRunning) || !offlineOK {
		return err
	}
	if _, statErr := os.Stat(a.data); statErr != nil {
		return fmt.Errorf("srpd is not running and there is no data directory %s (start srpd, or pass --data)", a.data)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	store, err := openStore("pebble", a.data, log, nil)
	if err != nil {
		return fmt.Errorf("srpd does not answer on %s and the store cannot be opened: %w", a.socketPath(), err)
	}
	acc, err := loadAccess(a.data)
	if err != nil {
		store.Close()
		return err
	}
	ferr := fn(&service{store: store, access: acc})
	if cerr := store.Close(); ferr == nil {
		ferr = cerr
	}
	return ferr
}

// served reports whether name is a volume or a VOLUME@SNAPSHOT the
// daemon serves (cmd/srpd catalog.go); a failed lookup counts as served,
// so that a rule is never reported missing on a guess.
func served(s admin.Service, name string) bool {
	if vol, snap, ok := strings.Cut(name, "@"); ok {
		snaps, err := s.Snapshots(vol)
		if err != nil {
			return !errors.Is(err, admin.ErrNotFound)
		}
		return slices.ContainsFunc(snaps, func(x admin.Snapshot) bool { return x.Name == snap })
	}
	vols, err := s.Volumes()
	return err != nil || slices.ContainsFunc(vols, func(v admin.Volume) bool { return v.Name == name })
}

// aclNote tells the user when an ACL change waits for a restart.
func (a *adminFlags) aclNote(err error) error {
	if err == nil && !a.aclLive {
		fmt.Fprintln(os.Stderr, "srpd: saved; the running srpd applies ACL changes when it restarts")
	}
	return err
}

func (a *adminFlags) print(v any, table func(w *tabwriter.Writer)) error {
	if a.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	table(w)
	return w.Flush()
}

func sizeArg(s *cli.SizeFlag, name string) error {
	switch {
	case !s.Given:
		return cli.Usagef("--%s is required (e.g. --%s 256MiB)", name, name)
	case s.N <= 0:
		return cli.Usagef("--%s %d: a volume needs a size above 0 (e.g. --%s 256MiB)", name, s.N, name)
	}
	return nil
}

func volumeCommand() *cli.Command {
	var af adminFlags
	var size cli.SizeFlag
	var bs int
	create := &cli.Command{
		Name: "create", Args: "NAME", Short: "create a volume",
		Long: "Create a zero-filled volume. Sizes take KiB, MiB, GiB or TiB.\n\nExample: srpd volume create --size 256MiB db",
		SetFlags: func(fs *flag.FlagSet) {
			af.register(fs)
			fs.Var(&size, "size", "volume `SIZE`, e.g. 256MiB (required)")
			fs.IntVar(&bs, "block-size", DefaultBlockSize, "block size in `BYTES`: 512 or 4096")
		},
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 1, 1, "NAME"); err != nil {
				return err
			}
			if err := sizeArg(&size, "size"); err != nil {
				return err
			}
			return af.withService(ctx, true, func(s admin.Service) error {
				v, err := s.CreateVolume(admin.CreateVolume{Name: args[0], Size: size.N, BlockSize: bs})
				if err != nil {
					return err
				}
				return af.print(v, func(w *tabwriter.Writer) {
					fmt.Fprintf(w, "created volume %s: %s, %d-byte blocks\n", v.Name, cli.FormatSize(v.Size), v.BlockSize)
				})
			})
		},
	}
	list := &cli.Command{
		Name: "list", Short: "list volumes",
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 0, 0, "no arguments"); err != nil {
				return err
			}
			return af.withService(ctx, true, func(s admin.Service) error {
				vols, err := s.Volumes()
				if err != nil {
					return err
				}
				return af.print(vols, func(w *tabwriter.Writer) {
					fmt.Fprintln(w, "NAME\tSIZE\tBLOCK\tSNAPSHOTS\tCREATED")
					for _, v := range vols {
						fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", v.Name, cli.FormatSize(v.Size), v.BlockSize, v.Snapshots, fmtTime(v.Created))
					}
				})
			})
		},
	}
	resize := &cli.Command{
		Name: "resize", Args: "NAME", Short: "grow or shrink a volume",
		Long: "Change a volume's size. Shrinking drops the blocks past the new end.\nInitiators see the new size when they open the volume again.",
		SetFlags: func(fs *flag.FlagSet) {
			af.register(fs)
			fs.Var(&size, "size", "new `SIZE`, e.g. 2GiB (required)")
		},
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 1, 1, "NAME"); err != nil {
				return err
			}
			if err := sizeArg(&size, "size"); err != nil {
				return err
			}
			return af.withService(ctx, true, func(s admin.Service) error {
				v, err := s.ResizeVolume(args[0], size.N)
				if err != nil {
					return err
				}
				return af.print(v, func(w *tabwriter.Writer) {
					fmt.Fprintf(w, "resized volume %s to %s\n", v.Name, cli.FormatSize(v.Size))
				})
			})
		},
	}
	del := &cli.Command{
		Name: "delete", Args: "NAME", Short: "delete a volume and its snapshots",
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 1, 1, "NAME"); err != nil {
				return err
			}
			return af.withService(ctx, true, func(s admin.Service) error { return s.DeleteVolume(args[0]) })
		},
	}
	return &cli.Command{Name: "volume", Short: "create, list, resize and delete volumes", Sub: []*cli.Command{create, list, resize, del}}
}

// volSnap reads "VOLUME SNAP" or "VOLUME@SNAP".
func volSnap(args []string, extra int, syn string) (string, string, []string, error) {
	if len(args) >= 1 {
		if v, s, ok := strings.Cut(args[0], "@"); ok {
			if err := cli.NArgs(args, 1+extra, 1+extra, syn); err != nil {
				return "", "", nil, err
			}
			return v, s, args[1:], nil
		}
	}
	if err := cli.NArgs(args, 2+extra, 2+extra, syn); err != nil {
		return "", "", nil, err
	}
	return args[0], args[1], args[2:], nil
}

func snapshotCommand() *cli.Command {
	var af adminFlags
	create := &cli.Command{
		Name: "create", Args: "VOLUME SNAPSHOT", Short: "take a snapshot of a volume",
		Long:     "Freeze a volume's current content under a name. The snapshot is served\nread-only as VOLUME@SNAPSHOT (srpc export VOLUME@SNAPSHOT ...), to the\ninitiators the ACL lets open VOLUME: a rule on VOLUME covers its snapshots,\nand a rule on VOLUME@SNAPSHOT can only narrow it.",
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			vol, snap, _, err := volSnap(args, 0, "VOLUME SNAPSHOT")
			if err != nil {
				return err
			}
			return af.withService(ctx, true, func(s admin.Service) error {
				x, err := s.CreateSnapshot(vol, snap)
				if err != nil {
					return err
				}
				return af.print(x, func(w *tabwriter.Writer) {
					fmt.Fprintf(w, "created snapshot %s@%s (%s)\n", x.Volume, x.Name, cli.FormatSize(x.Size))
				})
			})
		},
	}
	list := &cli.Command{
		Name: "list", Args: "[VOLUME]", Short: "list snapshots (of one volume, or all)",
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 0, 1, "[VOLUME]"); err != nil {
				return err
			}
			vol := ""
			if len(args) == 1 {
				vol = args[0]
			}
			return af.withService(ctx, true, func(s admin.Service) error {
				snaps, err := s.Snapshots(vol)
				if err != nil {
					return err
				}
				return af.print(snaps, func(w *tabwriter.Writer) {
					fmt.Fprintln(w, "SNAPSHOT\tSIZE\tBLOCK\tCREATED")
					for _, x := range snaps {
						fmt.Fprintf(w, "%s@%s\t%s\t%d\t%s\n", x.Volume, x.Name, cli.FormatSize(x.Size), x.BlockSize, fmtTime(x.Created))
					}
				})
			})
		},
	}
	del := &cli.Command{
		Name: "delete", Args: "VOLUME SNAPSHOT", Short: "delete a snapshot",
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			vol, snap, _, err := volSnap(args, 0, "VOLUME SNAPSHOT")
			if err != nil {
				return err
			}
			return af.withService(ctx, true, func(s admin.Service) error { return s.DeleteSnapshot(vol, snap) })
		},
	}
	clone := &cli.Command{
		Name: "clone", Args: "VOLUME SNAPSHOT NEWVOLUME", Short: "create a writable volume from a snapshot",
		Long: `Create NEWVOLUME with the content of VOLUME@SNAPSHOT, writable.

A clone is a new volume: it starts with no ACL rules of its own and does
not inherit VOLUME's, so the default ('srpd acl default') and the "*"
rules decide who may open it until you add rules for it (under 'acl
default deny', nobody but what "*" rules allow). Rules are kept by name:
a rule left behind for a deleted volume of the same name applies.

Example: srpd snapshot clone db nightly db-test && srpd acl set host-t db-test rw`,
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			vol, snap, rest, err := volSnap(args, 1, "VOLUME SNAPSHOT NEWVOLUME")
			if err != nil {
				return err
			}
			return af.withService(ctx, true, func(s admin.Service) error {
				v, err := s.CloneSnapshot(vol, snap, rest[0])
				if err != nil {
					return err
				}
				return af.print(v, func(w *tabwriter.Writer) {
					fmt.Fprintf(w, "created volume %s from %s@%s (%s)\n", v.Name, vol, snap, cli.FormatSize(v.Size))
				})
			})
		},
	}
	return &cli.Command{Name: "snapshot", Short: "create, list, delete and clone snapshots", Sub: []*cli.Command{create, list, del, clone}}
}

func aclCommand() *cli.Command {
	var af adminFlags
	list := &cli.Command{
		Name: "list", Short: "show the access control list",
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 0, 0, "no arguments"); err != nil {
				return err
			}
			return af.withService(ctx, true, func(s admin.Service) error {
				acl, err := s.ACL()
				if err != nil {
					return err
				}
				return af.print(acl, func(w *tabwriter.Writer) {
					def := "rw (allow)"
					if acl.DenyByDefault {
						def = "none (deny)"
					}
					fmt.Fprintf(w, "default: %s\n", def)
					fmt.Fprintln(w, "INITIATOR\tVOLUME\tACCESS")
					for _, r := range acl.Rules {
						fmt.Fprintf(w, "%s\t%s\t%s\n", r.Initiator, r.Volume, r.Access)
					}
				})
			})
		},
	}
	set := &cli.Command{
		Name: "set", Args: "INITIATOR VOLUME ACCESS", Short: "grant an initiator access to a volume",
		Long: `Add or replace the rule for (INITIATOR, VOLUME). ACCESS is none, ro or rw;
"*" as INITIATOR or VOLUME matches any name. The most specific rule wins:
an exact initiator beats "*", then an exact volume beats "*".

Example: srpd acl default deny && srpd acl set host-a vol0 rw`,
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 3, 3, "INITIATOR VOLUME ACCESS"); err != nil {
				return err
			}
			if _, err := parseAccess(args[2]); err != nil {
				return cli.Usagef("%v", strings.TrimSuffix(err.Error(), ": "+admin.ErrInvalid.Error()))
			}
			return af.withService(ctx, true, func(s admin.Service) error {
				if err := s.SetACLRule(admin.ACLRule{Initiator: args[0], Volume: args[1], Access: args[2]}); err != nil {
					return err
				}
				if args[1] != "*" && !served(s, args[1]) {
					// A rule may be set before its volume exists; a typo
					// would otherwise go unnoticed until a login fails.
					fmt.Fprintf(os.Stderr, "srpd: saved, but there is no volume %q yet: the rule applies once it exists\n", args[1])
				}
				return af.aclNote(nil)
			})
		},
	}
	del := &cli.Command{
		Name: "delete", Args: "INITIATOR VOLUME", Short: "remove the rule for an initiator and a volume",
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 2, 2, "INITIATOR VOLUME"); err != nil {
				return err
			}
			return af.withService(ctx, true, func(s admin.Service) error { return af.aclNote(s.DeleteACLRule(args[0], args[1])) })
		},
	}
	def := &cli.Command{
		Name: "default", Args: "allow|deny", Short: "what an initiator gets when no rule matches",
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 1, 1, "allow|deny"); err != nil {
				return err
			}
			if args[0] != "allow" && args[0] != "deny" {
				return cli.Usagef("want allow or deny, got %q", args[0])
			}
			return af.withService(ctx, true, func(s admin.Service) error { return af.aclNote(s.SetACLDefault(args[0] == "deny")) })
		},
	}
	return &cli.Command{Name: "acl", Short: "manage which initiator may open which volume", Sub: []*cli.Command{list, set, del, def}}
}

func secretCommand() *cli.Command {
	var af adminFlags
	var secret, secretFile string
	var optional bool
	list := &cli.Command{
		Name: "list", Short: "list initiators that have a secret (never the secrets)",
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 0, 0, "no arguments"); err != nil {
				return err
			}
			return af.withService(ctx, true, func(s admin.Service) error {
				xs, err := s.Secrets()
				if err != nil {
					return err
				}
				return af.print(xs, func(w *tabwriter.Writer) {
					fmt.Fprintln(w, "INITIATOR\tREQUIRED")
					for _, x := range xs {
						fmt.Fprintf(w, "%s\t%v\n", x.Initiator, x.Required)
					}
				})
			})
		},
	}
	set := &cli.Command{
		Name: "set", Args: "INITIATOR", Short: "set an initiator's shared secret",
		Long: `Set the shared secret INITIATOR must prove at login (HMAC-SHA256
challenge; the secret never crosses the wire). The initiator passes the same
secret with srpc --secret-file or SRPC_SECRET. Secrets are kept in
DIR/access.json (mode 0600).`,
		SetFlags: func(fs *flag.FlagSet) {
			af.register(fs)
			fs.StringVar(&secret, "secret", "", "the `SECRET` (visible in ps; prefer --secret-file or SRPD_SECRET)")
			fs.StringVar(&secretFile, "secret-file", "", "read the secret from `FILE` (- for stdin; one line)")
			fs.BoolVar(&optional, "optional", false, "let the initiator log in without authenticating")
		},
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 1, 1, "INITIATOR"); err != nil {
				return err
			}
			sec, err := readSecret(secret, secretFile, "SRPD_SECRET")
			if err != nil {
				return err
			}
			if sec == "" {
				return cli.Usagef("give the secret with --secret-file FILE, --secret or SRPD_SECRET")
			}
			return af.withService(ctx, true, func(s admin.Service) error {
				return s.SetSecret(args[0], admin.SetSecret{Secret: sec, Required: !optional})
			})
		},
	}
	del := &cli.Command{
		Name: "delete", Args: "INITIATOR", Short: "remove an initiator's secret",
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 1, 1, "INITIATOR"); err != nil {
				return err
			}
			return af.withService(ctx, true, func(s admin.Service) error { return s.DeleteSecret(args[0]) })
		},
	}
	return &cli.Command{Name: "secret", Short: "manage initiators' authentication secrets", Sub: []*cli.Command{list, set, del}}
}

// readSecret returns the secret from a flag, a file or an environment variable.
func readSecret(flagVal, file, env string) (string, error) {
	if flagVal != "" {
		return flagVal, nil
	}
	if file != "" {
		var b []byte
		var err error
		if file == "-" {
			b, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<16))
		} else {
			b, err = os.ReadFile(file)
		}
		if err != nil {
			return "", fmt.Errorf("secret: %w", err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	return os.Getenv(env), nil
}

func statusCommand() *cli.Command {
	var af adminFlags
	return &cli.Command{
		Name: "status", Short: "show the running daemon's connections, volumes and counters",
		SetFlags: func(fs *flag.FlagSet) { af.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 0, 0, "no arguments"); err != nil {
				return err
			}
			c := admin.NewClient(af.socketPath())
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			return af.print(st, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "srpd pid %d, target %q, up %s\n", st.PID, st.Target, time.Since(st.Started).Round(time.Second))
				fmt.Fprintf(w, "listen %s (%s), data %s", st.Listen, st.Provider, st.Data)
				if st.Metrics != "" {
					fmt.Fprintf(w, ", metrics http://%s/metrics", st.Metrics)
				}
				fmt.Fprintf(w, "\nconnections %d (accepted %d, rejected %d, violations %d), credits in use %d\n",
					st.Connections, st.Accepted, st.Rejected, st.Violations, st.CreditsInUse)
				if sp := st.Space; sp != nil {
					fmt.Fprintf(w, "space %s free of %s (reserve %s)", cli.FormatSize(sp.Free), cli.FormatSize(sp.Total), cli.FormatSize(sp.Reserve))
					if sp.Full {
						fmt.Fprint(w, ", FULL: writes fail with ENOSPC")
					}
					if sp.RefusedWrites > 0 {
						fmt.Fprintf(w, ", %d writes refused", sp.RefusedWrites)
					}
					fmt.Fprintf(w, "; provisioned %s", cli.FormatSize(sp.Provisioned))
					if sp.MaxOvercommit > 0 {
						fmt.Fprintf(w, " of %s (max overcommit %g)", cli.FormatSize(int64(sp.MaxOvercommit*float64(sp.Total))), sp.MaxOvercommit)
					}
					fmt.Fprintln(w)
				}
				fmt.Fprintln(w)
				stats := map[string]admin.VolumeStats{}
				for _, v := range st.VolumeStats {
					stats[v.Name] = v
				}
				fmt.Fprintln(w, "VOLUME\tSIZE\tREADS\tREAD\tWRITES\tWRITTEN\tERRORS\tP99")
				for _, v := range st.Volumes {
					s := stats[v.Name]
					errs := s.Read.Errors + s.Write.Errors + s.Flush.Errors + s.Discard.Errors + s.WriteZeroes.Errors
					fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d\t%s\t%d\t%dµs\n", v.Name, cli.FormatSize(v.Size),
						s.Read.Ops, cli.FormatSize(int64(s.Read.Bytes)), s.Write.Ops, cli.FormatSize(int64(s.Write.Bytes)), errs, s.P99us)
				}
				if len(st.Conns) > 0 {
					fmt.Fprintln(w, "\nCONN\tINITIATOR\tREMOTE\tSTATE\tCREDITS\tIN USE\tOPEN")
					for _, c := range st.Conns {
						fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%d\t%d\n", c.ID, c.Initiator, c.Remote, c.State, c.Credits, c.CreditsInUse, c.OpenVolumes)
					}
				}
			})
		},
	}
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04")
}
