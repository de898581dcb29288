// Command srpd is the gosrp target daemon: it serves the volumes of a data
// directory (a pebble store) to initiators over a verbs provider (the
// emulated NIC by default), and administers them through a unix socket.
//
//	srpd                                  # serve ./srpd-data on 127.0.0.1:4420
//	srpd volume create --size 256MiB db   # against the running daemon
//	srpd status
//
// Run 'srpd --help' and 'srpd COMMAND --help' for every flag.
package main

import (
	"context"

	"github.com/gosrp/gosrp/internal/cli"
)

func main() {
	cli.Main(context.Background(), rootCommand())
}

func rootCommand() *cli.Command {
	root := &cli.Command{
		Name:     "srpd",
		Short:    "the gosrp target daemon",
		Long:     "srpd serves block volumes to gosrp initiators (srpc, or Go programs using\npackage initiator) and administers them.\n\n" + serveLong,
		SetFlags: setServeFlags,
	}
	root.Run = func(ctx context.Context, args []string) error { return runServe(ctx, root.Flags, args) }
	serveCmd := &cli.Command{Name: "serve", Short: "serve volumes (the default when no command is given)", Long: serveLong, SetFlags: setServeFlags}
	serveCmd.Run = func(ctx context.Context, args []string) error { return runServe(ctx, serveCmd.Flags, args) }
	root.Sub = []*cli.Command{
		serveCmd,
		statusCommand(),
		volumeCommand(),
		snapshotCommand(),
		aclCommand(),
		secretCommand(),
	}
	return root
}
