package main

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gosrp/gosrp/block"
	"github.com/gosrp/gosrp/internal/gateway"
	"github.com/gosrp/gosrp/target"
	"github.com/gosrp/gosrp/transport"
	"github.com/gosrp/gosrp/transport/emu"
)

// collector exports target.Stats (read on each scrape) and the store's
// volume sizes as Prometheus metrics; nothing is updated per I/O.
type collector struct {
	tgt   *target.Target
	store block.Store
	// acceptErrs reads the provider's count of temporary accept
	// failures; nil when the provider keeps none.
	acceptErrs func() uint64
	// gw reads the gateway catalog's per-volume record; nil when the
	// store is not shared by gateways.
	gw func() []gateway.VolumeStats

	conns, accepted, rejected, violations, credits, acceptErrors *prometheus.Desc
	ops, bytes, errors, latency, size, connCredits               *prometheus.Desc

	spaceTotal, spaceFree, spaceReserve, spaceFull, spaceRefused, provisioned *prometheus.Desc

	gwState, gwBreaks, gwRefused, gwFenced *prometheus.Desc
}

func newCollector(t *target.Target, s block.Store, acceptErrs func() uint64, gw func() []gateway.VolumeStats) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("srpd_"+name, help, labels, nil)
	}
	return &collector{
		tgt: t, store: s, acceptErrs: acceptErrs, gw: gw,
		acceptErrors: d("accept_errors_total", "Temporary failures accepting a connection (out of descriptors, say), each retried; emu provider only."),
		conns:        d("connections", "Live initiator connections."),
		accepted:     d("connections_accepted_total", "Connections accepted since start."),
		rejected:     d("connections_rejected_total", "Connection requests or logins refused since start."),
		violations:   d("protocol_violations_total", "Connections closed for a protocol violation or transfer error."),
		credits:      d("credits_in_use", "Commands received and not yet answered, over all connections."),
		connCredits:  d("connection_credits", "Credits granted to a connection and in use.", "conn", "initiator", "kind"),
		ops:          d("volume_ops_total", "Commands completed per volume and operation.", "volume", "op"),
		bytes:        d("volume_bytes_total", "Bytes moved (or discarded / zeroed) by successful commands.", "volume", "op"),
		errors:       d("volume_errors_total", "Commands that failed, per volume and operation.", "volume", "op"),
		latency:      d("volume_latency_seconds", "Command latency from arrival to response (log2 buckets; the sum is estimated from bucket midpoints).", "volume"),
		size:         d("volume_size_bytes", "Size of each volume in the store.", "volume"),

		spaceTotal:   d("store_capacity_bytes", "Size of the store's file system."),
		spaceFree:    d("store_free_bytes", "Bytes available on the store's file system (statfs f_bavail, at most 100 ms old)."),
		spaceReserve: d("store_reserve_bytes", "Free space below which writes fail with ENOSPC (--space-reserve)."),
		spaceFull:    d("store_full", "1 while the store refuses writes for lack of space."),
		spaceRefused: d("store_refused_writes_total", "Writes refused with ENOSPC since start."),
		provisioned:  d("store_provisioned_bytes", "Sum of the volume sizes (thin provisioning; bounded by --max-overcommit)."),

		gwState:   d("gateway_path_state", "1 for a volume's path state at this gateway (closed, standby, active, fenced), 0 for the others; rbd only.", "volume", "state"),
		gwBreaks:  d("gateway_lock_breaks_total", "Lock breaks this gateway made to take a volume over, each a client blocklisted on the cluster.", "volume"),
		gwRefused: d("gateway_takeovers_refused_total", "Takeovers refused because this gateway broke the volume's lock --break-limit times already.", "volume"),
		gwFenced:  d("gateway_fencings_total", "Times another gateway's lock break fenced this one from a volume.", "volume"),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.accepted, c.rejected, c.violations, c.credits, c.connCredits,
		c.ops, c.bytes, c.errors, c.latency, c.size,
		c.spaceTotal, c.spaceFree, c.spaceReserve, c.spaceFull, c.spaceRefused, c.provisioned} {
		ch <- d
	}
	if c.acceptErrs != nil {
		ch <- c.acceptErrors
	}
	if c.gw != nil {
		for _, d := range []*prometheus.Desc{c.gwState, c.gwBreaks, c.gwRefused, c.gwFenced} {
			ch <- d
		}
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.tgt.Stats()
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(st.Connections))
	ch <- prometheus.MustNewConstMetric(c.accepted, prometheus.CounterValue, float64(st.Accepted))
	ch <- prometheus.MustNewConstMetric(c.rejected, prometheus.CounterValue, float64(st.Rejected))
	ch <- prometheus.MustNewConstMetric(c.violations, prometheus.CounterValue, float64(st.Violations))
	ch <- prometheus.MustNewConstMetric(c.credits, prometheus.GaugeValue, float64(st.CreditsInUse))
	if c.acceptErrs != nil {
		ch <- prometheus.MustNewConstMetric(c.acceptErrors, prometheus.CounterValue, float64(c.acceptErrs()))
	}
	for _, cn := range st.Conns {
		id := uitoa(cn.ID)
		ch <- prometheus.MustNewConstMetric(c.connCredits, prometheus.GaugeValue, float64(cn.Credits), id, cn.Initiator, "granted")
		ch <- prometheus.MustNewConstMetric(c.connCredits, prometheus.GaugeValue, float64(cn.CreditsInUse), id, cn.Initiator, "in_use")
	}
	for _, v := range st.Volumes {
		for _, o := range []struct {
			name string
			s    target.OpStats
		}{{"read", v.Read}, {"write", v.Write}, {"flush", v.Flush}, {"discard", v.Discard}, {"write_zeroes", v.WriteZeroes}} {
			ch <- prometheus.MustNewConstMetric(c.ops, prometheus.CounterValue, float64(o.s.Ops), v.Name, o.name)
			ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(o.s.Bytes), v.Name, o.name)
			ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(o.s.Errors), v.Name, o.name)
		}
		count, sum, buckets := promHistogram(&v.Latency)
		ch <- prometheus.MustNewConstHistogram(c.latency, count, sum, buckets, v.Name)
	}
	if c.gw != nil {
		for _, v := range c.gw() {
			for _, s := range []gateway.State{gateway.Closed, gateway.Standby, gateway.Active, gateway.Fenced} {
				on := 0.0
				if v.State == s {
					on = 1
				}
				ch <- prometheus.MustNewConstMetric(c.gwState, prometheus.GaugeValue, on, v.Name, s.String())
			}
			ch <- prometheus.MustNewConstMetric(c.gwBreaks, prometheus.CounterValue, float64(v.Breaks), v.Name)
			ch <- prometheus.MustNewConstMetric(c.gwRefused, prometheus.CounterValue, float64(v.Refused), v.Name)
			ch <- prometheus.MustNewConstMetric(c.gwFenced, prometheus.CounterValue, float64(v.Fenced), v.Name)
		}
	}
	if vols, err := c.store.List(); err == nil {
		for _, v := range vols {
			ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(v.Size), v.Name)
		}
	}
	if sr, ok := c.store.(block.SpaceReporter); ok {
		if sp, err := sr.Space(); err == nil && sp.Known {
			full := 0.0
			if sp.Full {
				full = 1
			}
			ch <- prometheus.MustNewConstMetric(c.spaceTotal, prometheus.GaugeValue, float64(sp.Total))
			ch <- prometheus.MustNewConstMetric(c.spaceFree, prometheus.GaugeValue, float64(sp.Free))
			ch <- prometheus.MustNewConstMetric(c.spaceReserve, prometheus.GaugeValue, float64(sp.Reserve))
			ch <- prometheus.MustNewConstMetric(c.spaceFull, prometheus.GaugeValue, full)
			ch <- prometheus.MustNewConstMetric(c.spaceRefused, prometheus.CounterValue, float64(sp.RefusedWrites))
			ch <- prometheus.MustNewConstMetric(c.provisioned, prometheus.GaugeValue, float64(sp.Provisioned))
		}
	}
}

// promHistogram converts the target's log2 microsecond histogram (bucket 0
// under 1µs, bucket i in [2^(i-1), 2^i) µs, the last one open-ended) to
// cumulative Prometheus buckets in seconds.
func promHistogram(h *target.Histogram) (uint64, float64, map[float64]uint64) {
	buckets := make(map[float64]uint64, target.HistogramBuckets-1)
	var cum uint64
	var sum float64
	for i, n := range h.Buckets {
		lo, hi := 0.0, 1e-6
		if i > 0 {
			lo, hi = math.Ldexp(1e-6, i-1), math.Ldexp(1e-6, i)
		}
		cum += n
		if i < target.HistogramBuckets-1 {
			buckets[hi] = cum
			sum += float64(n) * (lo + hi) / 2
		} else {
			sum += float64(n) * lo
		}
	}
	return cum, sum, buckets
}

func uitoa(n uint64) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}

// acceptErrors reads the software NIC's count of temporary accept
// failures (the listener retries them, so they show nowhere else); nil
// for a provider that keeps no such count.
func acceptErrors(p transport.Provider) func() uint64 {
	if ep, ok := p.(*emu.Provider); ok {
		return func() uint64 { return ep.Counters().AcceptErrors }
	}
	return nil
}

// newRegistry gathers srpd's metrics; gw is the gateway catalog's
// Stats, nil when the store is not shared.
func newRegistry(t *target.Target, s block.Store, acceptErrs func() uint64, gw func() []gateway.VolumeStats) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(t, s, acceptErrs, gw), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
