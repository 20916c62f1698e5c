"""Steady-state RSS and CPU of `trainguard run`, against bare Python processes started alongside.

    PYTHONPATH=daemon python bench/storage_rss.py [--duration 60] [--interval 10s]

Runs the daemon with its embedded defaults (every real mount; state in a temp dir; metrics
on a free loopback port) and, at the same time, two references: a bare `python -c` that
only sleeps, and one that imports the daemon's modules and sleeps (the import floor).
After a warm-up it reports each one's RSS, the daemon's CPU over the measured period as a
share of one core, and the ratios. Targets: <= 36 MiB RSS, < 0.5 % of one core at 10 s.
With --scrape-every the daemon's /metrics is scraped as Prometheus would; without it nobody scrapes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from _reference import cpu_seconds, free_port, rss_bytes  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MiB = 2**20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=60.0, help="seconds measured after the warm-up")
    ap.add_argument("--interval", default="10s", help="general.interval")
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--metrics-off", action="store_true", help='metrics.listen = "" (no /metrics at all)')
    ap.add_argument("--scrape-every", type=float, default=0.0, help="seconds between /metrics scrapes (0: none)")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "daemon"))
    env = {k: v for k, v in env.items() if not k.startswith("TRAINGUARD_")}
    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp:
        cfg = os.path.join(tmp, "config.toml")
        with open(cfg, "w") as fh:
            port = free_port()
            listen = "" if args.metrics_off else f"127.0.0.1:{port}"
            fh.write(f'[general]\ninterval = "{args.interval}"\n[metrics]\nlisten = "{listen}"\n')
        sleep = f"import time; time.sleep({args.warmup + args.duration + 30})"
        procs = {
            "trainguard run": subprocess.Popen(
                [sys.executable, "-m", "trainguard", "run", "--config", cfg, "--state-dir", f"{tmp}/state"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
            "bare python -c": subprocess.Popen([sys.executable, "-c", sleep], env=env),
            "python + daemon imports": subprocess.Popen(
                [sys.executable, "-c", "import trainguard.service.daemon, trainguard.cli; " + sleep], env=env),
        }
        scraped = 0.0

        def scrape() -> None:
            nonlocal scraped
            if args.scrape_every and time.monotonic() - scraped >= args.scrape_every:
                scraped = time.monotonic()
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()

        try:
            started = time.monotonic()
            while time.monotonic() - started < args.warmup:
                scrape()
                time.sleep(0.5)
            daemon = procs["trainguard run"]
            if daemon.poll() is not None:
                raise SystemExit(f"trainguard run exited with {daemon.returncode}")
            cpu0, t0 = cpu_seconds(daemon.pid), time.monotonic()
            peak = {name: 0 for name in procs}
            while time.monotonic() - t0 < args.duration:
                for name, p in procs.items():
                    peak[name] = max(peak[name], rss_bytes(p.pid))
                scrape()
                time.sleep(1.0)
            cpu_share = (cpu_seconds(daemon.pid) - cpu0) / (time.monotonic() - t0)
            final = {name: rss_bytes(p.pid) for name, p in procs.items()}
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
    bare, floor = final["bare python -c"], final["python + daemon imports"]
    print(f"steady state after {args.warmup:.0f} s warm-up, measured {args.duration:.0f} s, "
          f"interval {args.interval}, {'metrics off' if args.metrics_off else f'scraped every {args.scrape_every:g} s' if args.scrape_every else 'not scraped'}")
    for name in procs:
        print(f"  {name:24s} RSS {final[name] / MiB:6.1f} MiB (peak {peak[name] / MiB:6.1f} MiB)")
    ours = final["trainguard run"]
    print(f"  daemon / bare python     : {ours / bare:5.2f}x RSS")
    print(f"  daemon / import floor    : {ours / floor:5.2f}x RSS (+{(ours - floor) / MiB:.1f} MiB of running state)")
    print(f"  daemon CPU               : {cpu_share * 100:.3f} % of one core (target < 0.5 %); "
          f"RSS target <= 36 MiB: {'met' if ours <= 36 * MiB else 'NOT met'} ({ours / MiB:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
