package initiator

import (
	"testing"
	"time"
)

// TestKeepalive drives the keepalive's decisions with a fake clock: each
// step is a tick at a time (ms), with or without something heard since
// the last one and an answer owed, and the action it must ask for.
func TestKeepalive(t *testing.T) {
	type step struct {
		at    int64 // ms
		heard bool
		busy  bool
		want  kaAction
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"I/O completing: no ping ever", []step{
			{400, true, true, kaNone}, {800, true, true, kaNone}, {1200, true, true, kaNone}, {5000, true, true, kaNone},
		}},
		{"idle: a ping at half the timeout, answered", []step{
			{400, false, false, kaNone}, {500, false, false, kaPing}, {600, false, true, kaNone},
			{700, true, false, kaNone}, {1100, false, false, kaNone}, {1200, false, false, kaPing},
		}},
		{"idle, the ping unanswered: dead at the timeout", []step{
			{500, false, false, kaPing}, {900, false, true, kaNone}, {1000, false, true, kaDead},
		}},
		{"idle, the ping lost before it went out: dead all the same", []step{
			{500, false, false, kaPing}, {1000, false, false, kaDead},
		}},
		{"outstanding past half: one ping; a live target answers it", []step{
			{500, false, true, kaPing}, {600, false, true, kaNone}, {700, true, true, kaNone}, {1100, false, true, kaNone}, {1200, false, true, kaPing},
		}},
		{"outstanding, silent: dead at the timeout, not before", []step{
			{500, false, true, kaPing}, {999, false, true, kaNone}, {1000, false, true, kaDead},
		}},
		{"idle and never pinged (ticks skipped): not dead", []step{
			{0, false, false, kaNone}, {3000, false, false, kaPing},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := keepalive{timeout: int64(time.Second)}
			k.reset(0)
			for i, s := range tc.steps {
				k.heard = k.heard || s.heard
				if got := k.tick(s.at*int64(time.Millisecond), s.busy); got != s.want {
					t.Fatalf("step %d (%+v): %d, want %d", i, s, got, s.want)
				}
			}
		})
	}
	var off keepalive
	if off.tick(int64(time.Hour), true) != kaNone {
		t.Error("a keepalive that is off acted")
	}
}
