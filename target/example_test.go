package target_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/transport/emu"
)

// Example embeds a target serving a memory volume over the software NIC.
func Example() {
	store := block.NewMemStore()
	defer store.Close()
	v, _ := store.Create("disk0", 64<<20, 4096)
	v.Close()

	nic, _ := emu.New(emu.Config{Wire: emu.WireLoop})
	defer nic.Close()
	l, _ := nic.Listen(context.Background(), "")

	t, err := target.New(target.Config{Name: "example", Catalog: storecatalog.Catalog{Store: store}})
	if err != nil {
		panic(err)
	}
	served := make(chan error, 1)
	go func() { served <- t.Serve(context.Background(), l) }()

	// ... initiators connect to l.Addr() ...

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fmt.Println("shutdown:", t.Shutdown(ctx))
	fmt.Println("serve returned ErrClosed:", errors.Is(<-served, target.ErrClosed))
	fmt.Println("connections:", t.Stats().Connections)
	// Output:
	// shutdown: <nil>
	// serve returned ErrClosed: true
	// connections: 0
}
