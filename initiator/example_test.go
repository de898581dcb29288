package initiator_test

import (
	"context"
	"fmt"
	"log"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/transport"
	_ "github.com/gosrp/gosrp/transport/emu" // the software NIC
)

// Example dials a target, opens a volume and reads back what it wrote. A
// target runs in the same process here; against srpd, use the tcp wire
// and srpd's address.
func Example() {
	ctx := context.Background()
	p, err := transport.Open("emu", transport.Options{"wire": "loop"})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	addr := startTarget(ctx, p) // srpd's job in real life

	s, err := initiator.Dial(ctx, initiator.Config{Provider: p, Addr: addr, Name: "example"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	v, err := s.Open(ctx, "vol0", initiator.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := v.WriteAt([]byte("hello, remote block device"), 100); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 26)
	if _, err := v.ReadAt(buf, 100); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s (%d bytes, %d-byte blocks)\n", buf, v.Size(), v.BlockSize())
	// Output: hello, remote block device (1048576 bytes, 4096-byte blocks)
}

func startTarget(ctx context.Context, p transport.Provider) string {
	st := block.NewMemStore()
	if _, err := st.Create("vol0", 1<<20, 4096); err != nil {
		log.Fatal(err)
	}
	t, err := target.New(target.Config{Catalog: storecatalog.Catalog{Store: st}})
	if err != nil {
		log.Fatal(err)
	}
	l, err := p.Listen(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	go t.Serve(ctx, l)
	return l.Addr()
}
