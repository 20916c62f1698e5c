"""`trainguard cleanup` as a whole process (start-up, imports, config, scan, audit) against find.

For each size builds one tree (half of the files 30 days old, 500 per directory) and copies
it (cp -a keeps the times), so every run sees the same tree, then times, in this order, each
round (--rounds, interleaved; the best of each command counts, as the host may be shared):
  find -print : find T -type f -mtime +7 -print (to a pipe)
  dry run     : trainguard cleanup --dry-run, an age policy (older_than 7d, by mtime, grace 0)
  find -delete: find T -type f -mtime +7 -delete
  cleanup     : trainguard cleanup, the same policy with a max_delete guard (the default
                kind of config, raised above the candidate count): count, then delete
  one pass    : the same with max_delete = false
RSS growth: the cleanup process's peak RSS minus that of the same command on an empty root.

    PYTHONPATH=daemon python3 bench/cleanup_cli_timing.py --files 200000 1000000
"""

from __future__ import annotations

import argparse
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
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))
            if i % 2 == 0:
                os.utime(name, (old, old))


def config(base: str, root: str, max_delete: str) -> str:
    path = os.path.join(base, f"config-{os.path.basename(root)}.toml")
    with open(path, "w") as fh:
        fh.write(f'[general]\nstate_dir = "{base}/state"\n\n[[cleanup]]\nname = "bench"\ntype = "age"\n'
                 f'roots = ["{root}"]\nolder_than = "7d"\nage_by = ["mtime"]\ngrace = "0s"\n'
                 f"max_delete = {max_delete}\n")
    return path


def run(argv: list[str]) -> tuple[float, int, int]:
    """(seconds, lines on stdout, peak RSS in KiB) of one process."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    out = proc.stdout.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t
    if status != 0:
        sys.exit(f"{argv} failed: {out.decode(errors='replace')}")
    return dt, out.count(b"\n"), usage.ru_maxrss


def cli(cfg: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "trainguard", "--config", cfg, "cleanup", *extra]


def one_size(base: str, files: int, rounds: int) -> dict:
    master = os.path.join(base, f"m{files}")
    t = time.perf_counter()
    build(master, files)
    trees = {}
    for n in range(rounds):
        for name in ("find", "guarded", "onepass"):
            trees[name, n] = os.path.join(base, f"{name}{n}-{files}")
            subprocess.run(["cp", "-a", master, trees[name, n]], check=True)
    empty = os.path.join(base, "empty")
    os.makedirs(empty, exist_ok=True)
    os.makedirs(os.path.join(base, "state"), exist_ok=True)
    subprocess.run(["sync"], check=False)
    print(f"built {files} files (x{1 + 3 * rounds}) in {time.perf_counter() - t:.1f}s under {base}", flush=True)
    guard = f'"{2 * files} files"'  # the default kind of guard, raised above the candidate count
    _, _, idle_rss = run(cli(config(base, empty, guard)))
    r: dict = {"files": files, "growth_mib": 0.0}
    for n in range(rounds):  # interleaved, the best of each: the host is shared
        one = {}
        one["find_print"], listed, _ = run(["find", master, "-type", "f", "-mtime", "+7", "-print"])
        one["dry"], _, _ = run(cli(config(base, master, guard), "--dry-run"))
        one["find_delete"], _, _ = run(["find", trees["find", n], "-type", "f", "-mtime", "+7", "-delete"])
        one["cleanup"], _, peak = run(cli(config(base, trees["guarded", n], guard)))
        one["onepass"], _, _ = run(cli(config(base, trees["onepass", n], "false")))
        print(f"  round {n + 1}: " + ", ".join(f"{k} {v:.2f}s" for k, v in one.items()), flush=True)
        for k, v in one.items():
            r[k] = min(r.get(k, v), v)
        r["growth_mib"] = max(r["growth_mib"], (peak - idle_rss) / 1024)
        left = {name: sum(len(f) for _, _, f in os.walk(trees[name, n])) for name in ("find", "guarded", "onepass")}
        assert len(set(left.values())) == 1 and left["find"] == files - listed, (left, listed)
    for p in [master, *trees.values()]:
        shutil.rmtree(p, ignore_errors=True)
    return r


def compile_package() -> None:
    """Byte-compile the trainguard this interpreter imports, as an installation has it (where
    PYTHONDONTWRITEBYTECODE is set, each start would otherwise compile every module again)."""
    import compileall

    import trainguard

    compileall.compile_dir(os.path.dirname(trainguard.__file__), quiet=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, nargs="+", default=[200000, 1000000])
    ap.add_argument("--rounds", type=int, default=2, help="runs of each command, interleaved; the best counts")
    ap.add_argument("--dir", default=None, help="where to build the trees (default: a temp dir on /var/tmp)")
    args = ap.parse_args()
    compile_package()
    base = tempfile.mkdtemp(prefix="tg-cleanup-cli-", dir=args.dir or "/var/tmp")
    try:
        rows = [one_size(base, n, args.rounds) for n in args.files]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{'files':>9} | {'find -delete':>12} | {'cleanup':>8} | {'ratio':>6} | {'one pass':>8} | {'ratio':>6} | "
          f"{'find -print':>11} | {'dry run':>8} | {'ratio':>6} | RSS growth")
    for r in rows:
        print(f"{r['files']:>9} | {r['find_delete']:>11.2f}s | {r['cleanup']:>7.2f}s | "
              f"{r['cleanup'] / r['find_delete']:>5.2f}x | {r['onepass']:>7.2f}s | "
              f"{r['onepass'] / r['find_delete']:>5.2f}x | {r['find_print']:>10.2f}s | {r['dry']:>7.2f}s | "
              f"{r['dry'] / r['find_print']:>5.2f}x | {r['growth_mib']:>6.1f} MiB")
        met = (r["cleanup"] <= 1.3 * r["find_delete"], r["dry"] <= 1.3 * r["find_print"], r["growth_mib"] < 20)
        print(f"{'':>9}   targets (cleanup <= 1.3x, dry <= 1.3x, RSS < 20 MiB): "
              + ", ".join("met" if m else "NOT met" for m in met))


if __name__ == "__main__":
    main()
