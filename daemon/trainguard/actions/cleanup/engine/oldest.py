"""Oldest first, in bounded memory: the entries a run that must free bytes (a watermark, a size cap)
takes, and their deletion in that order.

The counting pass (agepass.Pass, listing) hands every eligible entry to Oldest.add. A min-heap keyed
on age keeps only the oldest ones the run can take: whenever what it holds frees the need without its
youngest entry, or holds more than max_delete allows (files or bytes) or more than BUDGET bytes of
memory, the youngest goes, and from then on nothing as young as one that went is taken (the floor).
What is left is the oldest prefix of everything seen, never a newer entry in place of an older one.
A run that must free 6 MiB holds ~1,500 entries, one bounded by the default max_delete at most 10,000,
whatever the tree's size; no histogram of ages, so all files of one age count no more than it needs.

delete() then unlinks exactly those names, oldest first, through the pass's judge: each one lstat'ed
again right before its unlink with every rule, and no younger than the youngest chosen (one touched
since the count stays). Their directories are reopened below the root as a guarded run's are
(remembered.open_counted: the same inode, the same mount, no symlink), a few kept open at a time.
"""

from __future__ import annotations

import heapq
import math
import os
from itertools import groupby
from typing import NamedTuple

from trainguard.actions.cleanup.engine import walker
from trainguard.actions.cleanup.engine.agepass import Pass
from trainguard.actions.cleanup.engine.bound import Bound, takes_whole
from trainguard.actions.cleanup.engine.remembered import CHUNK, open_counted
from trainguard.actions.cleanup.plan import Ctx, full_path
from trainguard.sources.fs import usage_from_statvfs

BUDGET = 16 << 20  # bytes of chosen entries and their directories held at once, per root
_ENTRY_COST = 200  # one chosen entry in the heap, its name aside, roughly
_DIR_COST = 400  # a directory's path and lstat, roughly
_OPEN_DIRS = 32  # directories kept open while deleting: ages interleave across directories


class Entry(NamedTuple):
    """One chosen entry: a file, or a cache unit (a whole directory: files > 1 or a unit's name)."""

    age: float
    bytes: int
    files: int
    dir: int  # index into Oldest.dirs
    name: str


class Oldest:
    """The oldest entries a counting pass saw, within the bounds given (-1: none). need: the bytes the run
    must free, when it is known before the count (a watermark); None: keep all the bounds allow."""

    def __init__(self, need: int | None, bound: Bound, budget: int = BUDGET, emergency: bool = False):
        self.need, self.bound, self.budget = need, bound, budget
        self.emergency = emergency  # the oldest entry alone may be past the bound (bound.takes_whole)
        self.heap: list[tuple[float, int, Entry]] = []  # (age, order seen, entry): the youngest on top
        self.dirs: list[tuple[str, str, os.stat_result]] = []  # (relpath, name in parent, lstat), as counted
        self.files = self.bytes = self.memory = 0
        self.floor = -math.inf  # an entry this young or younger is never taken again
        self._seen = 0
        self._lst: walker.Listing | None = None
        self._dir = -1

    def add(self, lst: walker.Listing, gone: list[tuple[str, int, float]], files: int = 1) -> None:
        """A batch of eligible entries of one directory: (name, bytes, age) each."""
        floor = self.floor
        for name, nbytes, age in gone:
            if age <= floor:
                continue  # the common case once the heap is full: one comparison
            if lst is not self._lst:
                self._lst, self._dir = lst, len(self.dirs)
                self.dirs.append((lst.path, lst.name, lst.st))
                self.memory += _DIR_COST + len(lst.path)
            self._seen += 1
            heapq.heappush(self.heap, (age, self._seen, Entry(age, nbytes, files, self._dir, name)))
            self.files += files
            self.bytes += nbytes
            self.memory += _ENTRY_COST + len(name)
            self._trim()
            floor = self.floor

    def _trim(self) -> None:
        heap = self.heap
        while heap:
            top = heap[0][2]
            over = not self.bound.fits(self.files, self.bytes) and not (self.emergency and len(heap) == 1)
            if not (self.memory > self.budget or over
                    or (self.need is not None and self.bytes - top.bytes >= self.need)):
                return
            heapq.heappop(heap)
            self.files -= top.files
            self.bytes -= top.bytes
            self.memory -= _ENTRY_COST + len(top.name)
            self.floor = top.age

    def capped(self) -> bool:
        """Whether a bound or the memory budget made an entry go that the need (if known) wanted."""
        return self.floor > -math.inf and (self.need is None or self.bytes < self.need)

    def chosen(self) -> list[Entry]:
        """Oldest first."""
        return [e for _a, _n, e in sorted(self.heap, key=lambda item: (-item[0], item[1]))]


def prefix(entries: list[Entry], need: int, need_expired: int, older_than: float) -> list[Entry]:
    """What of the oldest-first entries frees `need` bytes (a size cap: any entry) and `need_expired`
    (a watermark: only entries at least older_than old), and nothing after that."""
    out, freed = [], 0
    for e in entries:
        if freed >= need and (freed >= need_expired or not e.age >= older_than):
            break
        out.append(e)
        freed += e.bytes
    return out


def delete(p: Pass, dirs: list[tuple[str, str, os.stat_result]], entries: list[Entry]) -> None:
    """Unlink entries (oldest first) through p's judge within p's bound, or, in a dry run, list them.
    p judges from the youngest chosen age (its older_than): an entry used since it was counted stays."""
    ctx, root = p.ctx, p.root
    if ctx.dry_run:
        _list(ctx, p, dirs, entries)
        return
    ctx.tools.open_files.refresh()  # what is open now, not when the count began
    held = ctx.tools.open_files.unknown(root.dev, root.path, root.mnt)
    if held:  # attached since the count: the kernel holds a file here that cannot be identified
        p.busy = f"in use: {held}"
        return
    opened = _Dirs(p, dirs)
    try:
        for index, group in groupby(entries, key=lambda e: e.dir):
            if p.stopped or p.busy:  # the need freed, max_delete reached, or a cache's lock taken meanwhile
                break
            lst = opened.get(index)
            if lst is None:
                continue
            names = [e.name for e in group]
            for start in range(0, len(names), CHUNK):
                if ctx.tools.hook is not None:
                    ctx.tools.hook("batch", lst.path)
                if not walker.in_place(lst):  # it left the root since the count: not cleaned
                    p.problem(walker.moved(lst))
                    opened.drop(index)
                    break
                got = p.judge(lst, names[start:start + CHUNK], p.left(), threads=1)
                # A directory among them: a cache unit at the top is judged whole (Pass.take); one
                # deeper is a name replaced by a directory since the count, never entered here.
                p.take(lst, got if not lst.path else got._replace(dirs=[]))
                if p.stopped or p.busy:
                    break
    finally:
        opened.close()


def _list(ctx: Ctx, p: Pass, dirs, entries: list[Entry]) -> None:
    """A dry run: each chosen entry, as a run would delete it, within max_delete."""
    for e in entries:
        unit = e.files > 1 or p.units is not None and not dirs[e.dir][0] and p.units(e.name, e.name)
        fits = p.bound.fits(p.deleted + e.files, p.freed + e.bytes)
        if not fits and not (unit and takes_whole(p.emergency, ctx.tally.files)):  # as cacheunits.py decides
            break
        if not fits:
            ctx.whole = (e.name, e.files, usage_from_statvfs(os.fstatvfs(p.root.fd)).used_ratio)
        p.deleted += e.files
        p.freed += e.bytes
        path = full_path(p.root, dirs[e.dir][0] + "/" + e.name if dirs[e.dir][0] else e.name)
        ctx.went(p.root, path, (e.bytes, e.files), p.reason, e.age, unit)


class _Dirs:
    """The counted directories, reopened below the root as they come, a few open at a time."""

    def __init__(self, p: Pass, dirs: list[tuple[str, str, os.stat_result]]):
        self.p, self.dirs = p, dirs
        self.open: dict[int, walker.Listing] = {}  # the most recently used last
        self.gone: set[int] = set()  # not there, or left the root: reported once, not reopened

    def get(self, index: int) -> walker.Listing | None:
        if index in self.gone:
            return None
        lst = self.open.pop(index, None)
        if lst is None:
            if len(self.open) >= _OPEN_DIRS:
                os.close(self.open.pop(next(iter(self.open))).fd)
            path, name, st = self.dirs[index]
            lst = open_counted(self.p, self.p.root, path, name, st)
            if lst is None:
                self.gone.add(index)
                return None
            lst.data = []
        self.open[index] = lst
        return lst

    def drop(self, index: int) -> None:
        self.gone.add(index)
        lst = self.open.pop(index, None)
        if lst is not None:
            os.close(lst.fd)

    def close(self) -> None:
        for lst in self.open.values():
            os.close(lst.fd)
        self.open.clear()
