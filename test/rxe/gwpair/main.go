// Command gwpair serves one volume through two gosrp targets in one
// process, as two srpd gateways in front of one RBD image would, for the
// rxe VM's ALUA test (test/rxe/alua.sh): the kernel's ib_srp logs in to
// both, and its scsi_dh_alua must find each gateway's target port group,
// read which one serves the volume, and move it with SET TARGET PORT
// GROUPS.
//
// The volume lives in an in-memory cluster whose clients lock and fence
// as RBD's do (internal/gateway/gatewaytest): each target has a client
// of its own behind the gateway catalog srpd uses, its own SRP target
// port (id_ext N, the ioc_guid given) and ALUA target port group N, for
// N = 1, 2. The persistent reservations are kept as srpd's gateways
// keep them with an RBD image (cmd/srpd/reservations.go): one record
// per volume, changed only through the gateway that serves it, read by
// the one that takes the volume over before it serves it. It is a test
// tool, not a product: the volume is lost when the process ends.
//
//	gwpair --provider ibverbs --addr 10.0.2.15 --ports 4460,4461 --ioc-guid GUID
//
// It prints "serving" once both targets listen, logs each gateway's path
// state changes, and stops on SIGTERM or SIGINT.
package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gosrp/gosrp/internal/cli"
	"github.com/gosrp/gosrp/internal/gateway"
	"github.com/gosrp/gosrp/internal/gateway/gatewaytest"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport"
	_ "github.com/gosrp/gosrp/transport/ibverbs" // the rxe device in the VM
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gwpair:", err)
		os.Exit(1)
	}
}

func run() error {
	provider := flag.String("provider", "ibverbs", "verbs `provider`: ibverbs or emu")
	addr := flag.String("addr", "127.0.0.1", "`IP` address both targets listen on")
	ports := flag.String("ports", "4460,4461", "the two targets' `PORTS`, comma-separated")
	ioc := flag.String("ioc-guid", "0000000000000001", "SRP I/O controller `GUID` of both target ports, 16 hex digits")
	size := flag.Int64("size", 64<<20, "the volume's size in `BYTES`")
	flag.Parse()
	ps := strings.Split(*ports, ",")
	if len(ps) != 2 {
		return fmt.Errorf("--ports %q: want two ports", *ports)
	}
	g, err := hex.DecodeString(strings.ReplaceAll(*ioc, ":", ""))
	if err != nil || len(g) != 8 {
		return fmt.Errorf("--ioc-guid %q: want 16 hex digits", *ioc)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	prov, err := cli.OpenProvider(*provider, transport.Options{}, log)
	if err != nil {
		return err
	}
	defer prov.Close()

	cl := gatewaytest.NewCluster()
	if err := cl.Create("vol0", *size, 4096); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	served := make(chan error, 2)
	var tgts []*target.Target
	rec := &records{m: map[string]target.ReservationState{}}
	for i, port := range ps {
		n := i + 1
		var id [16]byte
		binary.BigEndian.PutUint64(id[:8], uint64(n))
		copy(id[8:], g)
		cat := gateway.New(cl.Client())
		glog := log.With("gateway", n)
		tgt, err := target.New(target.Config{Name: "gwpair", Catalog: cat, Logger: glog,
			SRPTargetPortID: id, SRPPortGroup: uint16(n), Reservations: gatewayRecords{rec, cat}})
		if err != nil {
			return err
		}
		cat.BeforeActive(func(name string) error {
			st, _ := rec.ReadReservation(name)
			return tgt.SetReservations(name, st)
		})
		cat.OnStateChange(func(name string, s gateway.State) {
			glog.Info("volume path state changed", "volume", name, "state", s)
			gateway.Tell(tgt, name, s)
		})
		l, err := prov.Listen(ctx, net.JoinHostPort(*addr, port))
		if err != nil {
			return fmt.Errorf("gateway %d: listen: %w", n, err)
		}
		go func() { served <- tgt.Serve(ctx, l) }()
		tgts = append(tgts, tgt)
		fmt.Printf("gateway %d: add_target id_ext=%016x,ioc_guid=%x,dest=%s\n", n, n, g, net.JoinHostPort(*addr, port))
	}
	fmt.Println("serving")
	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("a target stopped: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	for _, t := range tgts {
		errs = append(errs, t.Shutdown(sctx))
	}
	return errors.Join(errs...)
}

// records are the volumes' reservation records both gateways share.
type records struct {
	mu sync.Mutex
	m  map[string]target.ReservationState
}

// ReadReservation returns the volume's record (target.ReservationReader).
func (r *records) ReadReservation(volume string) (target.ReservationState, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[volume], nil
}

// gatewayRecords is one gateway's target.ReservationStore over the
// shared records: it records a change only for a volume it serves, as
// srpd's gateways can write an image's metadata only while they hold
// its lock.
type gatewayRecords struct {
	*records
	cat *gateway.Catalog
}

// LoadReservations returns nothing: a gateway reads a volume's record
// when it takes the volume over (BeforeActive).
func (gatewayRecords) LoadReservations() (map[string]target.ReservationState, error) {
	return map[string]target.ReservationState{}, nil
}

// SaveReservation records st for volume if this gateway serves it.
func (g gatewayRecords) SaveReservation(volume string, st target.ReservationState) error {
	if g.cat.State(volume) != gateway.Active {
		return fmt.Errorf("volume %q: %w", volume, target.ErrStandby)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.m[volume] = st
	return nil
}
