package refs

import "testing"

func TestCount(t *testing.T) {
	var c Count
	for range 2 {
		if !c.Hold() {
			t.Fatal("an open resource refused a holder")
		}
	}
	if n, closed := c.Close(); n != 2 || closed || c.Closed() {
		t.Fatalf("Close with 2 holders: %d, %v, closed %v; want 2, false, still open", n, closed, c.Closed())
	}
	c.Release()
	c.Release()
	if n, closed := c.Close(); n != 0 || !closed || !c.Closed() {
		t.Fatalf("Close with no holder: %d, %v, closed %v; want 0, true, closed", n, closed, c.Closed())
	}
	if c.Hold() {
		t.Fatal("a closed resource took a holder")
	}
	if n, closed := c.Close(); n != 0 || closed {
		t.Fatalf("second Close: %d, %v; want 0, false", n, closed)
	}

	var d Count
	d.Hold()
	if n, closed := d.Shut(); n != 1 || !closed || !d.Closed() {
		t.Fatalf("Shut with a holder: %d, %v, closed %v; want 1, true, true", n, closed, d.Closed())
	}
	if _, closed := d.Shut(); closed {
		t.Fatal("second Shut closed it again")
	}
	if n, closed := d.Close(); n != 0 || closed {
		t.Fatalf("Close after Shut, a holder left: %d, %v; want 0, false", n, closed)
	}
	if d.Hold() {
		t.Fatal("a shut resource took a holder")
	}
}
