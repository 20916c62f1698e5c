"""Is the daemon's RSS flat over many cycles? A day of cycles in minutes, on a stepped clock.

    PYTHONPATH=daemon python bench/rss_cycles.py [--cycles 8640] [--every 720]

Builds the daemon in this process with its embedded defaults but for the mounts (only / and the
temporary state directory's: a FUSE mount another process is testing is never probed) and metrics
(off), and
runs cycles back to back while the clock steps 10 s per cycle, so the history fills its windows as
a day at the default interval would. Prints RSS every `--every` cycles, against the RSS after the
first cycle (the reference, same process): flat means the last rows stay within about 1 MiB of the
point where the history windows are full (6 h at the defaults).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "daemon"))

from _daemon import Quiet, SteppedClock  # noqa: E402
from trainguard import config as configmod  # noqa: E402
from trainguard.service.daemon import Daemon  # noqa: E402

MiB = 2**20


def rss() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:")) / MiB


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=8640, help="default: 24 h at 10 s")
    ap.add_argument("--every", type=int, default=720)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp:
        cfg = configmod.parse({"filesystems": {"exclude": ["*"], "paths": ["/", tmp]}, "metrics": {"listen": ""},
                               "gpu": {"enabled": False}}, "bench")
        clock = SteppedClock()
        d = Daemon(configmod.Loaded(cfg, "bench"), clock=clock, state_dir=tmp, notifiers=[Quiet()])
        d.cycle()
        first, t0 = rss(), time.monotonic()
        print(f"{len(d.latest.snapshot.filesystems)} mounts; RSS after the first cycle {first:.1f} MiB (reference)")
        for i in range(1, args.cycles + 1):
            clock.offset += 10.0
            d.cycle()
            if i % args.every == 0:
                now = rss()
                print(f"  {i:6d} cycles ({i * 10 / 3600:5.1f} h): RSS {now:6.1f} MiB, {now / first:5.3f}x the reference "
                      f"({time.monotonic() - t0:.0f} s)", flush=True)
        d.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
