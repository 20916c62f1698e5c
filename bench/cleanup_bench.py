"""Cleanup throughput and memory against find, same run, same disk, identical trees.

For each size (default 200k and 1M files) builds three identical trees (half of the files
30 days old, half fresh, 500 per directory) and times, in this order:
  find -print : find B -type f -mtime +7 -print (to a pipe, counted)
  dry run     : an age policy (older_than 7d, by mtime) as a dry run on B (one scan, no deletion pass)
  find -delete: find A -type f -mtime +7 -delete
  cleanup     : the same policy for real on B (max_delete = false: one pass, judge and delete
                in the same walk), with the open-file index, grace and identity checks and the
                audit log in the state database
  guarded     : the same with a max_delete guard on C (two passes: plan, then delete)
and the RSS growth of the cleanup process (peak RSS during the run minus RSS before it).
Targets (issue 15): cleanup <= 1.3x find -delete, dry run <= 1.5x find -print, RSS growth < 20 MiB.

    python bench/cleanup_bench.py --files 200000 1000000   # the installed trainguard
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
    for d in range(max(1, -(-files // PER_DIR))):
        path = os.path.join(root, f"d{d:05d}")
        os.makedirs(path)
        for i in range(min(PER_DIR, files - d * PER_DIR)):
            name = os.path.join(path, f"f{i:04d}.tmp")
            with open(name, "wb"):
                pass
            if i % 2 == 0:
                os.utime(name, (old, old))


CHILD = r"""
import json, os, resource, sys, time
from trainguard import config
from trainguard.actions.cleanup import age_fast
from trainguard.actions.cleanup.audit import AuditLog
from trainguard.actions.cleanup.runner import CleanupRunner
from trainguard.store.state import StateDb
root, dry, state_dir = sys.argv[1], sys.argv[2] == "dry", sys.argv[3]
pol = config.parse({"cleanup": [{"name": "bench", "type": "age", "roots": [root], "older_than": "7d",
    "age_by": ["mtime"], "grace": "0s", "max_delete": sys.argv[4] if sys.argv[4] != "none" else False,
    "remove_empty_dirs": False}]}, "bench").cleanup[0]
# The audit log in the daemon's own state database (WAL), as `trainguard cleanup` writes it.
audit = None if dry else AuditLog(StateDb(state_dir).connect())
runner = CleanupRunner([], audit=audit, homes=frozenset(), max_items=0)
def rss_kib():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:"))
before = rss_kib()
t = time.perf_counter()
rep = runner.run(pol, dry_run=dry)
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": dt, "files": rep.files, "growth_kib": peak - before, "compiled": age_fast.ENABLED}))
"""


def child(root: str, dry: bool, db: str, max_delete: str = "none") -> dict:
    # The trainguard this interpreter imports: the installed one, or the source tree's with PYTHONPATH=daemon
    # (after `python setup.py build_ext --inplace`, for the compiled loop).
    out = subprocess.run([sys.executable, "-c", CHILD, root, "dry" if dry else "real", db, max_delete],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def timed(argv: list[str]) -> tuple[float, int]:
    t = time.perf_counter()
    out = subprocess.run(argv, check=True, stdout=subprocess.PIPE).stdout
    return time.perf_counter() - t, out.count(b"\n")


def one_size(base: str, files: int) -> dict:
    a, b, c, state = (os.path.join(base, f"{x}{files}") for x in ("a", "b", "c", "state"))
    t = time.perf_counter()
    for tree in (a, b, c):
        build(tree, files)
    subprocess.run(["sync"], check=False)
    print(f"built 3 x {files} files in {time.perf_counter() - t:.1f}s under {base}")
    print_s, listed = timed(["find", b, "-type", "f", "-mtime", "+7", "-print"])
    dry = child(b, True, "")
    delete_s, _ = timed(["find", a, "-type", "f", "-mtime", "+7", "-delete"])
    os.mkdir(state)
    real = child(b, False, state)
    guarded = child(c, False, state, f"{10 * files} files")
    left_a = sum(len(f) for _, _, f in os.walk(a))
    left_b = sum(len(f) for _, _, f in os.walk(b))
    assert left_a == left_b and dry["files"] == listed == real["files"], (left_a, left_b, dry, listed, real)
    shutil.rmtree(a, ignore_errors=True)
    shutil.rmtree(b, ignore_errors=True)
    shutil.rmtree(c, ignore_errors=True)
    return {"compiled": real["compiled"], "guarded": guarded["seconds"], "files": files, "find_print": print_s, "dry": dry["seconds"], "find_delete": delete_s,
            "cleanup": real["seconds"], "growth_mib": max(dry["growth_kib"], real["growth_kib"]) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, nargs="+", default=[200000, 1000000])
    ap.add_argument("--dir", default=None, help="where to build the trees (default: a temp dir on /var/tmp)")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="tg-cleanup-bench-", dir=args.dir or "/var/tmp")
    try:
        rows = [one_size(base, n) for n in args.files]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{'files':>9} | {'find -delete':>12} | {'cleanup':>8} | {'ratio':>6} | {'find -print':>11} | "
          f"{'dry run':>8} | {'ratio':>6} | RSS growth | with max_delete (two passes)")
    for r in rows:
        if not r["compiled"]:
            print("(the age loop ran in Python: trainguard.actions.cleanup._agescan is not built)")
        print(f"{r['files']:>9} | {r['find_delete']:>11.2f}s | {r['cleanup']:>7.2f}s | "
              f"{r['cleanup'] / r['find_delete']:>5.2f}x | {r['find_print']:>10.2f}s | {r['dry']:>7.2f}s | "
              f"{r['dry'] / r['find_print']:>5.2f}x | {r['growth_mib']:>6.1f} MiB | "
              f"{r['guarded']:.2f}s, {r['guarded'] / r['find_delete']:.2f}x")
        met = (r["cleanup"] <= 1.3 * r["find_delete"], r["dry"] <= 1.5 * r["find_print"], r["growth_mib"] < 20)
        print(f"{'':>9}   targets (delete <= 1.3x, dry <= 1.5x, RSS < 20 MiB): "
              + ", ".join("met" if m else "NOT met" for m in met))


if __name__ == "__main__":
    main()
