package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"text/tabwriter"

	"github.com/gosrp/gosrp/internal/cli"
)

// quietLogger keeps the initiator's log (reconnects and the like) on
// stderr at warning level, so normal runs print nothing.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func listCommand() *cli.Command {
	var cf connFlags
	var asJSON bool
	return &cli.Command{
		Name: "list", Short: "list the volumes this initiator may open, with sizes",
		SetFlags: func(fs *flag.FlagSet) {
			cf.register(fs)
			fs.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
		},
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 0, 0, "no arguments"); err != nil {
				return err
			}
			s, vols, err := cf.list(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			if asJSON {
				type jv struct {
					Name      string `json:"name"`
					Size      int64  `json:"size"`
					BlockSize int    `json:"block_size"`
					ReadOnly  bool   `json:"read_only"`
				}
				out := []jv{}
				for _, v := range vols {
					out = append(out, jv{v.Name, v.Size, v.BlockSize, v.ReadOnly})
				}
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tSIZE\tBYTES\tBLOCK\tACCESS")
			for _, v := range vols {
				fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\n", v.Name, cli.FormatSize(v.Size), v.Size, v.BlockSize, access(v.ReadOnly))
			}
			return w.Flush()
		},
	}
}

func access(ro bool) string {
	if ro {
		return "ro"
	}
	return "rw"
}

func infoCommand() *cli.Command {
	var cf connFlags
	return &cli.Command{
		Name: "info", Args: "VOLUME", Short: "show a volume's size, block size and access",
		SetFlags: func(fs *flag.FlagSet) { cf.register(fs) },
		Run: func(ctx context.Context, args []string) error {
			if err := cli.NArgs(args, 1, 1, "VOLUME"); err != nil {
				return err
			}
			s, vols, err := cf.list(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			for _, v := range vols {
				if v.Name != args[0] {
					continue
				}
				w := tabwriter.NewWriter(os.Stdout, 0, 4, 1, ' ', 0)
				fmt.Fprintf(w, "volume:\t%s\n", v.Name)
				fmt.Fprintf(w, "target:\t%s (%s)\n", s.Target(), s.addr)
				fmt.Fprintf(w, "size:\t%s (%d bytes, %d blocks)\n", cli.FormatSize(v.Size), v.Size, v.Size/int64(v.BlockSize))
				fmt.Fprintf(w, "block size:\t%d\n", v.BlockSize)
				fmt.Fprintf(w, "access:\t%s\n", access(v.ReadOnly))
				fmt.Fprintf(w, "max transfer:\t%s\n", cli.FormatSize(int64(s.MaxTransfer())))
				if v.ID != "" {
					fmt.Fprintf(w, "id:\t%s\n", v.ID) // an SRP LUN's VPD 0x83 designator
				}
				return w.Flush()
			}
			return s.noVolume(args[0])
		},
	}
}
