"""A child process that appends numbered lines to a log, as a trainer does, and reading them back.

``LogWriter(path)`` starts it (mode "a" opens with O_APPEND, like logging.FileHandler; "w" does not,
like ``python train.py > train.log``); ``halt()`` makes it stop writing and returns how many lines it
wrote, with the file still open; ``close()`` ends it. ``pace`` sleeps 1 ms every that many lines
(0: as fast as it can). ``steps(data)`` are the line numbers of the whole lines in data;
``pieces(dir, name)`` the rotated generations, oldest first, then the live file.
"""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path

LINE = re.compile(rb"step (\d{9}) x{70}\n")
_SCRIPT = """
import select, sys, time
path, mode, pace = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, mode, buffering=1) as log:
    i = 0
    while True:
        log.write(f"step {i:09d} " + "x" * 70 + "\\n")
        i += 1
        if i == 1:
            print("ready", flush=True)
        if i % (pace or 50) == 0:
            if pace:
                time.sleep(0.001)
            if select.select([sys.stdin], [], [], 0)[0]:
                break
    print(i, flush=True)
    sys.stdin.readline()
    sys.stdin.readline()
"""


class LogWriter:
    def __init__(self, path: Path, mode: str = "a", pace: int = 0):
        self.proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(path), mode, str(pace)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the log writer did not start")

    def halt(self) -> int:
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def steps(data: bytes) -> list[int]:
    """Line numbers of the whole lines (a truncate can cut the last line of a copy in half)."""
    return [int(m.group(1)) for m in LINE.finditer(data)]


def pieces(directory: Path, name: str) -> list[bytes]:
    """The generations (name.N.gz), oldest first, then the live file."""
    gens = sorted(directory.glob(f"{name}.*.gz"), key=lambda p: -int(p.name.split(".")[-2]))
    return [gzip.decompress(p.read_bytes()) for p in gens] + [(directory / name).read_bytes()]
