"""The newest checkpoint under each checkpoints cleanup policy's roots: its size tells the next-checkpoint
detector how much room the next save needs (detectors do not read the disk themselves).

A checkpoint is a file matching the policy's ``patterns`` or a directory matching its ``dir_patterns``
(its size: the files inside). The scan is bounded (depth, entries) and cached for ``every`` seconds;
roots on mounts that did not answer this cycle are skipped, so a hung mount cannot stall the sampler.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Sequence

from trainguard.records import CheckpointFact, FsSample

MAX_DEPTH = 3
MAX_ENTRIES = 20_000


def _dir_bytes(path: str, budget: list[int]) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            budget[0] -= 1
            if budget[0] < 0:
                return total
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def newest_checkpoint(root: str, patterns: Sequence[str], dir_patterns: Sequence[str]) -> tuple[str, int, float] | None:
    """(path, bytes, mtime) of the most recently modified checkpoint under root; None when there is none."""
    best: tuple[float, str, bool] | None = None
    budget = [MAX_ENTRIES]
    stack = [(root, 0)]
    while stack and budget[0] > 0:
        path, depth = stack.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for entry in entries:
            budget[0] -= 1
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                is_file = entry.is_file(follow_symlinks=False)
                mtime = entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if is_dir and any(fnmatch.fnmatchcase(entry.name, g) for g in dir_patterns):
                if best is None or mtime > best[0]:
                    best = (mtime, entry.path, True)
            elif is_file and any(fnmatch.fnmatchcase(entry.name, g) for g in patterns):
                if best is None or mtime > best[0]:
                    best = (mtime, entry.path, False)
            elif is_dir and depth + 1 < MAX_DEPTH:
                stack.append((entry.path, depth + 1))
    if best is None:
        return None
    mtime, path, is_dir = best
    try:
        nbytes = _dir_bytes(path, [MAX_ENTRIES]) if is_dir else os.lstat(path).st_size
    except OSError:
        return None
    return path, nbytes, mtime


def _mount_of(path: str, filesystems: Iterable[FsSample]) -> FsSample | None:
    real = os.path.realpath(path)
    best = None
    for s in filesystems:
        mp = s.mount.mount_point
        if (real == mp or real.startswith(mp.rstrip("/") + "/")) and (best is None or len(mp) > len(best.mount.mount_point)):
            best = s
    return best


class CheckpointSampler:
    """Newest checkpoint per root of the enabled checkpoints policies, rescanned at most every `every` s."""

    def __init__(self, policies: Sequence, every: float = 60.0) -> None:
        self.roots = [(root, p.patterns, p.dir_patterns) for p in policies
                      if getattr(p, "type", None) == "checkpoints" and p.enabled for root in p.roots]
        self.every = every
        self._cache: tuple[float, tuple[CheckpointFact, ...]] | None = None

    def sample(self, now: float, filesystems: Sequence[FsSample]) -> tuple[CheckpointFact, ...]:
        if not self.roots:
            return ()
        if self._cache is not None and 0 <= now - self._cache[0] < self.every:
            return self._cache[1]
        facts = []
        for root, patterns, dir_patterns in self.roots:
            fs = _mount_of(root, filesystems)
            if fs is None or not fs.responsive or not os.path.isdir(root):
                continue
            found = newest_checkpoint(root, patterns, dir_patterns)
            if found is not None:
                path, nbytes, mtime = found
                facts.append(CheckpointFact(root, fs.mount.mount_point, nbytes, mtime, path))
        self._cache = (now, tuple(facts))
        return self._cache[1]
