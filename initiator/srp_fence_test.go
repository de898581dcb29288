package initiator

import "testing"

// TestSRPFence walks the orders in which a channel's loss and the first
// channel's SINGLE logins can come, and checks what the lost channel
// waits for and when the first channel is told to log in again.
func TestSRPFence(t *testing.T) {
	t.Run("loss asks for a new SINGLE", func(t *testing.T) {
		f := newSRPFence()
		n := f.begin()
		f.accepted(n) // channel 0 up as SINGLE 1
		j := f.joined()
		need := f.lost(j)
		if ok, _ := f.ready(need); ok {
			t.Fatal("a channel lost after SINGLE 1 may log in again with no SINGLE after its loss")
		}
		if !f.relogin(n) {
			t.Fatal("channel 0 on SINGLE 1 is not told to log in again")
		}
		m := f.begin()
		if f.relogin(m) {
			t.Fatalf("channel 0 on SINGLE %d is told to log in again", m)
		}
		_, changed := f.ready(need)
		f.accepted(m)
		select {
		case <-changed:
		default:
			t.Fatal("the waiting channel is not woken by the SINGLE it waits for")
		}
		if ok, _ := f.ready(need); !ok {
			t.Fatal("the lost channel still waits after SINGLE 2")
		}
	})
	t.Run("SINGLE begun before the accept does not fence", func(t *testing.T) {
		f := newSRPFence()
		f.accepted(f.begin())
		inFlight := f.begin() // channel 0 reconnecting: SINGLE 2 sent
		j := f.joined()       // then another channel's MULTI is accepted
		need := f.lost(j)
		f.accepted(inFlight)
		if ok, _ := f.ready(need); ok {
			t.Fatal("SINGLE 2, sent before the MULTI login was accepted, counts as fencing it")
		}
		if !f.relogin(inFlight) {
			t.Fatal("channel 0 on SINGLE 2 is not told to log in again")
		}
	})
	t.Run("channels ended by a SINGLE wait for nothing more", func(t *testing.T) {
		f := newSRPFence()
		f.accepted(f.begin())
		j := f.joined()
		n := f.begin() // channel 0 logs in again: the target ends j
		f.accepted(n)
		need := f.lost(j)
		if ok, _ := f.ready(need); !ok {
			t.Fatal("a channel the new SINGLE ended waits for another")
		}
		if f.relogin(n) {
			t.Fatal("a channel ended by SINGLE 2 has channel 0 log in again: every login would end the others for ever")
		}
	})
	t.Run("no MULTI while a SINGLE is under way", func(t *testing.T) {
		f := newSRPFence()
		f.accepted(f.begin())
		need := f.lost(f.joined())
		f.accepted(f.begin()) // SINGLE 2 fences the lost connection
		f.begin()             // and channel 0, lost again, sends SINGLE 3
		ok, changed := f.ready(need)
		if ok {
			t.Fatal("a channel may log in while SINGLE 3, which would end its new connection, is under way")
		}
		f.accepted(3)
		select {
		case <-changed:
		default:
			t.Fatal("the waiting channel is not woken when SINGLE 3 is accepted")
		}
		if ok, _ := f.ready(need); !ok {
			t.Fatal("the lost channel still waits once no SINGLE is under way")
		}
	})
	t.Run("owed never goes back", func(t *testing.T) {
		f := newSRPFence()
		f.accepted(f.begin())
		f.accepted(f.begin())
		f.lost(2)
		f.lost(0)
		if got := f.owed.Load(); got != 3 {
			t.Fatalf("owed %d after losses needing 3 and 1, want 3", got)
		}
	})
}
