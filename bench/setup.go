package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/internal/cli"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/transport"
	_ "github.com/gosrp/gosrp/transport/ibverbs" // RDMA hardware, or a hint on how to build it
)

// openProvider opens the verbs provider named by the options. The
// software NIC gets the programs' generous retry settings: its test
// defaults (20 ms × 3) turn a GC pause on a busy machine into
// RETRY_EXC_ERR.
func openProvider(o *Options, log *slog.Logger) (transport.Provider, error) {
	return cli.OpenProvider(o.Provider, o.providerOptions(), log)
}

// providerOptions are the options the provider is opened with: the emu
// flags, --provider-option's, and over real verbs cli.BusyPoll if they
// name no busy_poll (the report says which).
func (o *Options) providerOptions() transport.Options {
	opts := transport.Options{}
	if o.Provider == "emu" {
		opts["wire"] = o.Wire
		opts["profile"] = o.Profile
	}
	for _, kv := range o.ProvOpts {
		k, v, _ := strings.Cut(kv, "=")
		opts[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return cli.WithBusyPoll(o.Provider, opts)
}

// embedded is a target running in this process on its own provider (the
// initiator's, for the loop wire).
type embedded struct {
	store  block.Store
	tgt    *target.Target
	tp     transport.Provider
	addr   string
	cancel context.CancelFunc
	served chan error
	tmpDir string
}

// startEmbedded creates the store and the volume and serves it.
func startEmbedded(o *Options, ip transport.Provider, log *slog.Logger) (*embedded, error) {
	e := &embedded{}
	var err error
	dir := o.Dir
	switch o.Backend {
	case "memory":
		e.store = block.NewMemStore()
	default:
		if dir == "" {
			if dir, err = os.MkdirTemp("", "gosrp-bench-"); err != nil {
				return nil, err
			}
			e.tmpDir = dir
		} else if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if e.store, err = block.OpenStore(o.Backend, dir); err != nil {
			e.close()
			return nil, fmt.Errorf("--backend %s: %w", o.Backend, err)
		}
	}
	size := o.Offset + o.Size
	if v, err := e.store.Open(o.Volume); err == nil {
		if v.Size() < size {
			err = v.Resize(size)
		}
		v.Close()
		if err != nil {
			e.close()
			return nil, err
		}
	} else if v, err := e.store.Create(o.Volume, size, block.DefaultBlockSize); err != nil {
		e.close()
		return nil, fmt.Errorf("create volume %s: %w", o.Volume, err)
	} else {
		v.Close()
	}
	maxXfer := max(target.DefaultMaxTransfer, int(pageRound(o.BS)))
	e.tgt, err = target.New(target.Config{
		Name: "gosrp-bench", Catalog: storecatalog.Catalog{Store: e.store},
		Credits: max(target.DefaultCredits, o.IODepth), MaxTransfer: maxXfer, Logger: log,
	})
	if err != nil {
		e.close()
		return nil, err
	}
	e.tp = ip
	if o.Wire != "loop" || o.Provider != "emu" {
		// Two NICs, like two hosts: the target has its own.
		if e.tp, err = openProvider(o, log); err != nil {
			e.close()
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	l, err := e.tp.Listen(ctx, "")
	if err != nil {
		e.close()
		return nil, fmt.Errorf("embedded target: listen: %w", err)
	}
	e.addr = l.Addr()
	e.served = make(chan error, 1)
	go func() { e.served <- e.tgt.Serve(ctx, l) }()
	return e, nil
}

func (e *embedded) close() error {
	var errs []error
	if e.tgt != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		e.tgt.Shutdown(sctx)
		cancel()
	}
	if e.cancel != nil {
		e.cancel()
		<-e.served
	}
	if e.store != nil {
		if err := e.store.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if e.tmpDir != "" {
		os.RemoveAll(e.tmpDir)
	}
	return errors.Join(errs...)
}

func pageRound(n int64) int64 {
	p := int64(transport.PageSize)
	return (n + p - 1) &^ (p - 1)
}

// srpSessionPort is the SRP initiator port of one of the run's sessions
// (a job's, the prefill's): SRP's I_T nexus is the pair of ports, and a
// session that logs in ends the nexus's other channels (SRP's SINGLE,
// as initiator's channel 0 asks), so sessions that run side by side
// need ports of their own. Job 0 has --name's own port (what a target's
// ACL knows); the others add their role to the name.
func (o *Options) srpSessionPort(role string) [16]byte {
	if role == "job0" {
		return initiator.SRPPortID(o.Name)
	}
	return initiator.SRPPortID(o.Name + "/" + role)
}

// prefill writes the whole region before the run, patterned as
// generation 1 with --verify, through a session (or Multipath) of its
// own with large transfers.
func prefill(ctx context.Context, o *Options, p transport.Provider, addr string, secret []byte, vs *verifyState, log *slog.Logger, msg io.Writer) error {
	c, err := dialConn(ctx, o, initiator.Config{Provider: p, Name: o.Name, Secret: secret, Credits: 32, Logger: log,
		Protocol: o.proto, SRPTargetPortID: o.srpPort, SRPInitiatorPortID: o.srpSessionPort("prefill"),
		ConnectTimeout: o.Timeout, LossTimeout: o.Timeout}, addr, false)
	if err != nil {
		return err
	}
	defer c.close()
	v := c.vol
	start := time.Now()
	chunk := max(o.BS, (4<<20)/o.BS*o.BS)
	end := o.Offset + o.Size
	const workers = 4
	errc := make(chan error, workers)
	next := make(chan int64)
	go func() {
		defer close(next)
		for off := o.Offset; off < end; off += chunk {
			select {
			case next <- off:
			case <-ctx.Done():
				return
			}
		}
	}()
	for w := 0; w < workers; w++ {
		go func() {
			buf := make([]byte, chunk)
			if vs == nil {
				for i := range buf {
					buf[i] = byte(i*131 + 7)
				}
			}
			for off := range next {
				b := buf[:min(chunk, end-off)]
				if vs != nil {
					for i := int64(0); i < int64(len(b)); i += o.BS {
						fillBlock(b[i:i+o.BS], uint64((off+i)/o.BS), 1, vs.run)
					}
				}
				if _, err := v.WriteAtContext(ctx, b, off); err != nil {
					errc <- fmt.Errorf("prefill at %d: %w", off, err)
					for range next {
					}
					return
				}
			}
			errc <- nil
		}()
	}
	var first error
	for w := 0; w < workers; w++ {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if vs != nil {
		for i := range vs.gens {
			vs.gens[i].Store(1)
			if vs.recording() {
				vs.submitted[i].Store(1)
			}
		}
	}
	el := time.Since(start)
	fmt.Fprintf(msg, "bench: prefilled %s in %.2fs (%.0f MiB/s)\n", formatFioSize(o.Size), el.Seconds(),
		float64(o.Size)/(1<<20)/el.Seconds())
	return nil
}
