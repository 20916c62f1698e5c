"""The age rules for one batch of names in one directory: written once here and once in C
(_agescan.c), kept equal by tests/test_cleanup_rules.py (random trees and times, both judges).

For each name: lstat relative to the directory fd, then, in this order: another filesystem,
a directory (handed back to be entered), not a file or symlink or not wanted by the patterns
(ignored), changed within grace, open by a process (a dry run's count is final), younger than
older_than; then, deleting, open by a process, the max_delete bound (never unlink more than it
allows) and the watermark's need (stop once it is freed), and the deletion relative to the fd by
quarantine (quarantine.py: renamed to a private name, checked to be the entry judged, unlinked;
anything renamed over the judged name meanwhile is put back, CHANGED).
Which names are handed here at all (mount points, exclude globs, cache units, locks) is
decided by the caller (agepass.py), as are every count, skip, report and audit row.
"""

from __future__ import annotations

import os
import stat as stat_mod
from typing import Callable, NamedTuple, Sequence

from trainguard.actions.cleanup.engine.bound import Bound
from trainguard.actions.cleanup.engine.quarantine import Changed, Quarantine

try:
    from trainguard.actions.cleanup.engine import _agescan
except ImportError:  # installed without a C compiler: the Python judge does the same work
    _agescan = None

# What happened to one name; the same numbers as _agescan.c's enum.
IGNORED, IS_DIR, STAT_ERROR, OTHER_DEV, GRACE, YOUNG, OPEN, EXPIRED, UNLINK_ERROR, OVER_BOUND = range(10)
HELD_BACK = 10  # Python only: due, but a process whose files could not be read could hold it (hold_back)
CHANGED = 11  # deleting: not the entry judged any more (put back; errno set: left under its private name)
AGE_BITS = {"atime": 1, "mtime": 2, "ctime": 4}
# Threads a run judges on: the CPUs this process may run on, at most 4. The compiled judge counts
# a large batch on them (its lstats; a batch is a directory's names, ~1,000 at a time); a count or a
# guarded deletion judges several directories at once on them (ahead.py, remembered.py). One batch
# is always deleted on one thread: unlinks in one directory take its lock in turn.
THREADS = max(1, min(4, len(os.sched_getaffinity(0))))


class Rule(NamedTuple):
    """A policy's numbers, as both judges take them."""

    dev: int  # the root's filesystem
    age_mask: int  # 0: st_mtime itself; else the newest of the AGE_BITS fields
    now: float
    older_than: float  # due from this age (-inf: every eligible entry, for the oldest a need takes)
    changed_after: float  # changed later than this: within grace


class Batch(NamedTuple):
    dirs: list  # (name, ino): subdirectories on the root's filesystem
    issues: list  # (name, code, errno, ino, bytes) for STAT_ERROR, OTHER_DEV, OPEN, UNLINK_ERROR, OVER_BOUND, CHANGED
    gone: list  # (name, bytes, age): deleted, or (listing) due
    files: int  # due (deleted, or due in a count)
    bytes: int
    young: int
    grace: int


def age_mask(age_by: Sequence[str]) -> int:
    return 0 if tuple(age_by) == ("mtime",) else sum({AGE_BITS[f] for f in age_by})


def age_timestamp(st: os.stat_result, mask: int) -> float:
    """As selection.age_timestamp: the newest of the flagged times, from 0.0."""
    if mask == 0:
        return st.st_mtime
    ts = 0.0
    if mask & 1 and st.st_atime > ts:
        ts = st.st_atime
    if mask & 2 and st.st_mtime > ts:
        ts = st.st_mtime
    if mask & 4 and st.st_ctime > ts:
        ts = st.st_ctime
    return ts


def judge_batch(dir_fd: int, names: list[str], wanted: bytes | None, rule: Rule, open_inos: bytes, delete: bool,
                bound: Bound = Bound(), listed: bool = False, compiled: bool = True,
                is_open: Callable[[int], bool] | None = None, hook: Callable[[str, str], None] | None = None,
                hold_back: Callable[[os.stat_result], bool] | None = None, threads: int = THREADS) -> Batch:
    """Judge (and, deleting, unlink) one batch. compiled: the C judge when it is built; else this
    module's, which may also take is_open (a live open-file check, per entry), hook(event, name)
    ("judged" and "before_delete"; the compiled judge calls "before_delete" only: for tests that race
    one entry) and hold_back(lstat) (a due entry it says could be open stays: HELD_BACK; only this
    judge has that rule). threads: the compiled judge's for a count of one large batch."""
    if compiled and _agescan is not None and hold_back is None:
        return Batch(*_agescan.age_batch(dir_fd, names, wanted, *rule, open_inos, delete, *bound, listed, threads,
                                         hook if delete else None))
    if is_open is None:
        inos = set(memoryview(open_inos).cast("Q")) if open_inos else set()
        is_open = inos.__contains__
    return _judge_py(dir_fd, names, wanted, rule, is_open, delete, bound, listed, hook, hold_back)


def _judge_py(dir_fd, names, wanted, rule, is_open, delete, bound, listed, hook, hold_back) -> Batch:
    dev, mask, now, older_than, changed_after = rule
    need_bytes = bound.need_bytes
    s_isdir, s_isreg, s_islnk = stat_mod.S_ISDIR, stat_mod.S_ISREG, stat_mod.S_ISLNK
    dirs, issues, gone = [], [], []
    files = nbytes = young = grace = unlinked = unlinked_bytes = 0
    quarantine = Quarantine(dir_fd, bool(mask & AGE_BITS["atime"])) if delete else None
    for i, name in enumerate(names):
        try:
            st = _lstat(dir_fd, name, quarantine)
        except OSError as exc:
            issues.append((name, STAT_ERROR, exc.errno or 0, 0, 0))
            continue
        ino, mode = st.st_ino, st.st_mode
        if st.st_dev != dev:
            issues.append((name, OTHER_DEV, 0, ino, 0))
            continue
        if s_isdir(mode):
            dirs.append((name, ino))
            continue
        if not (s_isreg(mode) or s_islnk(mode)) or (wanted is not None and not wanted[i]):
            continue
        if st.st_mtime > changed_after or st.st_ctime > changed_after:
            grace += 1
            continue
        size = st.st_blocks * 512 if st.st_nlink <= 1 else 0
        age = now - age_timestamp(st, mask)
        if not delete and is_open(ino):
            issues.append((name, OPEN, 0, ino, size))  # a dry run's count is final: what is open stays
            continue
        if not age >= older_than:
            young += 1
            continue
        if hold_back is not None and hold_back(st):
            issues.append((name, HELD_BACK, 0, ino, size))
            continue
        if delete:
            if hook is not None:
                hook("judged", name)
            if is_open(ino):
                issues.append((name, OPEN, 0, ino, size))
                continue
            if not bound.fits(unlinked + 1, unlinked_bytes + size) or 0 <= need_bytes <= unlinked_bytes:
                issues.append((name, OVER_BOUND, 0, ino, size))
                continue
            kept = _delete(quarantine, name, st, size, hook)
            if kept is not None:
                issues.append(kept)
                continue
            unlinked += 1
            unlinked_bytes += size
        files += 1
        nbytes += size
        if delete or listed:
            gone.append((name, size, age))
    if quarantine is not None:
        files, nbytes = _settle(quarantine, gone, issues, files, nbytes)
    return Batch(dirs, issues, gone, files, nbytes, young, grace)


def _lstat(dir_fd: int, name: str, quarantine: Quarantine | None) -> os.stat_result:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if quarantine is not None and quarantine.holds(st):
        quarantine.release()  # another name of the inode held: judged as if that were gone, as it is next
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    return st


def _settle(quarantine: Quarantine, gone: list, issues: list, files: int, nbytes: int) -> tuple[int, int]:
    """Unlink what the quarantine still holds; an entry whose unlink failed is an issue, not gone."""
    quarantine.release()
    for name, err, ino in quarantine.failed:
        at = next(i for i in range(len(gone) - 1, -1, -1) if gone[i][0] == name)
        _name, size, _age = gone.pop(at)
        issues.append((name, UNLINK_ERROR, err, ino, size))
        files, nbytes = files - 1, nbytes - size
    return files, nbytes


def _delete(quarantine: Quarantine, name: str, st: os.stat_result, size: int, hook) -> tuple | None:
    """Delete one judged entry (quarantine.py): None, or the issue that kept it."""
    if hook is not None:
        hook("before_delete", name)
    try:
        quarantine.unlink(name, st)
    except Changed as exc:
        return name, CHANGED, exc.errno, st.st_ino, size
    except OSError as exc:
        return name, UNLINK_ERROR, exc.errno or 0, st.st_ino, size
    return None
