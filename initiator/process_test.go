package initiator_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/initiator"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/target/storecatalog"
	"github.com/gosrp/gosrp/transport/emu"
)

// TestMain lets the test binary serve as the target process of
// TestSeparateProcess.
func TestMain(m *testing.M) {
	if wire := os.Getenv("GOSRP_E2E_TARGET_WIRE"); wire != "" {
		os.Exit(targetProcess(wire, os.Getenv("GOSRP_E2E_TARGET_PROFILE")))
	}
	os.Exit(m.Run())
}

// targetProcess serves a 16 MiB memory volume, prints its address and
// serves until stdin closes.
func targetProcess(wire, profile string) int {
	p, err := emu.New(emu.Config{Wire: wire, Profile: profile, RetryTimeout: 200 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st := block.NewMemStore()
	if _, err := st.Create("vol0", 16<<20, 4096); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	t, err := target.New(target.Config{Name: "child", Catalog: storecatalog.Catalog{Store: st}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := p.Listen(ctx, "")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ADDR", l.Addr())
	go func() {
		buf := make([]byte, 1)
		os.Stdin.Read(buf) // parent closes stdin to stop us
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		t.Shutdown(sctx)
		scancel()
		cancel()
	}()
	t.Serve(ctx, l)
	p.Close()
	return 0
}

// TestSeparateProcess runs the verified workload against a target in
// another process, over the tcp and shm wires, as two hosts (or two
// processes on one host) would.
func TestSeparateProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second process")
	}
	for _, wire := range []string{emu.WireTCP, "shm"} {
		if !hasWire(wire) {
			continue
		}
		for _, prof := range []string{"strict", "rxe"} {
			t.Run("profile="+prof+"/wire="+wire, func(t *testing.T) {
				seed := testSeed(t)
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), "GOSRP_E2E_TARGET_WIRE="+wire, "GOSRP_E2E_TARGET_PROFILE="+prof)
				stdin, err := cmd.StdinPipe()
				if err != nil {
					t.Fatal(err)
				}
				out, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				t.Cleanup(func() {
					stdin.Close()
					select {
					case err := <-done:
						if err != nil {
							t.Errorf("target process: %v", err)
						}
					case <-time.After(15 * time.Second):
						cmd.Process.Kill()
						t.Error("target process did not exit")
					}
				})
				line, err := bufio.NewReader(out).ReadString('\n')
				go func() { done <- cmd.Wait() }()
				addr, ok := strings.CutPrefix(strings.TrimSpace(line), "ADDR ")
				if err != nil || !ok {
					t.Fatalf("target process said %q: %v", line, err)
				}
				p, err := emu.New(emu.Config{Wire: wire, Profile: prof, Seed: seed, RetryTimeout: 200 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				s, err := initiator.Dial(ctx, initiator.Config{Provider: p, Addr: addr, Name: "parent", Credits: 32, Channels: 2})
				if err != nil {
					t.Fatal(err)
				}
				v := openVol0(t, ctx, s)
				gens := workload(t, v, seed, 32, 2000)
				if err := v.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				verifyAll(t, v, gens, seed)
				if st := s.Stats(); st.ConnectionsLost != 0 {
					t.Errorf("%d connections lost", st.ConnectionsLost)
				}
				s.Close()
				p.Close()
			})
		}
	}
}

func hasWire(w string) bool {
	for _, x := range emu.Wires() {
		if x == w {
			return true
		}
	}
	return false
}
