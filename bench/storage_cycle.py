"""One full storage cycle with 30 mounts: CPU time and wall time per cycle.

    PYTHONPATH=daemon python bench/storage_cycle.py [--mounts 30] [--cycles 60]

As root it mounts 30 small tmpfs filesystems and watches them through filesystems.paths;
otherwise it serves a fake mount table of 30 mounts with a fake statvfs. Every mount gets
6 hours of synthetic history first, so the forecast fits a full window each cycle, as on a
host that has been running for a while.

Reference, measured in the same process: the bare system reads a cycle cannot avoid (read
the mount table, statvfs each mount, read /proc/diskstats). Figures are CPU per cycle, its
share of one core at the default 10 s interval, and the ratio to the reference. Also: the
cost of one `stat -f` child probe, which network and FUSE mounts use instead of statvfs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "daemon"))

from _daemon import Quiet  # noqa: E402
from trainguard import config as configmod  # noqa: E402
from trainguard.clock import SystemClock  # noqa: E402
from trainguard.records import Mount, MountKind  # noqa: E402
from trainguard.service.daemon import Daemon  # noqa: E402
from trainguard.sources import mounts as mountinfo  # noqa: E402
from trainguard.sources.fs import FsSampler, child_probe  # noqa: E402
from trainguard.sources.samplers import Samplers  # noqa: E402


def cpu() -> float:
    return time.process_time()  # all threads of this process


def reference_cycle(points: list[str]) -> None:
    """What any cycle must do: read the mount table, statvfs every mount, read diskstats."""
    mountinfo.read_mounts("/proc")
    for p in points:
        os.statvfs(p)
    with open("/proc/diskstats") as fh:
        fh.read()


def measure(fn, n: int) -> tuple[float, float]:
    """(median wall seconds, mean CPU seconds) per call over n calls."""
    walls = []
    c0 = cpu()
    for _ in range(n):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    return statistics.median(walls), (cpu() - c0) / n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mounts", type=int, default=30)
    ap.add_argument("--cycles", type=int, default=60)
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tg-bench-"))
        real = os.geteuid() == 0 and shutil.which("mount") is not None
        if real:
            from tests.support.mounts import tmpfs

            points = [str(stack.enter_context(tmpfs(4 * 2**20))) for _ in range(args.mounts)]
            fake = None
            how = f"{args.mounts} real tmpfs mounts"
        else:
            points = [os.path.join(tmp, f"m{i}") for i in range(args.mounts)]
            for p in points:
                os.mkdir(p)
            fake = [Mount(p, "xfs", f"/dev/sd{i}", 8, i + 1, MountKind.LOCAL) for i, p in enumerate(points)]
            how = f"{args.mounts} fake mounts (not root)"
        cfg = configmod.parse({"filesystems": {"exclude": ["*"], "paths": points}, "gpu": {"enabled": False},
                               "metrics": {"listen": ""}}, "bench")
        clock = SystemClock()
        d = Daemon(configmod.Loaded(cfg, "bench"), clock=clock, state_dir=os.path.join(tmp, "state"),
                   notifiers=[Quiet()])
        if fake is not None:
            d.samplers = Samplers(
                fs=FsSampler(clock=clock, paths=points, exclude=["*"], read_mounts=lambda _root: fake,
                             statvfs=os.statvfs),
                disks=d.samplers.disks)
        # Six hours of history at 10 s for every mount: each cycle's forecast fits a full window.
        now = clock.time()
        size = 4 * 2**20
        for k in range(6 * 360, 0, -1):
            ts = now - 10 * k
            d.history.record(ts, {f"fs.avail_bytes:{p}": size - 100 * (6 * 360 - k) for p in points})
        d.cycle()  # warm: threads, imports, first diskstats reading

        ref_wall, ref_cpu = measure(lambda: reference_cycle(points), args.cycles)
        wall, cpu_per_cycle = measure(d.cycle, args.cycles)
        forecast_findings = [f for f in d.latest.findings if f.kind == "fs.forecast"]

        stat = shutil.which("stat")
        child = None
        if stat:
            probe = child_probe(stat)
            m = Mount(points[0], "fuse.juicefs", "JuiceFS:x", 0, 99, MountKind.FUSE)
            child = measure(lambda: probe(m, []), 30)

    print(f"storage cycle, {how}, {args.cycles} cycles, 6 h of history per mount")
    print(f"  trainguard cycle : {cpu_per_cycle * 1e3:7.2f} ms CPU, {wall * 1e3:7.2f} ms wall (median)")
    print(f"  reference reads  : {ref_cpu * 1e3:7.2f} ms CPU, {ref_wall * 1e3:7.2f} ms wall (median)")
    print(f"  ratio            : {cpu_per_cycle / ref_cpu:7.1f}x CPU, {wall / ref_wall:7.1f}x wall")
    print(f"  share of one core at a 10 s interval: {cpu_per_cycle / 10 * 100:.3f} % (target < 0.5 %)")
    print(f"  forecasts computed per cycle: {len(points)} (alerts raised: {len(forecast_findings)})")
    if child:
        print(f"  one `stat -f` child probe (network/FUSE mounts): {child[1] * 1e3:.2f} ms CPU, "
              f"{child[0] * 1e3:.2f} ms wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
