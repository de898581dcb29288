package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/cli"
)

const reserveLong = `Persistent reservations let hosts sharing a volume agree on who writes
it, as SCSI's PERSISTENT RESERVE and NVMe reservations do. A host (known
by its initiator name, --name) registers a key of its choosing, then the
holder of a reservation decides who else may write or read:

  write-exclusive               only the holder writes; everyone reads
  exclusive-access              only the holder reads or writes
  write-exclusive-registrants   registered hosts write; everyone reads
  exclusive-access-registrants  only registered hosts read or write

Registrations and reservations survive srpd restarts. A host that died
holding a reservation is fenced off by another preempting its key.
Keys are 64-bit numbers, decimal or 0x-hex; 0 is no key.

With --protocol srp these are SCSI's PERSISTENT RESERVE OUT and IN, to
srpd or any SRP target that serves them (LIO does); the host is its
initiator port, and show lists keys, not names. srpd holds gosrp and
SRP hosts (the kernel's ib_srp too) to the same reservations.

  srpc reserve register vol0 0xa                # register key 0xa
  srpc reserve reserve vol0 --key 0xa           # take write-exclusive
  srpc reserve show vol0
  srpc reserve preempt vol0 --key 0xb --victim 0xa --abort
  srpc reserve release vol0 --key 0xa
  srpc reserve register vol0 --key 0xa 0        # unregister`

func reserveCommand() *cli.Command {
	return &cli.Command{
		Name: "reserve", Short: "register, reserve, release, clear, preempt and show a volume's reservations",
		Long: reserveLong,
		Sub: []*cli.Command{
			reserveAction("register", "VOLUME NEWKEY", "register NEWKEY for this host (--key: the current one; NEWKEY 0 unregisters)",
				func(ctx context.Context, r *initiator.Reservations, f *reserveFlags, args []string) error {
					newKey, err := parseKey("NEWKEY", args[1])
					if err != nil {
						return err
					}
					if newKey == 0 && f.key.n == 0 && !f.ignore {
						// SPC-4 takes it, and changes nothing.
						return cli.Usagef("NEWKEY 0 with no --key registers nothing: 0 unregisters the key --key names")
					}
					if f.ignore {
						return r.RegisterIgnoringKey(ctx, newKey)
					}
					return r.Register(ctx, f.key.n, newKey)
				}),
			reserveAction("reserve", "VOLUME", "take a reservation of --type with this host's --key",
				func(ctx context.Context, r *initiator.Reservations, f *reserveFlags, _ []string) error {
					return r.Reserve(ctx, f.key.n, f.typ)
				}),
			reserveAction("release", "VOLUME", "give up the reservation of --type this host holds",
				func(ctx context.Context, r *initiator.Reservations, f *reserveFlags, _ []string) error {
					return r.Release(ctx, f.key.n, f.typ)
				}),
			reserveAction("clear", "VOLUME", "remove every host's registration and the reservation",
				func(ctx context.Context, r *initiator.Reservations, f *reserveFlags, _ []string) error {
					return r.Clear(ctx, f.key.n)
				}),
			reserveAction("preempt", "VOLUME", "remove the registrations of key --victim and take their reservation with --type",
				func(ctx context.Context, r *initiator.Reservations, f *reserveFlags, _ []string) error {
					if f.victim.n == 0 {
						return cli.Usagef("preempt needs --victim, the key of the host to preempt")
					}
					return r.Preempt(ctx, f.key.n, f.victim.n, f.typ, f.abort)
				}),
			reserveShowCommand(),
		},
	}
}

// keyFlag is a reservation key flag: decimal or 0x-hex.
type keyFlag struct{ n uint64 }

func (k *keyFlag) String() string { return fmt.Sprintf("%#x", k.n) }
func (k *keyFlag) Set(s string) error {
	n, err := parseKey("key", s)
	k.n = n
	return err
}

func parseKey(what, s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		return 0, cli.Usagef("%s %q: want a 64-bit number, decimal or 0x-hex", what, s)
	}
	return n, nil
}

// typeFlag is a --type flag by the reservation types' names.
type typeFlag struct{ t *initiator.ReservationType }

func (f typeFlag) String() string {
	if f.t == nil {
		return ""
	}
	return f.t.String()
}

func (f typeFlag) Set(s string) error {
	t, err := initiator.ParseReservationType(s)
	if err != nil {
		return err
	}
	*f.t = t
	return nil
}

// reserveFlags are the flags of the reservation actions.
type reserveFlags struct {
	conn        connFlags
	key, victim keyFlag
	typ         initiator.ReservationType
	ignore      bool
	abort       bool
}

// reserveAction is a subcommand that opens VOLUME, runs do on its
// reservations and says what it did in one line.
func reserveAction(name, argsSyn, short string, do func(context.Context, *initiator.Reservations, *reserveFlags, []string) error) *cli.Command {
	f := &reserveFlags{typ: initiator.WriteExclusive}
	nargs := 1
	if name == "register" {
		nargs = 2
	}
	return &cli.Command{
		Name: name, Args: argsSyn, Short: short,
		SetFlags: func(fs *flag.FlagSet) {
			f.conn.register(fs)
			fs.Var(&f.key, "key", "this host's registered reservation `KEY` (0x-hex or decimal)")
			switch name {
			case "register":
				fs.BoolVar(&f.ignore, "ignore-key", false, "register NEWKEY whatever key this host has now (REGISTER AND IGNORE EXISTING KEY)")
			case "reserve", "release", "preempt":
				fs.Var(typeFlag{&f.typ}, "type", "reservation `TYPE`: write-exclusive (default), exclusive-access, write-exclusive-registrants or exclusive-access-registrants")
			}
			if name == "preempt" {
				fs.Var(&f.victim, "victim", "the `KEY` whose registrations (and reservation) to take away")
				fs.BoolVar(&f.abort, "abort", false, "also fail the preempted hosts' writes not yet in the target's store and wait for those in it (PREEMPT AND ABORT)")
			}
		},
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, nargs, nargs, argsSyn); err != nil {
				return err
			}
			s, v, err := f.conn.openReservable(ctx, args[0])
			if err != nil {
				return err
			}
			defer s.Close()
			defer v.Close()
			if err := do(ctx, v.Reservations(), f, args); err != nil {
				return reserveError(args[0], name, err)
			}
			fmt.Fprintf(os.Stderr, "srpc: %s on %s done for initiator %q\n", name, args[0], f.conn.name)
			return nil
		},
	}
}

// reservable is a volume whose reservations srpc reserve reads and
// changes: an *initiator.Volume, or an *initiator.MultipathVolume whose
// active path answers (gateways keep a volume's reservations with it).
type reservable interface {
	Reservations() *initiator.Reservations
	Close() error
}

// openReservable opens volume name, read-only, on the one --target or
// through all of them.
func (c *connFlags) openReservable(ctx context.Context, name string) (*session, reservable, error) {
	if len(c.paths) > 0 {
		s, v, err := c.openCopy(ctx, name, true, 4, 0)
		if err != nil {
			return nil, nil, err
		}
		return s, v.(*initiator.MultipathVolume), nil
	}
	return c.open(ctx, name, true, 4, 0)
}

// reserveError is the one line for a refused reservation action.
func reserveError(volume, action string, err error) error {
	var uerr *cli.UsageError
	if errors.As(err, &uerr) {
		return err
	}
	var rerr *initiator.ReservationError
	switch {
	case errors.As(err, &rerr) && errors.Is(err, initiator.ErrReservationConflict):
		return fmt.Errorf("%s on volume %q refused: %s (srpc reserve show %s)", action, volume, rerr.Reason, volume)
	case errors.As(err, &rerr):
		return fmt.Errorf("%s on volume %q failed: %s", action, volume, rerr.Reason)
	}
	return fmt.Errorf("%s on volume %q failed: %v", action, volume, ioError(err))
}

func reserveShowCommand() *cli.Command {
	var cf connFlags
	var asJSON bool
	return &cli.Command{
		Name: "show", Args: "VOLUME", Short: "show a volume's registrations, reservation and exclusive opener",
		SetFlags: func(fs *flag.FlagSet) {
			cf.register(fs)
			fs.BoolVar(&asJSON, "json", false, "print JSON")
		},
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 1, 1, "VOLUME"); err != nil {
				return err
			}
			s, v, err := cf.openReservable(ctx, args[0])
			if err != nil {
				return err
			}
			defer s.Close()
			defer v.Close()
			rep, err := v.Reservations().Report(ctx)
			if err != nil {
				return reserveError(args[0], "show", err)
			}
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 1, ' ', 0)
			fmt.Fprintf(w, "volume:\t%s\n", args[0])
			fmt.Fprintf(w, "generation:\t%d\n", rep.Generation)
			switch {
			case rep.Holder == "" && rep.HolderKey == 0:
				fmt.Fprintf(w, "reservation:\tnone\n")
			case rep.Holder == "":
				// --protocol srp: SCSI names hosts by key only.
				fmt.Fprintf(w, "reservation:\t%s by the host of key %#x\n", rep.Type, rep.HolderKey)
			default:
				fmt.Fprintf(w, "reservation:\t%s by %q (key %#x)\n", rep.Type, rep.Holder, rep.HolderKey)
			}
			if rep.ExclusiveHolder != "" {
				fmt.Fprintf(w, "exclusive open:\tby %q\n", rep.ExclusiveHolder)
			}
			if len(rep.Registrants) == 0 {
				fmt.Fprintf(w, "registrations:\tnone\n")
			}
			for i, g := range rep.Registrants {
				label := ""
				if i == 0 {
					label = "registrations:"
				}
				if g.Initiator == "" {
					fmt.Fprintf(w, "%s\tkey %#x\n", label, g.Key)
					continue
				}
				fmt.Fprintf(w, "%s\t%q key %#x\n", label, g.Initiator, g.Key)
			}
			return w.Flush()
		},
	}
}

// reservedError is the one line for an open or a command of volume that a
// reservation or another session's exclusive open refused.
func reservedError(volume string, err error) error {
	why := "volume %q is reserved by another host"
	if strings.Contains(err.Error(), "open for writing by another session") {
		why = "volume %q is open for writing by another session, so it cannot be opened exclusively"
	} else if strings.Contains(err.Error(), "open exclusively by") {
		why = "volume %q is open exclusively by another session"
	}
	if _, srp := errors.AsType[*initiator.SCSIError](err); srp {
		// T10 SRP: RESERVATION CONFLICT is all the target says, and a
		// gosrp session's exclusive open (not a SCSI reservation) is
		// answered so too; the hint once named the gosrp command,
		// which knows no LUN names.
		return fmt.Errorf("volume %q is reserved by another host, or open exclusively by a gosrp session (srpc reserve show --protocol srp %s)", volume, volume)
	}
	return fmt.Errorf(why+" (srpc reserve show %s)", volume, volume)
}

// volumeError is ioError for an I/O error of volume: a reservation
// conflict names the volume.
func volumeError(volume string, err error) error {
	if errors.Is(err, initiator.ErrReservationConflict) {
		return reservedError(volume, err)
	}
	return ioError(err)
}
