#!/usr/bin/env python3
"""Helpers for test/sidebyside/run.sh: run one client with CPU accounting,
and print the side-by-side table from the results directory.

  sbs.py run OUTPREFIX PIDS -- CMD...   runs CMD; writes OUTPREFIX.cpu with
                                        client CPU s, server CPU s, wall s
  sbs.py report DIR                     prints the table and the goals
  sbs.py wake                           prints the round trip of a pipe
                                        between two processes on different
                                        CPUs and on one (the cost of a
                                        cross-CPU wake-up on this machine)
"""
import json, os, statistics, subprocess, sys, time, glob

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pids):
    t = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            t += int(rest[11]) + int(rest[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return t / TICK


def cmd_run(argv):
    prefix, pids = argv[0], [p for p in argv[1].split(",") if p]
    cmd = argv[argv.index("--") + 1:]
    s0, w0 = proc_cpu(pids), time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(prefix + ".err", "w"))
    _, status, ru = os.wait4(proc.pid, 0)
    wall, srv = time.monotonic() - w0, proc_cpu(pids) - s0
    with open(prefix + ".cpu", "w") as f:
        f.write(f"{ru.ru_utime + ru.ru_stime:.3f} {srv:.3f} {wall:.3f}\n")
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.stderr.write(f"  ! {' '.join(cmd[:3])}... exited {code}; see {prefix}.err\n")
    return code


JOBS = [  # key, title, seq (report MiB/s)
    ("rr1", "4K randread QD1", False),
    ("rr32", "4K randread QD32", False),
    ("rw1", "4K randwrite QD1", False),
    ("rw32", "4K randwrite QD32", False),
    ("sr8", "128K read QD8 MiB/s", True),
    ("sw8", "128K write QD8 MiB/s", True),
    ("fl32", "4K randwrite QD32 +flush/s", False),
]
TARGETS = [  # key, label
    ("tmpfs-psync", "tmpfs file, fio psync (QD1 ceiling)"),
    ("tmpfs-uring", "tmpfs file, fio io_uring (ceiling)"),
    ("nbdkit-unix", "nbdkit memory, unix socket"),
    ("nbdkit-tcp", "nbdkit memory, TCP"),
    ("qemu-nbd", "qemu-nbd raw on tmpfs, unix"),
    ("gosrp-nbd-tcp", "fio → srpc nbd → srpd mem, emu tcp"),
    ("gosrp-nbd-shm", "fio → srpc nbd → srpd mem, emu shm"),
    ("bench-tcp", "bench → srpd mem, emu tcp"),
    ("bench-shm", "bench → srpd mem, emu shm"),
    ("gosrp-pebble", "fio → srpc nbd → srpd pebble(tmpfs), tcp"),
    ("bench-pebble-tcp", "bench → srpd pebble(tmpfs), emu tcp"),
    ("bench-pebble-shm", "bench → srpd pebble(tmpfs), emu shm"),
]
NBD_PEERS = ["nbdkit-unix", "nbdkit-tcp", "qemu-nbd"]


def load(d, target, job):
    """Per-round figures: iops, MiB/s, p50 µs, kIOPS per busy core."""
    out = []
    for rd in sorted(glob.glob(os.path.join(d, "r*"))):
        base = os.path.join(rd, f"{target}.{job}")
        try:
            with open(base + ".json") as f:
                txt = f.read()
            j = json.loads(txt[txt.index("{"):])
            job0 = j["jobs"][0]
            io = job0["read"] if job0["read"]["io_bytes"] > 0 else job0["write"]
            pct = (io.get("lat_ns", {}).get("percentile") or io.get("clat_ns", {}).get("percentile") or {})
            p50 = pct.get("50.000000", 0) / 1000
            iops = io["iops"]
            mib = io["bw_bytes"] / 2**20 if "bw_bytes" in io else io["bw"] / 1024
            kpc = None
            try:
                with open(base + ".cpu") as f:
                    cli, srv, wall = map(float, f.read().split())
                if cli + srv > 0:
                    kpc = iops / ((cli + srv) / wall) / 1000
            except (OSError, ValueError):
                pass
            fps = None
            if job == "fl32" and io.get("runtime"):
                fps = job0.get("sync", {}).get("total_ios", 0) / (io["runtime"] / 1000)
            out.append(dict(iops=iops, mib=mib, p50=p50, kpc=kpc, fps=fps))
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return out


def med(xs):
    xs = [x for x in xs if x is not None]
    return (statistics.median(xs), min(xs), max(xs)) if xs else None


def fmt_n(v):
    if v >= 100000:
        return f"{v/1000:.0f}k"
    if v >= 10000:
        return f"{v/1000:.1f}k"
    return f"{v:.0f}"


def cell(rs, seq):
    m = med([r["mib" if seq else "iops"] for r in rs])
    if not m:
        return "—"
    p = med([r["p50"] for r in rs])
    s = f"{fmt_n(m[0])} [{fmt_n(m[1])}–{fmt_n(m[2])}]"
    if p:
        s += f" p50 {p[0]:.0f}µs"
    f = med([r.get("fps") for r in rs])
    if f:
        s += f", fio sync {f[0]:.0f}/s"
    return s


def cmd_report(argv):
    d = argv[0]
    rounds = len(glob.glob(os.path.join(d, "r*")))
    print(f"\nSide by side — {rounds} round(s); cells: median [min–max] IOPS (MiB/s for 128K), p50 latency (fio lat / bench lat)\n")
    data = {(t, j): load(d, t, j) for t, _ in TARGETS for j, _, _ in JOBS}
    jobs = [j for j in JOBS if any(data[(t, j[0])] for t, _ in TARGETS)]
    header = ["target"] + [title for _, title, _ in jobs] + ["kIOPS/core rr32", "kIOPS/core rw32"]
    rows = []
    for t, label in TARGETS:
        if not any(data[(t, j)] for j, _, _ in jobs):
            continue
        row = [label] + [cell(data[(t, j)], seq) for j, _, seq in jobs]
        for j in ("rr32", "rw32"):
            m = med([r["kpc"] for r in data[(t, j)]])
            row.append(f"{m[0]:.0f}" if m else "—")
        rows.append(row)
    w = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(x.ljust(w[i]) for i, x in enumerate(r)) + " |"
    print(line(header))
    print("|" + "|".join("-" * (x + 2) for x in w) + "|")
    for r in rows:
        print(line(r))

    def m(t, j, k):
        v = med([r[k] for r in data.get((t, j), [])])
        return v[0] if v else None

    print("\nGoals (ratios of medians, same run):")
    def goal(name, num, den, want, lower=False):
        if num is None or den is None or den == 0:
            print(f"  {name}: n/a (a row is missing)")
            return
        ratio = num / den
        ok = ratio <= want if lower else ratio >= want
        print(f"  {name}: {ratio:.2f}× (goal {'≤' if lower else '≥'} {want}×) {'MET' if ok else 'NOT MET'}")
    for src in ("bench-tcp", "gosrp-nbd-tcp"):
        goal(f"4K randread QD32 {src} ÷ nbdkit-memory TCP", m(src, "rr32", "iops"), m("nbdkit-tcp", "rr32", "iops"), 3)
    for src in ("bench-shm", "gosrp-nbd-shm"):
        goal(f"4K randread QD32 {src} ÷ fio io_uring on tmpfs", m(src, "rr32", "iops"), m("tmpfs-uring", "rr32", "iops"), 1)
    for src in ("bench-shm", "gosrp-nbd-shm"):
        goal(f"4K randread QD1 p50 {src} ÷ nbdkit-memory unix", m(src, "rr1", "p50"), m("nbdkit-unix", "rr1", "p50"), 0.2, lower=True)
    for src in ("bench-pebble-shm", "bench-pebble-tcp", "gosrp-pebble"):
        goal(f"4K randwrite QD32 +flush/s {src} ÷ qemu-nbd raw tmpfs", m(src, "fl32", "iops"), m("qemu-nbd", "fl32", "iops"), 2)
    for src in ("bench-tcp", "gosrp-nbd-tcp"):
        goal(f"128K read QD8 {src} ÷ nbdkit-memory TCP", m(src, "sr8", "mib"), m("nbdkit-tcp", "sr8", "mib"), 1.5)
    for j in ("rr32", "rw32"):
        peers = [m(p, j, "kpc") for p in NBD_PEERS if m(p, j, "kpc")]
        ours = [m(s, j, "kpc") for s in ("bench-tcp", "bench-shm", "gosrp-nbd-tcp", "gosrp-nbd-shm") if m(s, j, "kpc")]
        goal(f"IOPS per busy core {j}, best gosrp ÷ best NBD peer", max(ours) if ours else None, max(peers) if peers else None, 4)
    print("\nCPU = client (fio or bench, getrusage) + server processes (srpd, srpc nbd, nbdkit, qemu-nbd from /proc),")
    print("over the client's whole run including the ramp; io_uring's io-wq kernel workers are not counted.")


def pipe_rtt(cpus, n=4000):
    """Mean round trip in µs of one byte over two pipes between a parent
    and a child pinned to cpus[0] and cpus[1], as perf bench sched pipe."""
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.sched_setaffinity(0, {cpus[1]})
            for _ in range(n):
                os.read(a_r, 1)
                os.write(b_w, b"x")
        finally:
            os._exit(0)
    os.sched_setaffinity(0, {cpus[0]})
    t = time.perf_counter()
    for _ in range(n):
        os.write(a_w, b"x")
        os.read(b_r, 1)
    dt = time.perf_counter() - t
    os.waitpid(pid, 0)
    for fd in (a_r, a_w, b_r, b_w):
        os.close(fd)
    return dt / n * 1e6


def cmd_wake(argv):
    # Every process exchanging messages with another pays this when its
    # peer sleeps: gosrp's tcp and shm readers, nbdkit and fio alike. It
    # varies with where the host places the vCPUs, which sets how two
    # processes fare against one (io_uring on tmpfs).
    keep = os.sched_getaffinity(0)
    cpus = sorted(keep)
    try:
        one = pipe_rtt([cpus[0], cpus[0]])
        two = pipe_rtt(cpus[:2]) if len(cpus) > 1 else None
    finally:
        os.sched_setaffinity(0, keep)
    print(f"pipe round trip {two:.1f} µs between CPUs {cpus[0]} and {cpus[1]}, {one:.1f} µs on one"
          if two is not None else f"pipe round trip {one:.1f} µs (one CPU)")


if __name__ == "__main__":
    if len(sys.argv) < 2 or (len(sys.argv) < 3 and sys.argv[1] != "wake"):
        sys.exit(__doc__)
    sys.exit({"run": cmd_run, "report": cmd_report, "wake": cmd_wake}[sys.argv[1]](sys.argv[2:]) or 0)
