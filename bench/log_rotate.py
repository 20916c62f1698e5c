"""Lines lost when a log is rotated under a live writer: the logs policy against logrotate's copytruncate.

    sudo PYTHONPATH=daemon python bench/log_rotate.py [--rotations 10] [--every 0.2]

On a fresh loop-mounted ext4 and a tmpfs (needs root), a child process appends numbered lines
(O_APPEND, as logging.FileHandler does) while the log is rotated every `--every` seconds, first by
the logs policy (actions/rotate.py), then, as the reference, by `logrotate -f` with
copytruncate + compress (skipped when logrotate is not installed). Afterwards every generation and
the live file are read back and the step numbers counted: lines lost, lines seen twice, and the
ratio of lost lines against logrotate in the same run.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "daemon"))

from tests.support.mounts import loop_ext4, tmpfs  # noqa: E402
from trainguard import config as configmod  # noqa: E402
from trainguard.actions.rotate import rotate_logs  # noqa: E402

WRITER = """
import select, sys
with open(sys.argv[1], "a", buffering=1) as log:
    i = 0
    while True:
        log.write(f"step {i:09d} " + "x" * 70 + "\\n")
        i += 1
        if i == 1:
            print("ready", flush=True)
        if i % 50 == 0 and select.select([sys.stdin], [], [], 0)[0]:
            break
    print(i, flush=True)
"""
LINE = re.compile(rb"step (\d{9}) x{70}\n")
LOGROTATE_CONF = "{path} {{\n  copytruncate\n  compress\n  nodelaycompress\n  rotate 10000\n  missingok\n}}\n"


def count(directory: Path, name: str, written: int) -> tuple[int, int]:
    """(lost, seen twice) over the generations, oldest first, then the live file, read as one stream
    (the logs policy may split a line between a generation and the next: that is not a loss)."""
    gens = sorted(directory.glob(f"{name}.*.gz"), key=lambda p: -int(p.name.split(".")[-2]))
    data = b"".join(gzip.decompress(p.read_bytes()) for p in gens) + (directory / name).read_bytes()
    seen: dict[int, int] = {}
    for m in LINE.finditer(data):  # whole lines only: a truncate can cut one in half
        n = int(m.group(1))
        seen[n] = seen.get(n, 0) + 1
    return written - len(seen), sum(c - 1 for c in seen.values())


def trial(directory: Path, rotate, rotations: int, every: float) -> tuple[int, int, int]:
    log = directory / "train.log"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(log)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        for _ in range(rotations):
            time.sleep(every)
            rotate(log)
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        written = int(proc.stdout.readline())
    finally:
        proc.stdin.close()
        proc.wait(30)
    lost, twice = count(directory, "train.log", written)
    return written, lost, twice


def ours(log: Path) -> None:
    policy = configmod.parse({"cleanup": [{"name": "bench", "type": "logs", "roots": [str(log.parent)],
                                           "max_size": "1KiB", "keep": 10000}]}, "bench").cleanup[0]
    rotate_logs(policy)


def logrotate(log: Path) -> None:
    conf = log.parent.parent / f"{log.parent.name}.conf"
    conf.write_text(LOGROTATE_CONF.format(path=log))
    subprocess.run(["logrotate", "-f", "-s", str(conf) + ".state", str(conf)], check=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rotations", type=int, default=10)
    ap.add_argument("--every", type=float, default=0.2)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (tmpfs and loop ext4)", file=sys.stderr)
        return 2
    methods = [("logs policy", ours)]
    if shutil.which("logrotate"):
        methods.append(("logrotate copytruncate (reference)", logrotate))
    print(f"{'filesystem':<8} {'method':<36} {'lines':>9} {'lost':>6} {'twice':>6} {'lost/rotation':>14}")
    for fs_name, mount in (("ext4", lambda: loop_ext4(256 * 2**20)), ("tmpfs", lambda: tmpfs(256 * 2**20))):
        with mount() as where:
            lost_by = {}
            for label, rotate in methods:
                written, lost, twice = trial(Path(tempfile.mkdtemp(dir=where)), rotate, args.rotations, args.every)
                lost_by[label] = lost
                print(f"{fs_name:<8} {label:<36} {written:>9} {lost:>6} {twice:>6} {lost / args.rotations:>14.2f}")
            if len(lost_by) == 2:
                ref = lost_by[methods[1][0]]
                ratio = "n/a (reference lost none)" if ref == 0 else f"{lost_by['logs policy'] / ref:.3f}x"
                print(f"{fs_name:<8} lost lines, logs policy / logrotate: {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
