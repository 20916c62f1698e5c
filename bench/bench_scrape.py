"""Scrape latency of /metrics with 50 mounts and 8 GPUs, against node_exporter on this host.

    PYTHONPATH=daemon python bench/bench_scrape.py [--scrapes 300]

Both endpoints are scraped over real HTTP on loopback, alternately, in this one run;
the figure that matters is the ratio (the machine is shared and noisy). Target: the
trainguard scrape well under 20 ms.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import time
from urllib.parse import urlparse

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "daemon"))
sys.path.insert(0, os.path.dirname(__file__))

from _reference import start_node_exporter, stop  # noqa: E402
from trainguard.records import (  # noqa: E402
    DiskIo,
    Finding,
    FsSample,
    FsUsage,
    GpuProcess,
    GpuSample,
    Mount,
    MountKind,
    NvmlState,
    NvmlStatus,
    Severity,
    Snapshot,
)
from trainguard.surfaces.readings import Readings  # noqa: E402
from trainguard.surfaces.server import MetricsServer  # noqa: E402


def readings(mounts: int = 50, gpus: int = 8) -> Readings:
    fs, disks, etas = [], [], {}
    for i in range(mounts):
        m = Mount(f"/mnt/data{i:02d}", "nfs4" if i % 5 == 0 else "ext4", f"/dev/sd{i}", 8, i, MountKind.LOCAL)
        u = FsUsage(4 * 2**40, 2**40 + i, 3 * 2**40 - i, 10**8, 10**6, 9 * 10**7)
        fs.append(FsSample(m, time.time(), u, responsive=i != 7, unresponsive_since=None))
        disks.append(DiskIo(f"sd{i}", 8, i, 0.3, 1e6, 2e6, 1.2))
        etas[m.mount_point] = 3600.0 * (i + 1)
    gs = tuple(GpuSample(i, f"GPU-{i:08x}", "H100", time.time(), util_ratio=0.5, memory_used_bytes=60 * 2**30,
                         memory_total_bytes=80 * 2**30, processes=(GpuProcess(1000 + i, 1000 + i, 2**30),),
                         temperature_c=65.0, power_w=550.0, power_limit_w=700.0, throttle_reasons=0x4,
                         ecc_uncorrected=0, ecc_uncorrected_aggregate=0, remapped_rows_correctable=1,
                         remapped_rows_uncorrectable=0, row_remap_pending=False, row_remap_failure=False,
                         xid_counts={13: 1} if i == 3 else {})
               for i in range(gpus))
    stall = Finding("gpu.stall:3", Severity.CRITICAL, "x", details={"stalled_for_s": 600.0}, labels={"gpu": "3"})
    snap = Snapshot(time.time(), tuple(fs), tuple(disks), gpus=gs, gpu_status=NvmlStatus(NvmlState.OK))
    return Readings(snap, time.time(), 0.01, fill_eta=etas,
                    firing={"critical": 2}, findings=(stall,), cleanup_freed={"ckpt": 2**30}, notify_failures={"x": 0})


def timed_scrapes(url: str, n: int) -> tuple[list[float], int]:
    u = urlparse(url)
    times, size = [], 0
    for _ in range(n):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)  # a new connection, like Prometheus
        t0 = time.perf_counter()
        conn.request("GET", u.path)
        body = conn.getresponse().read()
        times.append(time.perf_counter() - t0)
        conn.close()
        size = len(body)
    return times, size


def summary(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.95) - 1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=300)
    args = ap.parse_args()
    r = readings()
    server = MetricsServer(lambda: r, ("127.0.0.1", 0))
    server.start()
    url = f"http://127.0.0.1:{server.port}/metrics"
    ref = start_node_exporter()
    try:
        timed_scrapes(url, 20)  # warm-up
        if ref:
            timed_scrapes(ref[1], 20)
        ours, ref_times = [], []
        size = ref_size = 0
        for _ in range(args.scrapes // 10):  # interleaved: noise hits both alike
            t, size = timed_scrapes(url, 10)
            ours += t
            if ref:
                t, ref_size = timed_scrapes(ref[1], 10)
                ref_times += t
    finally:
        server.stop()
        if ref:
            stop(ref[0])
    med, p95 = summary(ours)
    print(f"trainguard /metrics, 50 mounts + 8 GPUs: {len(ours)} scrapes, {size} bytes, "
          f"median {med * 1e3:.2f} ms, p95 {p95 * 1e3:.2f} ms (target < 20 ms)")
    if ref_times:
        rmed, rp95 = summary(ref_times)
        print(f"node_exporter (Debian, default collectors): {ref_size} bytes, median {rmed * 1e3:.2f} ms, "
              f"p95 {rp95 * 1e3:.2f} ms")
        print(f"ratio trainguard/node_exporter: median {med / rmed:.2f}x, p95 {p95 / rp95:.2f}x")
    else:
        print("node_exporter not installed (Debian package prometheus-node-exporter): no reference ratio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
