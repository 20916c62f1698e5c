"""Lines lost when a log is rotated under a live writer: the logs policy against logrotate's copytruncate.

    sudo PYTHONPATH=daemon python bench/log_rotate.py [--rotations 10] [--every 0.2]

On a fresh loop-mounted ext4 and a tmpfs (needs root), a child process appends numbered lines
(O_APPEND, as logging.FileHandler does) while the log is rotated every `--every` seconds, first by
the logs policy (actions/cleanup/kinds/logs.py), then, as the reference, by `logrotate -f` with
copytruncate + compress (skipped when logrotate is not installed). Afterwards every generation and
the live file are read back and the step numbers counted: lines lost, lines seen twice, and the
ratio of lost lines against logrotate in the same run.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "daemon"))

from trainguard import config as configmod  # noqa: E402
from trainguard.actions.cleanup.kinds.logs import rotate_logs  # noqa: E402

from tests.support.log_writer import LogWriter, pieces, steps  # noqa: E402
from tests.support.mounts import loop_ext4, tmpfs  # noqa: E402

LOGROTATE_CONF = "{path} {{\n  copytruncate\n  compress\n  nodelaycompress\n  rotate 10000\n  missingok\n}}\n"


def trial(directory: Path, rotate, rotations: int, every: float) -> tuple[int, int, int]:
    """(lines written, lost, seen twice). The generations, oldest first, and the live file are read as
    one stream (the logs policy may split a line between a generation and the next: not a loss)."""
    log = directory / "train.log"
    writer = LogWriter(log)
    try:
        for _ in range(rotations):
            time.sleep(every)
            rotate(log)
        written = writer.halt()
    finally:
        writer.close()
    seen = steps(b"".join(pieces(directory, "train.log")))
    return written, written - len(set(seen)), len(seen) - len(set(seen))


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
