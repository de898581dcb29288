package main

import (
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/cli"
)

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
	var force, withSnaps bool
	checkSize := func([]string) error { return sizeArg(&size, "size") }
	// A new volume's geometry is known here: say what is wrong with it
	// before srpd is asked (it answered --block-size 1000 with "size
	// 1048576 is not a multiple of the block size 1000").
	checkCreate := func(args []string) error {
		if err := checkSize(args); err != nil {
			return err
		}
		if bs != 512 && bs != 4096 {
			return cli.Usagef("--block-size %d: want 512 or 4096", bs)
		}
		if size.N%int64(bs) != 0 {
			return cli.Usagef("--size %d: want whole %d-byte blocks (e.g. --size %d)", size.N, bs, (size.N/int64(bs)+1)*int64(bs))
		}
		return nil
	}
	return af.group("volume", "create, list, resize and delete volumes",
		adminCmd{
			name: "create", args: "NAME", short: "create a volume",
			long: "Create a zero-filled volume. Sizes take KiB, MiB, GiB or TiB.\n\nExample: srpd volume create --size 256MiB db",
			flags: func(fs *flag.FlagSet) {
				fs.Var(&size, "size", "volume `SIZE`, e.g. 256MiB (required)")
				fs.IntVar(&bs, "block-size", DefaultBlockSize, "block size in `BYTES`: 512 or 4096")
			},
			check: checkCreate,
			run: show(&af, func(s admin.Service, args []string) (admin.Volume, error) {
				return s.CreateVolume(admin.CreateVolume{Name: args[0], Size: size.N, BlockSize: bs})
			}, func(w *tabwriter.Writer, v admin.Volume) {
				fmt.Fprintf(w, "created volume %s: %s, %d-byte blocks\n", v.Name, cli.FormatSize(v.Size), v.BlockSize)
			}),
		},
		adminCmd{
			name: "list", short: "list volumes",
			run: show(&af, func(s admin.Service, _ []string) ([]admin.Volume, error) { return s.Volumes() },
				rows("NAME\tSIZE\tBLOCK\tSNAPSHOTS\tCREATED", func(w io.Writer, v admin.Volume) {
					fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", v.Name, cli.FormatSize(v.Size), v.BlockSize, v.Snapshots, fmtTime(v.Created))
				})),
		},
		adminCmd{
			name: "resize", args: "NAME", short: "grow or shrink a volume",
			long: "Change a volume's size. Shrinking drops the blocks past the new end, and is\nrefused while a session has the volume open unless --force is given.\nOpen sessions learn the new size with their next command on the volume.",
			flags: func(fs *flag.FlagSet) {
				fs.Var(&size, "size", "new `SIZE`, e.g. 2GiB (required)")
				fs.BoolVar(&force, "force", false, "shrink even while sessions have the volume open (their I/O past the new end fails)")
			},
			check: checkSize,
			run: show(&af, func(s admin.Service, args []string) (admin.Volume, error) {
				return s.ResizeVolume(args[0], admin.ResizeVolume{Size: size.N, Force: force})
			},
				func(w *tabwriter.Writer, v admin.Volume) {
					fmt.Fprintf(w, "resized volume %s to %s\n", v.Name, cli.FormatSize(v.Size))
				}),
		},
		adminCmd{
			name: "delete", args: "NAME", short: "delete a volume",
			long: "Delete a volume and what it holds. A volume that has snapshots is refused\nunless --snapshots is given, which deletes them with it.",
			flags: func(fs *flag.FlagSet) {
				fs.BoolVar(&withSnaps, "snapshots", false, "delete the volume's snapshots with it")
			},
			run: func(s admin.Service, args []string) error {
				return s.DeleteVolume(args[0], admin.DeleteVolume{Snapshots: withSnaps})
			},
		},
	)
}

func snapshotCommand() *cli.Command {
	var af adminFlags
	var from string // VOLUME@SNAPSHOT of a clone, for its message
	return af.group("snapshot", "create, list, delete and clone snapshots",
		adminCmd{
			name: "create", args: "VOLUME SNAPSHOT", snap: true, short: "take a snapshot of a volume",
			long: "Freeze a volume's current content under a name. The snapshot is served\nread-only as VOLUME@SNAPSHOT (srpc export VOLUME@SNAPSHOT ...), to the\ninitiators the ACL lets open VOLUME: a rule on VOLUME covers its snapshots,\nand a rule on VOLUME@SNAPSHOT can only narrow it.",
			run: show(&af, func(s admin.Service, args []string) (admin.Snapshot, error) {
				return s.CreateSnapshot(args[0], args[1])
			},
				func(w *tabwriter.Writer, x admin.Snapshot) {
					fmt.Fprintf(w, "created snapshot %s@%s (%s)\n", x.Volume, x.Name, cli.FormatSize(x.Size))
				}),
		},
		adminCmd{
			name: "list", args: "[VOLUME]", short: "list snapshots (of one volume, or all)",
			run: show(&af, func(s admin.Service, args []string) ([]admin.Snapshot, error) {
				vol := ""
				if len(args) == 1 {
					vol = args[0]
				}
				return s.Snapshots(vol)
			}, rows("SNAPSHOT\tSIZE\tBLOCK\tCREATED", func(w io.Writer, x admin.Snapshot) {
				fmt.Fprintf(w, "%s@%s\t%s\t%d\t%s\n", x.Volume, x.Name, cli.FormatSize(x.Size), x.BlockSize, fmtTime(x.Created))
			})),
		},
		adminCmd{
			name: "delete", args: "VOLUME SNAPSHOT", snap: true, short: "delete a snapshot",
			run: func(s admin.Service, args []string) error { return s.DeleteSnapshot(args[0], args[1]) },
		},
		adminCmd{
			name: "clone", args: "VOLUME SNAPSHOT NEWVOLUME", snap: true, short: "create a writable volume from a snapshot",
			long: `Create NEWVOLUME with the content of VOLUME@SNAPSHOT, writable.

A clone is a new volume: it starts with no ACL rules of its own and does
not inherit VOLUME's, so the default ('srpd acl default') and the "*"
rules decide who may open it until you add rules for it (under 'acl
default deny', nobody but what "*" rules allow). Rules are kept by name:
a rule left behind for a deleted volume of the same name applies.

Example: srpd snapshot clone db nightly db-test && srpd acl set host-t db-test rw`,
			run: show(&af, func(s admin.Service, args []string) (admin.Volume, error) {
				from = args[0] + "@" + args[1]
				return s.CloneSnapshot(args[0], args[1], args[2])
			}, func(w *tabwriter.Writer, v admin.Volume) {
				fmt.Fprintf(w, "created volume %s from %s (%s)\n", v.Name, from, cli.FormatSize(v.Size))
			}),
		},
	)
}
