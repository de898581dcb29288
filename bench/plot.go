package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
)

// The plot: two panels in one SVG. On top, IOPS per report interval over
// time, one line per operation. Below, the latency distribution as an
// HdrHistogram-style percentile spectrum: x is the percentile on a
// 1/(1-q) log scale (50 %, 90 %, 99 %, 99.9 %, …), y the latency on a log
// scale, one line per operation.

const (
	plotW       = 900
	panelH      = 300
	plotMarginL = 80
	plotMarginR = 30
	plotMarginT = 50
	plotGap     = 90
)

var plotColors = [numOps]string{"#1f77b4", "#d62728"}

type svgWriter struct{ b bytes.Buffer }

func (s *svgWriter) f(format string, a ...any) { fmt.Fprintf(&s.b, format, a...) }

func esc(t string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(t))
	return b.String()
}

func (s *svgWriter) text(x, y float64, anchor, class, t string) {
	s.f(`<text x="%.1f" y="%.1f" text-anchor="%s" class="%s">%s</text>`+"\n", x, y, anchor, class, esc(t))
}

func (s *svgWriter) line(x1, y1, x2, y2 float64, class string) {
	s.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="%s"/>`+"\n", x1, y1, x2, y2, class)
}

func (s *svgWriter) polyline(pts [][2]float64, color string) {
	if len(pts) == 0 {
		return
	}
	var b strings.Builder
	for _, p := range pts {
		fmt.Fprintf(&b, "%.1f,%.1f ", p[0], p[1])
	}
	s.f(`<polyline points="%s" fill="none" stroke="%s" stroke-width="2" stroke-linejoin="round"/>`+"\n", strings.TrimSpace(b.String()), color)
	if len(pts) == 1 {
		s.f(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", pts[0][0], pts[0][1], color)
	}
}

// niceStep is a 1, 2 or 5 × 10^k step giving about n ticks over span.
func niceStep(span float64, n int) float64 {
	if span <= 0 {
		return 1
	}
	raw := span / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func fmtTick(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}

// writePlot draws the SVG.
func writePlot(w io.Writer, r *result) error {
	s := &svgWriter{}
	height := plotMarginT + panelH + plotGap + panelH + 60
	s.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif">`+"\n", plotW, height, plotW, height)
	s.f(`<style>.t{font-size:16px;font-weight:bold}.l{font-size:12px;fill:#333}.a{stroke:#333;stroke-width:1}.g{stroke:#ddd;stroke-width:1}</style>` + "\n")
	s.f(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	o := r.o
	title := fmt.Sprintf("gosrp bench: %s bs=%s iodepth=%d numjobs=%d, %s wire, %s", o.RW, formatFioSize(o.BS), o.IODepth, o.NumJobs, o.Wire, r.target)
	s.text(plotW/2, 24, "middle", "t", title)
	ops := activeOps(o)
	x0, x1 := float64(plotMarginL), float64(plotW-plotMarginR)

	// Panel 1: IOPS over time.
	top := float64(plotMarginT)
	bot := top + panelH
	var tmax, ymax float64
	for _, smp := range r.samples {
		tmax = math.Max(tmax, smp.T.Seconds())
		for _, op := range ops {
			ymax = math.Max(ymax, float64(smp.Ops[op])/smp.Dur.Seconds())
		}
	}
	if tmax == 0 {
		tmax = 1
	}
	ystep := niceStep(ymax, 5)
	ymax = math.Max(ystep, math.Ceil(ymax/ystep)*ystep)
	sx := func(t float64) float64 { return x0 + (x1-x0)*t/tmax }
	sy := func(v float64) float64 { return bot - (bot-top)*v/ymax }
	for v := 0.0; v <= ymax+ystep/2; v += ystep {
		s.line(x0, sy(v), x1, sy(v), "g")
		s.text(x0-8, sy(v)+4, "end", "l", fmtTick(v))
	}
	tstep := niceStep(tmax, 8)
	for t := 0.0; t <= tmax+tstep/100; t += tstep {
		s.line(sx(t), bot, sx(t), bot+5, "a")
		s.text(sx(t), bot+20, "middle", "l", fmt.Sprintf("%gs", t))
	}
	s.line(x0, top, x0, bot, "a")
	s.line(x0, bot, x1, bot, "a")
	s.text(x0-60, (top+bot)/2, "middle", "l", "IOPS")
	s.text((x0+x1)/2, bot+40, "middle", "l", "elapsed (s)")
	for _, op := range ops {
		var pts [][2]float64
		for _, smp := range r.samples {
			pts = append(pts, [2]float64{sx(smp.T.Seconds()), sy(float64(smp.Ops[op]) / smp.Dur.Seconds())})
		}
		s.polyline(pts, plotColors[op])
	}
	legend(s, x1, top, ops, func(op int) string {
		h := &r.ops[op].Lat
		return fmt.Sprintf("%s: %s IOPS", opNames[op], fioCount(float64(h.Count())/math.Max(r.elapsed.Seconds(), 1e-9)))
	})

	// Panel 2: percentile spectrum.
	top = bot + plotGap
	bot = top + panelH
	const maxNines = 5.0 // up to 99.999 %
	lmin, lmax := math.Inf(1), 0.0
	for _, op := range ops {
		h := &r.ops[op].Lat
		if h.Count() == 0 {
			continue
		}
		lmin = math.Min(lmin, math.Max(float64(h.Min())/1e3, 0.1))
		lmax = math.Max(lmax, float64(h.Max())/1e3)
	}
	if lmax == 0 {
		lmin, lmax = 1, 10
	}
	dmin, dmax := math.Floor(math.Log10(lmin)), math.Ceil(math.Log10(lmax))
	if dmax <= dmin {
		dmax = dmin + 1
	}
	px := func(nines float64) float64 { return x0 + (x1-x0)*nines/maxNines }
	py := func(usv float64) float64 {
		return bot - (bot-top)*(math.Log10(math.Max(usv, lmin))-dmin)/(dmax-dmin)
	}
	for d := dmin; d <= dmax; d++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, d)
			if math.Log10(v) > dmax+1e-9 {
				break
			}
			s.line(x0, py(v), x1, py(v), "g")
			s.text(x0-8, py(v)+4, "end", "l", fmtTick(v))
		}
	}
	for n := 0.0; n <= maxNines; n++ {
		q := 100 * (1 - math.Pow(10, -n))
		label := strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", q), "0"), ".") + "%"
		s.line(px(n), bot, px(n), bot+5, "a")
		s.text(px(n), bot+20, "middle", "l", label)
	}
	s.line(x0, top, x0, bot, "a")
	s.line(x0, bot, x1, bot, "a")
	s.text(x0-60, (top+bot)/2, "middle", "l", "µs")
	s.text((x0+x1)/2, bot+40, "middle", "l", "percentile (latency from submit to completion)")
	for _, op := range ops {
		h := &r.ops[op].Lat
		if h.Count() == 0 {
			continue
		}
		var pts [][2]float64
		for i := 0; i <= 200; i++ {
			nines := maxNines * float64(i) / 200
			q := 100 * (1 - math.Pow(10, -nines))
			if 1-q/100 < 1/float64(h.Count()) && i > 0 {
				pts = append(pts, [2]float64{px(nines), py(float64(h.Max()) / 1e3)})
				break
			}
			pts = append(pts, [2]float64{px(nines), py(float64(h.Percentile(q)) / 1e3)})
		}
		s.polyline(pts, plotColors[op])
	}
	legend(s, x1, top, ops, func(op int) string {
		h := &r.ops[op].Lat
		return fmt.Sprintf("%s: p50 %.1fµs p99 %.1fµs p99.9 %.1fµs max %.1fµs", opNames[op],
			us(h.Percentile(50)), us(h.Percentile(99)), us(h.Percentile(99.9)), us(h.Max()))
	})
	s.f("</svg>\n")
	_, err := w.Write(s.b.Bytes())
	return err
}

func legend(s *svgWriter, right, top float64, ops []int, label func(op int) string) {
	for i, op := range ops {
		y := top + 16 + float64(i)*18
		s.f(`<rect x="%.1f" y="%.1f" width="20" height="4" fill="%s"/>`+"\n", right-330, y-6, plotColors[op])
		s.f(`<text x="%.1f" y="%.1f" class="l">%s</text>`+"\n", right-304, y, esc(label(op)))
	}
}
