"""Daemon RSS and CPU over a period, against node_exporter running alongside.

    PYTHONPATH=daemon python bench/bench_overhead.py [--duration 600] [--interval 10s]

Starts `trainguard run` (defaults: every mount, metrics on) and Debian's node_exporter
at the same time, scrapes both every 15 s like a Prometheus would, and reports each
one's peak/final RSS and CPU time as a share of one core, plus the ratios.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from _reference import cpu_seconds, free_port, rss_bytes, start_node_exporter, stop  # noqa: E402

SCRAPE_EVERY = 15.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--interval", default="10s", help="trainguard general.interval")
    args = ap.parse_args()
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp:
        port = free_port()
        cfg = os.path.join(tmp, "config.toml")
        with open(cfg, "w") as fh:
            fh.write(f'[general]\nstate_dir = "{tmp}/state"\ninterval = "{args.interval}"\n'
                     f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
        env = dict(os.environ, PYTHONPATH=os.path.join(repo, "daemon"))
        ours = subprocess.Popen([sys.executable, "-m", "trainguard", "run", "-c", cfg], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ref = start_node_exporter()
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    urllib.request.urlopen(url, timeout=2).read()
                    break
                except OSError:
                    if time.monotonic() > deadline or ours.poll() is not None:
                        raise SystemExit("trainguard did not come up")
                    time.sleep(0.2)
            procs = {"trainguard": (ours.pid, url)}
            if ref:
                procs["node_exporter"] = (ref[0].pid, ref[1])
            start_cpu = {k: cpu_seconds(pid) for k, (pid, _) in procs.items()}
            peak = {k: 0 for k in procs}
            t0 = time.monotonic()
            while time.monotonic() - t0 < args.duration:
                for name, (pid, u) in procs.items():
                    urllib.request.urlopen(u, timeout=10).read()
                    peak[name] = max(peak[name], rss_bytes(pid))
                time.sleep(min(SCRAPE_EVERY, max(0.0, args.duration - (time.monotonic() - t0))))
            elapsed = time.monotonic() - t0
            result = {}
            for name, (pid, _) in procs.items():
                cpu = (cpu_seconds(pid) - start_cpu[name]) / elapsed
                rss = rss_bytes(pid)
                result[name] = (rss, peak[name], cpu)
                print(f"{name}: RSS {rss / 2**20:.1f} MiB (peak {peak[name] / 2**20:.1f} MiB), "
                      f"CPU {cpu * 100:.3f} % of one core over {elapsed:.0f} s")
            if "node_exporter" in result:
                a, b = result["trainguard"], result["node_exporter"]
                print(f"ratio trainguard/node_exporter: RSS {a[0] / b[0]:.2f}x, CPU {a[2] / b[2]:.2f}x")
            else:
                print("node_exporter not installed (Debian package prometheus-node-exporter): no reference ratio")
        finally:
            ours.terminate()
            ours.wait(20)
            if ref:
                stop(ref[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
