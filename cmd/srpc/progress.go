package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/gosrp/gosrp/internal/cli"
)

// progressModes are the values of --progress.
var progressModes = []string{"auto", "always", "never"}

// unknownTotalStep is how often a copy of unknown length (a pipe) prints
// a progress line when not on a terminal.
const unknownTotalStep = 1 << 30

// progress reports a copy as it goes: a bar on a terminal, or else a line
// at every tenth of the total (every GiB when the total is unknown), so
// that a log shows where a long copy stands without a line per request.
type progress struct {
	w     io.Writer
	bar   *progressbar.ProgressBar
	lines bool
	what  string
	total int64
	done  int64
	next  int64 // where the next line is due
	start time.Time
}

// newProgress starts the report of a copy of total bytes (-1: unknown)
// for mode (--progress) to w; a nil *progress reports nothing.
func newProgress(mode string, quiet bool, w *os.File, total int64, what string) *progress {
	tty := term.IsTerminal(int(w.Fd()))
	if quiet || mode == "never" || (mode == "auto" && !tty) {
		return nil
	}
	p := &progress{w: w, what: what, total: total, start: time.Now()}
	if tty {
		p.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription(what),
			progressbar.OptionShowBytes(true),
			progressbar.OptionShowTotalBytes(true),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
		)
		return p
	}
	p.lines = true
	p.next = p.step()
	return p
}

func (p *progress) step() int64 {
	if p.total <= 0 {
		return unknownTotalStep
	}
	return max(p.total/10, 1)
}

// Add reports n more bytes copied.
func (p *progress) Add(n int) {
	if p == nil {
		return
	}
	p.done += int64(n)
	if p.bar != nil {
		p.bar.Add(n)
		return
	}
	if p.done < p.next || (p.total > 0 && p.done >= p.total) {
		return // the summary line reports the end
	}
	for p.next <= p.done {
		p.next += p.step()
	}
	if p.total > 0 {
		fmt.Fprintf(p.w, "srpc: %s: %s of %s (%d%%), %s/s\n", p.what, cli.FormatSize(p.done), cli.FormatSize(p.total),
			p.done*100/p.total, cli.FormatSize(p.rate()))
	} else {
		fmt.Fprintf(p.w, "srpc: %s: %s, %s/s\n", p.what, cli.FormatSize(p.done), cli.FormatSize(p.rate()))
	}
}

func (p *progress) rate() int64 {
	return int64(float64(p.done) / max(time.Since(p.start).Seconds(), 1e-3))
}

// Finish ends the bar; the caller prints the summary line.
func (p *progress) Finish() {
	if p != nil && p.bar != nil {
		p.bar.Finish()
	}
}
