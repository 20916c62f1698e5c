"""What a process writes, from /proc only: the files it has open for writing, and, when its stdout or
stderr is a pipe (`python train.py 2>&1 | tee train.log`, `| logger`, `| rotatelogs`), the process at
the pipe's other end and what that one writes.

Only /proc is read: readlink of /proc/PID/fd/N and the `pos:` of /proc/PID/fdinfo/N, never a stat of the
file itself, so a file on a hung mount cannot block the daemon. The pipe's reader is found once per pipe
(by its inode) and kept while it lives: first among the processes near the writer (the children of its
parent and grandparent: the shell that runs the pipeline), then, once, in a bounded pass over /proc. A
pipe with no reader found is looked for again after RETRY seconds, not every cycle.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainguard.sources.procs import read_small

MAX_FDS = 256  # file descriptors looked at per process
MAX_SCAN = 4096  # processes looked at when the reader is not near the writer
MAX_PIPES = 256  # pipes remembered
RETRY = 600.0  # seconds before a pipe without a reader found is looked for again
_PIPE = re.compile(r"pipe:\[(\d+)\]")


def parse_pos(fdinfo: str) -> int | None:
    for line in fdinfo.splitlines():
        key, _, value = line.partition(":")
        if key == "pos":
            return int(value.strip()) if value.strip().isdigit() else None
    return None


def _flags(fdinfo: str) -> int | None:
    value = next((ln.split(":", 1)[1].strip() for ln in fdinfo.splitlines() if ln.startswith("flags:")), "")
    try:
        return int(value, 8)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Writes:
    """What one process writes: the sum of the write positions of its files open for writing, those
    files, its stdout/stderr files and pipes."""

    total: int = 0
    files: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()  # its stdout/stderr when they are files
    pipes: tuple[int, ...] = ()  # the inodes of its stdout/stderr when they are pipes


def _fds(proc_root: str, pid: int) -> list[str]:
    try:
        return sorted((n for n in os.listdir(f"{proc_root}/{pid}/fd") if n.isdigit()), key=int)[:MAX_FDS]
    except OSError:
        return []


def read_writes(proc_root: str, pid: int) -> Writes:
    base = f"{proc_root}/{pid}"
    total, files, outputs, pipes = 0, [], [], []
    for name in _fds(proc_root, pid):
        try:
            target = os.readlink(f"{base}/fd/{name}")
        except OSError:
            continue
        if name in ("1", "2") and (pipe := _PIPE.fullmatch(target)):
            pipes.append(int(pipe.group(1)))
            continue
        if not target.startswith("/") or target.startswith("/dev/"):
            continue
        info = read_small(f"{base}/fdinfo/{name}") or ""
        flags = _flags(info)
        if flags is None or flags & (os.O_WRONLY | os.O_RDWR) == 0:
            continue
        total += parse_pos(info) or 0
        files.append(target.removesuffix(" (deleted)"))
        if name in ("1", "2") and not target.endswith(" (deleted)"):
            outputs.append(target)
    return Writes(total, tuple(dict.fromkeys(files)), tuple(dict.fromkeys(outputs)), tuple(dict.fromkeys(pipes)))


def _start(proc_root: str, pid: int) -> tuple[int, int] | None:
    """(ppid, start time in ticks) from /proc/PID/stat."""
    text = read_small(f"{proc_root}/{pid}/stat") or ""
    tail = text[text.rfind(")") + 1:].split()
    return (int(tail[1]), int(tail[19])) if len(tail) > 19 and tail[1].isdigit() and tail[19].isdigit() else None


class PipeReaders:
    """The process reading each pipe a run writes its output to, found once and kept while it lives."""

    def __init__(self, proc_root: str = "/proc"):
        self.proc_root = proc_root
        self._readers: dict[int, tuple[tuple[int, int] | None, float]] = {}  # inode -> ((pid, start), when)
        self._read: dict[int, Writes] = {}  # reader -> what it writes, as read at _read_at
        self._read_at: float | None = None

    def writes(self, inode: int, writer: int, now: float) -> Writes | None:
        """What the reader of the pipe writes (its files' write positions), or None. Not the bytes it
        read: rchar counts sockets and every other file too (mpirun's own traffic, a supervisor's reads)."""
        reader = self._reader(inode, writer, now)
        if reader is None:
            return None
        if self._read_at != now:  # one read a cycle of a reader that all the ranks share (one tee)
            self._read, self._read_at = {}, now
        if reader not in self._read:
            w = read_writes(self.proc_root, reader)
            self._read[reader] = Writes(w.total, w.files, w.files, ())
        return self._read[reader]

    def keep(self, inodes: Iterable[int]) -> None:
        """Forget the pipes no run writes to any more."""
        live = set(inodes)
        self._readers = {i: r for i, r in self._readers.items() if i in live}

    def _reader(self, inode: int, writer: int, now: float) -> int | None:
        known = self._readers.get(inode)
        if known is not None:
            reader, when = known
            if reader is not None:
                stat = _start(self.proc_root, reader[0])
                if stat is not None and stat[1] == reader[1]:
                    return reader[0]  # the same process: a PID reused by another is not it
            elif now - when < RETRY:
                return None
        found = self._find(inode, writer)
        if len(self._readers) >= MAX_PIPES:
            self._readers.pop(next(iter(self._readers)))
        start = _start(self.proc_root, found) if found is not None else None
        self._readers[inode] = ((found, start[1]) if found is not None and start else None, now)
        return found if start else None

    def _find(self, inode: int, writer: int) -> int | None:
        target = f"pipe:[{inode}]"
        for pid in self._candidates(writer):
            if pid != writer and self._reads(pid, target):
                return pid
        return None

    def _candidates(self, writer: int) -> Iterable[int]:
        """The processes near the writer first (its parent's and grandparent's children: a shell's
        pipeline; then those two: mpirun reads its ranks' output), then /proc."""
        siblings: list[int] = []
        parents: list[int] = []
        current = writer
        for _ in range(2):
            stat = _start(self.proc_root, current)
            if stat is None or stat[0] <= 1:
                break
            current = stat[0]
            parents.append(current)
            siblings.extend(self._children(current))
        near = dict.fromkeys(siblings + parents)
        yield from near
        try:
            pids = [int(n) for n in os.listdir(self.proc_root) if n.isdigit()]
        except OSError:
            return
        yield from (p for p in pids[:MAX_SCAN] if p not in near)

    def _children(self, pid: int) -> Sequence[int]:
        text = read_small(f"{self.proc_root}/{pid}/task/{pid}/children", 65536) or ""
        return [int(c) for c in text.split() if c.isdigit()]

    def _reads(self, pid: int, target: str) -> bool:
        """Whether the process holds the pipe open for reading."""
        base = f"{self.proc_root}/{pid}"
        for name in _fds(self.proc_root, pid):
            try:
                if os.readlink(f"{base}/fd/{name}") != target:
                    continue
            except OSError:
                continue
            flags = _flags(read_small(f"{base}/fdinfo/{name}") or "")
            if flags is not None and flags & (os.O_WRONLY | os.O_RDWR) == 0:
                return True
        return False
