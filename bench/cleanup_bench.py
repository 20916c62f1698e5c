"""`trainguard cleanup` as a whole process against find, same run, same disk, trees built alike.

Each measured command is a whole process, timed from its start to its exit like find: interpreter
start-up, imports, configuration and the state database are in the figure. Every tree is made the
same way right before its command: a copy (cp -a) of one template per size (half of the files 30
days old, half fresh, 500 per directory), synced, and walked once with a stat of every entry, so
each command meets identical files and the page cache in the same state. For each size (default
200k and 1M files):

  find -delete : find A -type f -mtime +7 -delete
  cleanup      : trainguard cleanup on B, an age policy with the default configuration: max_delete
                 at its default form, a file-count bound, raised above the candidate count
  one pass     : the same with max_delete = false (judge and delete in one walk) on C
  find -print  : find D -type f -mtime +7 -print (to a pipe, counted)
  dry run      : trainguard cleanup --dry-run on D

The policy sets only what a tree built seconds ago needs besides its root and older_than: every
file's ctime is its build time, so age_by = ["mtime"] (find -mtime's rule; the default also takes
ctime and atime) and grace = "0s" (the default, 10 minutes, would keep every file).

RSS growth is the command's peak RSS (its rusage at exit) minus the peak RSS of the same command
on an empty root: what the tree costs, not the interpreter and its imports. That run's time is
shown as "start-up": what every trainguard figure carries and find's does not.
Targets: cleanup <= 1.3x find -delete, dry run <= 1.3x find -print, RSS growth < 20 MiB.

The CLI runs from this source tree (PYTHONPATH=daemon). Its bytecode is compiled first, as pip compiles an
installed package's: with PYTHONDONTWRITEBYTECODE set (common in CI and images) every run would
otherwise compile the package again, a cost no installed trainguard pays. Build the compiled loop first:
    python3 setup.py build_ext --inplace
    python3 bench/cleanup_bench.py --files 200000 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAY = 86400.0
PER_DIR = 500
REPO = Path(__file__).resolve().parents[1]
FILES_RE = re.compile(r"\((\d+) files\)")


def build(root: str, files: int) -> None:
    """The template tree of one size: half of the files 30 days old, half fresh, 500 per directory."""
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


def copy(template: str, root: str) -> None:
    """A measured tree: a copy of the template (times kept), synced, then walked once with a stat of
    every entry (no file matches -mtime +100000), so that dentries and inodes are cached alike."""
    subprocess.run(["cp", "-a", template, root], check=True)
    subprocess.run(["sync"], check=False)
    subprocess.run(["find", root, "-mtime", "+100000", "-print"], check=True, stdout=subprocess.DEVNULL)


def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str, int]:
    """(seconds from start to exit, peak RSS in KiB, the start of stdout, its lines) of one whole process.

    stdout is counted as it comes, never kept whole: a child's peak RSS (ru_maxrss) starts from this
    process's own peak at the spawn (Linux carries the old mm's high-water mark across exec), so half a
    million listed paths held here would show up as the next command's memory."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env)
        head, lines = b"", 0
        while chunk := proc.stdout.read(1 << 16):
            lines += chunk.count(b"\n")
            head = head if len(head) >= 1 << 16 else head + chunk
        _pid, status, usage = os.wait4(proc.pid, 0)
        took = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"{' '.join(argv)} failed ({proc.returncode}):\n{head.decode()}\n{err.read().decode()}")
    return took, usage.ru_maxrss, head.decode(errors="replace"), lines


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env["PYTHONPATH"] = str(REPO / "daemon")
    return env


def write_config(path: str, root: str, files: int) -> None:
    policy = (f'type = "age"\nroots = ["{root}"]\nolder_than = "7d"\nage_by = ["mtime"]\ngrace = "0s"\n')
    with open(path, "w") as fh:
        fh.write(f'[[cleanup]]\nname = "bounded"\n{policy}max_delete = "{files} files"\n\n'
                 f'[[cleanup]]\nname = "one-pass"\n{policy}max_delete = false\n')


class OneSize:
    """The runs of one size; each tree lives at <base>/tree while its command runs."""

    def __init__(self, base: str, files: int):
        self.base, self.files = base, files
        self.tree = os.path.join(base, "tree")
        self.template = os.path.join(base, "template")
        t = time.perf_counter()
        build(self.template, files)
        print(f"built the {files}-file template in {time.perf_counter() - t:.0f}s")
        self.state = os.path.join(base, "state")
        self.config = os.path.join(base, "config.toml")
        os.makedirs(self.state)
        write_config(self.config, self.tree, files)
        self.env = cli_env()

    def fresh(self, empty: bool = False) -> None:
        subprocess.run(["rm", "-rf", self.tree], check=True)
        if empty:
            os.mkdir(self.tree)
        else:
            copy(self.template, self.tree)

    def cleanup(self, policy: str, dry: bool = False) -> tuple[float, int, int]:
        """(seconds, peak RSS KiB, files it deleted or would delete) of trainguard cleanup."""
        argv = [sys.executable, "-m", "trainguard", "cleanup", "--config", self.config, "--state-dir", self.state,
                "--policy", policy] + (["--dry-run"] if dry else [])
        took, rss, out, _lines = run(argv, self.env)
        found = FILES_RE.search(out)
        if found is None:
            sys.exit(f"no file count in the cleanup summary:\n{out}")
        return took, rss, int(found.group(1))

    def left(self) -> int:
        return sum(len(f) for _d, _s, f in os.walk(self.tree))

    def once(self) -> dict:
        r: dict = {"files": self.files}
        self.fresh(empty=True)  # the baselines: the same commands on an empty root
        startup, base_dry, _n = self.cleanup("bounded", dry=True)
        base = {"dry": base_dry, "bounded": self.cleanup("bounded")[1], "one-pass": self.cleanup("one-pass")[1]}
        r["startup"] = startup
        self.fresh()
        r["find_delete"], _rss, _out, _lines = run(["find", self.tree, "-type", "f", "-mtime", "+7", "-delete"])
        left_find = self.left()
        growth = {}
        for policy in ("bounded", "one-pass"):
            self.fresh()
            r[policy], rss, deleted = self.cleanup(policy)
            growth[policy] = rss - base[policy]
            assert self.left() == left_find and deleted == self.files - left_find, (policy, self.left(), left_find)
        self.fresh()
        r["find_print"], _rss, _out, listed = run(["find", self.tree, "-type", "f", "-mtime", "+7", "-print"])
        r["dry"], rss, would = self.cleanup("bounded", dry=True)
        growth["dry"] = rss - base["dry"]
        assert would == listed == self.files - left_find, (would, listed)
        r.update({f"growth_{k}": v / 1024 for k, v in growth.items()})
        r["growth_mib"] = max(growth.values()) / 1024
        subprocess.run(["rm", "-rf", self.tree], check=True)
        return r


def compiled_loop(env: dict[str, str], config: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "trainguard", "check-config", "--json", config], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["cleanup_loop"]


def print_row(r: dict) -> None:
    ratios = (r["bounded"] / r["find_delete"], r["one-pass"] / r["find_delete"], r["dry"] / r["find_print"])
    print(f"{int(r['files']):>9} | {r['find_delete']:>11.2f}s | {r['bounded']:>7.2f}s | {ratios[0]:>5.2f}x | "
          f"{r['one-pass']:>7.2f}s | {ratios[1]:>5.2f}x | {r['find_print']:>10.2f}s | {r['dry']:>7.2f}s | "
          f"{ratios[2]:>5.2f}x | {r['growth_mib']:>6.1f} MiB | {r['startup']:.2f}s")
    print(f"{'':>9}   RSS growth: cleanup {r['growth_bounded']:.1f} MiB, one pass {r['growth_one-pass']:.1f} MiB, "
          f"dry run {r['growth_dry']:.1f} MiB")
    met = (ratios[0] <= 1.3, ratios[2] <= 1.3, r["growth_mib"] < 20)
    print(f"{'':>9}   targets (cleanup <= 1.3x, dry run <= 1.3x, RSS growth < 20 MiB): "
          + ", ".join("met" if m else "NOT met" for m in met), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, nargs="+", default=[200000, 1000000])
    ap.add_argument("--repeat", type=int, default=1, help="runs per size; the median of each figure is shown")
    ap.add_argument("--dir", default=None, help="where to build the trees (default: a temp dir on /var/tmp)")
    args = ap.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "daemon" / "trainguard")], check=True,
                   stdout=subprocess.DEVNULL)
    base = tempfile.mkdtemp(prefix="tg-cleanup-bench-", dir=args.dir or "/var/tmp")
    try:
        for n in args.files:
            size = OneSize(os.path.join(base, str(n)), n)
            if n == args.files[0]:
                size.fresh(empty=True)
                print(compiled_loop(size.env, size.config)["message"])
                print(f"{'files':>9} | {'find -delete':>12} | {'cleanup':>8} | {'ratio':>6} | {'one pass':>8} | "
                      f"{'ratio':>6} | {'find -print':>11} | {'dry run':>8} | {'ratio':>6} | RSS growth | start-up")
            runs = [size.once() for _ in range(args.repeat)]
            print_row({k: statistics.median(r[k] for r in runs) for k in runs[0]})
            subprocess.run(["rm", "-rf", size.base], check=False)  # its template too: the next size needs the inodes
    finally:
        subprocess.run(["rm", "-rf", base], check=False)


if __name__ == "__main__":
    main()
