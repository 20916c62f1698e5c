"""Deleting cache units (conda packages, hub repos) one at a time through the quarantine, against rm -rf,
same run, same disk, trees built alike.

Each unit is renamed aside, measured again and checked against a fresh reading of /proc before it is
removed (actions/cleanup/engine/aside.py), so a unit costs one /proc reading: the figure grows with
the number of units and of processes on the machine, printed beside it.

  cleanup : a conda-cache policy (older_than 1d, grace 0s, max_delete false) run in this process on tree A
  rm -rf  : rm -rf of every unit of tree B, one process

    python3 bench/cleanup_units_bench.py --units 300 --files 20 [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))

from trainguard import config  # noqa: E402
from trainguard.actions.cleanup.runner import CleanupRunner  # noqa: E402


def build(root: Path, units: int, files: int) -> None:
    old = time.time() - 30 * 86400
    for u in range(units):
        unit = root / f"pkg{u}-1.0-py311_0"
        (unit / "lib").mkdir(parents=True)
        for f in range(files):
            path = unit / "lib" / f"m{f}.py"
            path.write_bytes(b"x" * 512)
            os.utime(path, (old, old))
        os.utime(unit / "lib", (old, old))
        os.utime(unit, (old, old))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=300)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--dir", default=None, help="where to build the trees (default: the temp directory)")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="tg-units-", dir=args.dir))
    try:
        a, b = base / "a", base / "b"
        build(a, args.units, args.files)
        build(b, args.units, args.files)
        os.sync()
        pol = config.parse({"cleanup": [{"name": "conda", "type": "conda-cache", "roots": [str(a)],
                                         "older_than": "1d", "grace": "0s", "max_delete": False}]}, "bench").cleanup[0]
        started = time.perf_counter()
        report = CleanupRunner([pol], homes=frozenset()).run(pol)
        cleanup = time.perf_counter() - started
        started = time.perf_counter()
        subprocess.run(["rm", "-rf", *map(str, b.iterdir())], check=True)
        reference = time.perf_counter() - started
        procs = sum(1 for p in os.listdir("/proc") if p.isdigit())
        assert report.files == args.units * args.files and not any(a.iterdir()), report
        print(f"{args.units} units of {args.files} files, {procs} processes in /proc")
        print(f"cleanup {cleanup:.3f} s, rm -rf {reference:.3f} s: {cleanup / reference:.1f}x rm -rf, "
              f"{cleanup / args.units * 1000:.1f} ms a unit")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
