"""Series per host: a real `trainguard run` with 8 GPUs (the NVML fake) and 30 tmpfs mounts.

    sudo PYTHONPATH=daemon python bench/series_count.py [--gpus 8] [--mounts 30] [--scrapes 200]

Counts the samples of one /metrics scrape, by family, then times scrapes of the daemon
against Debian's node_exporter (default collectors) on this host, alternately in this one
run, and counts node_exporter's series too: the figures for docs/fleet.md. Needs root
(the tmpfs mounts).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "daemon"), str(REPO), str(REPO / "bench")]

from _reference import start_node_exporter, stop  # noqa: E402
from bench_scrape import summary, timed_scrapes  # noqa: E402

from tests.gpu_support import FAKE_DIR, GiB, gpu_spec  # noqa: E402
from tests.support.daemon_proc import DaemonProcess  # noqa: E402
from tests.support.mounts import tmpfs  # noqa: E402


def gpu_script(gpus: int, holder_pid: int) -> dict:
    """Every field an H100 reports: ECC, row remapping, throttling; two XID codes seen on one GPU."""
    specs = []
    for i in range(gpus):
        entry = {"at": 0, "util": 90, "mem_used": 70 * GiB, "processes": [{"pid": holder_pid, "used": 70 * GiB}],
                 "temperature": 65, "power_w": 550, "power_limit_w": 700, "throttle": 0x4,
                 "remapped_rows": [1, 0, 0, 0]}
        if i == 3:
            entry["xid"] = [13, 43]
        specs.append(gpu_spec([entry], name="NVIDIA H100 80GB HBM3",
                              unsupported=["nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus"]))
    return {"gpus": specs}


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def series(text: str) -> collections.Counter[str]:
    """Samples per metric name (a series is one sample line of one scrape)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            counts[line.split("{", 1)[0].split(" ", 1)[0]] += 1
    return counts


def run(args: argparse.Namespace, work: Path, mounts: list[Path]) -> int:
    holder = os.getpid()  # a live process for NVML to report: this one
    (work / "nvml.json").write_text(json.dumps(gpu_script(args.gpus, holder)))
    config = f"""
[general]
state_dir = "{work / 'state'}"
interval = "1s"
[filesystems]
paths = {json.dumps([str(m) for m in mounts])}
exclude = ["*"]
[gpu]
py_spy = false
[metrics]
listen = "127.0.0.1:0"
"""
    env = {"PYTHONPATH": os.pathsep.join([str(FAKE_DIR), str(REPO / "daemon"), str(REPO)]),
           "TRAINGUARD_FAKE_NVML": str(work / "nvml.json")}
    ref = start_node_exporter()
    with DaemonProcess(work, config, env=env) as daemon:
        url = daemon.metrics_url(timeout=60)
        deadline = time.monotonic() + 60
        while "trainguard_gpu_xid_errors_total" not in (text := scrape_text(url)) and time.monotonic() < deadline:
            time.sleep(0.5)  # wait for the cycles that deliver the XIDs
        counts = series(text)
        total = sum(counts.values())
        gpu = sum(n for name, n in counts.items() if name.startswith(("trainguard_gpu_", "trainguard_nvml")))
        fs = sum(n for name, n in counts.items() if name.startswith(("trainguard_filesystem_", "trainguard_disk_")))
        print(f"trainguard, {args.gpus} GPUs (fake NVML) + {len(mounts)} tmpfs mounts: {total} series in one scrape "
              f"({gpu} GPU, {fs} filesystem/disk, {total - gpu - fs} other), {len(text)} bytes")
        for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"  {n:5d}  {name}")
        try:
            timed_scrapes(url, 20)
            ours, theirs = [], []
            for _ in range(args.scrapes // 10):
                ours += timed_scrapes(url, 10)[0]
                if ref:
                    theirs += timed_scrapes(ref[1], 10)[0]
        finally:
            if ref:
                ref_count = sum(series(scrape_text(ref[1])).values())
                stop(ref[0])
    med, p95 = summary(ours)
    print(f"trainguard scrape: median {med * 1e3:.2f} ms, p95 {p95 * 1e3:.2f} ms over {len(ours)} scrapes")
    if ref:
        rmed, rp95 = summary(theirs)
        print(f"node_exporter (Debian, default collectors) on this host: {ref_count} series, "
              f"median {rmed * 1e3:.2f} ms, p95 {rp95 * 1e3:.2f} ms")
        print(f"ratio trainguard/node_exporter: series {total / ref_count:.2f}x, "
              f"scrape median {med / rmed:.2f}x, p95 {p95 / rp95:.2f}x")
    else:
        print("node_exporter not installed (Debian package prometheus-node-exporter): no reference")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--mounts", type=int, default=30)
    ap.add_argument("--scrapes", type=int, default=200)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root: it mounts tmpfs filesystems", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tg-series-") as tmp, contextlib.ExitStack() as stack:
        mounts = [stack.enter_context(tmpfs(1 << 20)) for _ in range(args.mounts)]
        return run(args, Path(tmp), mounts)


if __name__ == "__main__":
    sys.exit(main())
