#!/usr/bin/env python3
"""peers-summary.py OUT: the table of a peers.sh run.

Reads OUT/ROUND-PEER-JOB.json (fio's JSON, or bench's fio-shaped JSON),
OUT/ROUND-PEER-JOB.cpu (guest busy jiffies over the job) and
OUT/raw-ib_*_bw.log (perftest), and prints, per peer and job, the median
over rounds with its spread, then the ratios of each gosrp peer (every peer
whose name starts with gosrp) against the better kernel peer and against the
raw device, and of srpd behind ib_srp against ib_srpt behind the same
ib_srp. Exit status 1 if no job produced a figure.
"""
import glob
import json
import os
import re
import statistics
import sys

HZ = 100  # USER_HZ: /proc/stat counts in 1/100 s
JOBS = [("rr32", "4K randread QD32"), ("rr1", "4K randread QD1"), ("rw32", "4K randwrite QD32"),
        ("rw1", "4K randwrite QD1"), ("sr128", "128K read QD8")]
KERNEL = ["nvme", "srp"]
# Peers whose name starts with srpd are srpd's SRP personality behind the
# kernel's ib_srp, compared with ib_srpt behind the same ib_srp (the srp
# peer; issue 25's goal: IOPS >= 1.0x).
SRPD_BASE = "srp"


def job_figures(path):
    """IOPS, p50 completion latency (us), I/Os and MiB/s of one job file."""
    with open(path) as f:
        j = json.load(f)
    iops = ios = bw = 0.0
    p50 = None
    for job in j.get("jobs", []):
        for d in ("read", "write"):
            io = job.get(d, {})
            if not io.get("iops"):
                continue
            iops += io["iops"]
            ios += io.get("total_ios", 0)
            bw += io.get("bw_bytes", 0) / (1 << 20)
            for key in ("clat_ns", "lat_ns"):
                pct = io.get(key, {}).get("percentile", {})
                if "50.000000" in pct:
                    p50 = pct["50.000000"] / 1000
                    break
    return iops, p50, ios, bw


def spread(xs, fmt):
    if not xs:
        return "-"
    m = statistics.median(xs)
    return f"{fmt(m)} [{fmt(min(xs))}-{fmt(max(xs))}]" if len(xs) > 1 else fmt(m)


def kfmt(x):
    return f"{x / 1000:.2f}k" if x >= 1000 else f"{x:.0f}"


def main(out):
    cells = {}
    for path in glob.glob(os.path.join(out, "*-*-*.json")):
        m = re.match(r"(\d+)-([a-z0-9]+)-([a-z0-9]+)\.json$", os.path.basename(path))
        if not m:
            continue
        _, peer, job = m.groups()
        try:
            iops, p50, ios, bw = job_figures(path)
        except (OSError, ValueError):
            continue
        cpu = None
        try:
            with open(path[:-5] + ".cpu") as f:
                cpu = int(f.read().split()[0]) / HZ
        except (OSError, ValueError, IndexError):
            pass
        c = cells.setdefault((peer, job), {"iops": [], "p50": [], "cpu": [], "bw": [], "tcpu": []})
        try:
            with open(path[:-5] + ".tcpu") as f:
                if ios:
                    c["tcpu"].append(int(f.read().split()[0]) / HZ / ios * 1e6)
        except (OSError, ValueError, IndexError):
            pass
        c["iops"].append(iops)
        c["bw"].append(bw)
        if p50 is not None:
            c["p50"].append(p50)
        if cpu is not None and ios:
            c["cpu"].append(cpu / ios * 1e6)
    raw = {}
    for t in ("ib_write_bw", "ib_read_bw"):
        try:
            with open(os.path.join(out, f"raw-{t}.log")) as f:
                rows = [l.split() for l in f if re.match(r"\s*4096\s+\d+", l)]
            if rows:
                raw[t] = float(rows[-1][4]) * 1e6  # MsgRate, Mpps
        except (OSError, ValueError, IndexError):
            pass
    if not cells:
        print("peers-summary: no job produced a figure", file=sys.stderr)
        return 1
    gosrps = sorted({p for p, _ in cells if p.startswith("gosrp")})
    width = max([6] + [len(p) for p in gosrps])
    print(f"{'peer':{width}} {'job':18} {'IOPS median [min-max]':26} {'p50 us':22} {'MiB/s':18} {'CPU us/IO':18}")
    srpds = sorted({p for p, _ in cells if p.startswith("srpd")})
    for peer in gosrps + srpds + KERNEL:
        for job, label in JOBS:
            c = cells.get((peer, job))
            if not c:
                continue
            print(f"{peer:{width}} {label:18} {spread(c['iops'], kfmt):26} {spread(c['p50'], lambda x: f'{x:.0f}'):22} "
                  f"{spread(c['bw'], lambda x: f'{x:.1f}'):18} {spread(c['cpu'], lambda x: f'{x:.0f}'):18}")
    for t, rate in raw.items():
        print(f"raw    {t} 4 KiB: {kfmt(rate)} messages/s")
    for gp in gosrps:
        print(f"\n{gp} against the better kernel peer (and the raw device), medians of this boot:")
        for job, label in JOBS:
            g = cells.get((gp, job))
            peers = [cells[(p, job)] for p in KERNEL if (p, job) in cells]
            if not g or not peers:
                continue
            best = max(statistics.median(p["iops"]) for p in peers)
            line = f"  {label:18} IOPS {statistics.median(g['iops']) / best:.2f}x"
            if g["p50"] and all(p["p50"] for p in peers):
                line += f", p50 {statistics.median(g['p50']) / min(statistics.median(p['p50']) for p in peers):.2f}x"
            if g["cpu"] and all(p["cpu"] for p in peers):
                line += f", CPU/IO {statistics.median(g['cpu']) / min(statistics.median(p['cpu']) for p in peers):.2f}x"
            rr = raw.get("ib_read_bw" if "read" in label else "ib_write_bw")
            if rr and label.startswith("4K"):
                line += f", {statistics.median(g['iops']) / rr:.0%} of raw"
            print(line)
    base = SRPD_BASE
    for peer in srpds:
        if not any((peer, job) in cells and (base, job) in cells for job, _ in JOBS):
            continue
        print(f"\nib_srp -> {peer} against ib_srp -> ib_srpt (the same kernel initiator and fio job), medians of this boot:")
        for job, label in JOBS:
            g, k = cells.get((peer, job)), cells.get((base, job))
            if not g or not k:
                continue
            line = f"  {label:18} IOPS {statistics.median(g['iops']) / statistics.median(k['iops']):.2f}x"
            if g["p50"] and k["p50"]:
                line += f", p50 {statistics.median(g['p50']) / statistics.median(k['p50']):.2f}x"
            if g["cpu"] and k["cpu"]:
                line += f", CPU/IO {statistics.median(g['cpu']) / statistics.median(k['cpu']):.2f}x"
            if g["tcpu"]:
                line += f" (srpd itself {statistics.median(g['tcpu']):.0f} us/IO)"
            print(line)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: peers-summary.py OUT", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
