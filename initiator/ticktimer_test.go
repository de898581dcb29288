package initiator

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/gosrp/gosrp/internal/clock"
)

// TestTickTimer: the tick timer's answers to the loop, one case per
// row, each from a timer that has just fired with the channel idle. The
// loop reads the timer's channel only after the row's calls; the row
// says how long after them the tick comes.
func TestTickTimer(t *testing.T) {
	const far = 30 * time.Second
	tests := []struct {
		name string
		do   func(w *tickTimer)
		want time.Duration // when the tick comes; 0: none within far+tick
	}{
		{"idle: no tick", func(w *tickTimer) { w.settle() }, 0},
		{"a far tick asked", func(w *tickTimer) { w.settle(); w.by(clock.Nanos() + int64(far)) }, far},
		{"busy: a tick a period away", func(w *tickTimer) { w.every() }, tick},
		{"work then quiet: the owed tick", func(w *tickTimer) { w.worked(); w.settle() }, tick},
		// A keepalive's ping armed the timer for later; work done since
		// (completions the first poll found) must not wait for it.
		{"far tick armed, then work: brought forward", func(w *tickTimer) {
			w.by(clock.Nanos() + int64(far))
			w.worked()
			w.settle()
			w.by(clock.Nanos() + int64(far))
		}, tick},
		{"owed once: the next quiet pass owes nothing", func(w *tickTimer) {
			w.worked()
			w.settle()
			<-w.t.C
			w.fired(false)
			w.settle()
		}, 0},
		{"a sooner tick asked stays", func(w *tickTimer) {
			w.by(clock.Nanos() + int64(tick/2))
			w.worked()
			w.settle()
		}, tick / 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newTickTimer()
				defer w.t.Stop()
				<-w.t.C
				w.fired(false)
				start := time.Now()
				tt.do(w)
				select {
				case <-w.t.C:
					got := time.Since(start)
					if tt.want == 0 || got != tt.want {
						t.Fatalf("tick after %v, want %v", got, tt.want)
					}
				case <-time.After(far + tick):
					if tt.want != 0 {
						t.Fatalf("no tick within %v, want one after %v", far+tick, tt.want)
					}
				}
			})
		})
	}
}
