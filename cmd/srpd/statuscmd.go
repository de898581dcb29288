package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/cli"
)

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
				if st.SRP != nil {
					fmt.Fprintf(w, "\n%s", srpStatusLine(st.SRP))
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
				// A gateway of a shared store (rbd) shows each volume's
				// path state here.
				shared := slices.ContainsFunc(st.Volumes, func(v admin.Volume) bool { return v.PathState != "" })
				fmt.Fprint(w, "VOLUME\tSIZE\t")
				if shared {
					fmt.Fprint(w, "PATH\t")
				}
				fmt.Fprintln(w, "READS\tREAD\tWRITES\tWRITTEN\tERRORS\tP99")
				for _, v := range st.Volumes {
					s := stats[v.Name]
					errs := s.Read.Errors + s.Write.Errors + s.Flush.Errors + s.Discard.Errors + s.WriteZeroes.Errors
					fmt.Fprintf(w, "%s\t%s\t", v.Name, cli.FormatSize(v.Size))
					if shared {
						fmt.Fprintf(w, "%s\t", v.PathState)
					}
					fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%d\t%s\n",
						s.Read.Ops, cli.FormatSize(int64(s.Read.Bytes)), s.Write.Ops, cli.FormatSize(int64(s.Write.Bytes)), errs, latencyBound(s.P99us))
				}
				if len(st.Reservations) > 0 {
					fmt.Fprintln(w, "\nRESERVED\tHOLDER\tTYPE\tEXCLUSIVE OPEN\tREGISTERED")
					for _, r := range st.Reservations {
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Volume, orDash(r.Holder), orDash(r.Type), orDash(r.Exclusive),
							orDash(strings.Join(r.Registrants, ",")))
					}
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

// orDash prints an empty column as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// latencyBound prints a latency histogram's upper bound (a power of two
// of microseconds, target.Histogram) as a person reads it: "≤1.05s"
// rather than "1048576µs"; "-" before the first I/O.
func latencyBound(us uint64) string {
	switch {
	case us == 0:
		return "-"
	case us < 1000:
		return fmt.Sprintf("≤%dµs", us)
	case us < 1000_000:
		return fmt.Sprintf("≤%.3gms", float64(us)/1e3)
	}
	return fmt.Sprintf("≤%.3gs", float64(us)/1e6)
}
