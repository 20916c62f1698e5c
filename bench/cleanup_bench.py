"""Cleanup throughput and memory against `find ROOT -type f -mtime +7 -delete`, same run, same disk.

Builds two identical trees of N files (half of them 30 days old, half fresh) in
directories of 500 files, then times:
  find  : find A -type f -mtime +7 -delete
  tg    : an age policy (older_than 7d, by mtime) on B: plan pass + delete pass,
          with the open-file index, grace and identity checks and the audit log in
          the state database
  scan  : the same policy as a dry run on a fresh copy (scan + select only)
and the peak RSS of a process that only scans (dry run), on a tenth of the tree and
on all of it: it should not grow with the tree.

    PYTHONPATH=daemon python bench/cleanup_bench.py --files 50000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

DAY = 86400.0
PER_DIR = 500


def build(root: str, files: int) -> None:
    old = time.time() - 30 * DAY
    dirs = max(1, files // PER_DIR)
    n = 0
    for d in range(dirs):
        # part0 holds a tenth of the directories: the small tree for the memory comparison
        part = "part0" if d < max(1, dirs // 10) else "part1"
        path = os.path.join(root, part, f"d{d:05d}")
        os.makedirs(path)
        for i in range(PER_DIR):
            if n >= files:
                return
            name = os.path.join(path, f"f{i:04d}.tmp")
            with open(name, "wb"):
                pass
            if i % 2 == 0:
                os.utime(name, (old, old))
            n += 1


CHILD = r"""
import json, os, resource, sys, time
from trainguard import config
from trainguard.actions.audit import AuditLog
from trainguard.actions.cleanup import CleanupRunner
from trainguard.store.state import StateDb
root, dry, state_dir = sys.argv[1], sys.argv[2] == "dry", sys.argv[3]
pol = config.parse({"cleanup": [{"name": "bench", "type": "age", "roots": [root], "older_than": "7d",
    "age_by": ["mtime"], "grace": "0s", "max_delete": 10**9, "remove_empty_dirs": False}]}, "bench").cleanup[0]
# The audit log in the daemon's own state database (WAL), as `trainguard cleanup` writes it.
audit = None if dry else AuditLog(StateDb(state_dir).connect())
t = time.perf_counter()
rep = CleanupRunner([], audit=audit, homes=frozenset(), max_items=0).run(pol, dry_run=dry)
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "files": rep.files, "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def child(root: str, dry: bool, db: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "daemon")}
    out = subprocess.run([sys.executable, "-c", CHILD, root, "dry" if dry else "real", db],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=50000)
    ap.add_argument("--dir", default=None, help="where to build the trees (default: a temp dir on /var/tmp)")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="tg-cleanup-bench-", dir=args.dir or "/var/tmp")
    try:
        a, b = os.path.join(base, "a"), os.path.join(base, "b")
        t = time.perf_counter()
        build(a, args.files)
        build(b, args.files)
        print(f"built 2 x {args.files} files in {time.perf_counter() - t:.1f}s under {base}")
        subprocess.run(["sync"], check=False)

        small = child(os.path.join(b, "part0"), True, "")
        full = child(b, True, "")
        t = time.perf_counter()
        subprocess.run(["find", a, "-type", "f", "-mtime", "+7", "-delete"], check=True)
        find_s = time.perf_counter() - t
        os.mkdir(os.path.join(base, "state"))
        real = child(b, False, os.path.join(base, "state"))
        left_a = sum(len(f) for _, _, f in os.walk(a))
        left_b = sum(len(f) for _, _, f in os.walk(b))
        assert left_a == left_b, (left_a, left_b)
        n = real["files"]
        print(f"find -mtime +7 -delete : {find_s:7.2f}s  ({n / find_s:9.0f} files/s)  reference")
        print(f"trainguard cleanup     : {real['seconds']:7.2f}s  ({n / real['seconds']:9.0f} files/s)  "
              f"{real['seconds'] / find_s:.2f}x find  ({n} deleted, audited)")
        print(f"trainguard scan+select : {full['seconds']:7.2f}s  (dry run)                   "
              f"{full['seconds'] / find_s:.2f}x find")
        print(f"peak RSS, scan only    : {small['rss_kib'] / 1024:.1f} MiB on {args.files // 10} files, "
              f"{full['rss_kib'] / 1024:.1f} MiB on {args.files} files  "
              f"({full['rss_kib'] / small['rss_kib']:.2f}x for 10x the files)")
        print(f"target: cleanup within 1.5x of find -> {'met' if real['seconds'] <= 1.5 * find_s else 'not met'}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
