"""The checks around a run, in one place: which roots may be worked in (safe, writable, their
mount points known), how much a watermark run must free, and the max_delete guard.

The per-entry rules (never across a mount, never an open file, never within grace, the
re-check before each unlink) live with the walk (engine/), the in-use index (safety/inuse.py) and the kinds.
"""

from __future__ import annotations

import logging
import math
import os

from trainguard.actions.cleanup.engine.bound import exceeds, whole_note
from trainguard.actions.cleanup.record.report import Tally
from trainguard.actions.cleanup.safety import roots
from trainguard.actions.cleanup.safety.roots import Root, UnsafeRoot
from trainguard.records import FsUsage
from trainguard.sources.fs import usage_from_statvfs
from trainguard.units import format_bytes, format_ratio

log = logging.getLogger("trainguard.actions.cleanup.runner")


def write_blocked(root: Root) -> tuple[str, str]:
    """Why this process cannot delete below the root: ("read-only" or "permission", the reason), or
    ("", "") when it can. A read-only mount (the systemd unit's ProtectSystem=/ProtectHome= make one),
    or no write permission."""
    if os.fstatvfs(root.fd).f_flag & os.ST_RDONLY:
        return "read-only", f"{root.path} is read-only for trainguard (mounted read-only here)"
    if not os.access(root.path, os.W_OK | os.X_OK):
        return "permission", f"{root.path} is not writable for trainguard (uid {os.geteuid()})"
    return "", ""


def open_root(path: str, homes: frozenset[str] | None, proc_root: str, tally: Tally,
              dry_run: bool) -> tuple[Root | None, str]:
    """Open and check one root (safety/roots.py), and whether this process may delete there.
    (Root, "") or (None, why it is left alone); the caller closes the fd."""
    try:
        root = roots.open_root(path, homes, proc_root)
    except UnsafeRoot as exc:
        tally.skip("unsafe-root", path, str(exc))
        return None, str(exc)
    except OSError as exc:
        why = f"cannot read mount table: {exc.strerror}"
        tally.skip("error", path, why)
        return None, why
    blocked, why = write_blocked(root)
    if why:
        tally.block(root.path, blocked, why)
        if not dry_run:  # a dry run still shows what would go
            os.close(root.fd)
            tally.skip("read-only", path, why)
            return None, why
    return root, ""


def bytes_above(usage: FsUsage, ratio: float) -> int:
    """Bytes to free for used / (used + avail) to reach ratio (df's view)."""
    return max(0, math.ceil(usage.used_bytes - ratio * (usage.used_bytes + usage.avail_bytes)))


def watermark_need(policy, usage: FsUsage, manual: bool) -> tuple[int | None, str]:
    """(bytes to free, "") for a run at or above its threshold, else (None, why not)."""
    threshold = policy.high if manual else policy.low
    if usage.used_ratio < threshold or bytes_above(usage, policy.low) == 0:
        return None, f"{format_ratio(usage.used_ratio)} used, below the {format_ratio(threshold)} watermark"
    return bytes_above(usage, policy.low), ""


def reached(root: Root, need: int, freed: int, dry_run: bool, low: float) -> bool:
    """Watermark runs stop at `low`: by the filesystem's own count, or by what was freed."""
    if freed >= need:
        return True
    if dry_run:
        return False
    return usage_from_statvfs(os.fstatvfs(root.fd)).used_ratio <= low


# max_delete meets two kinds of run. A plain run (a schedule, `trainguard cleanup`) takes every due entry:
# there it is the runaway guard, all or nothing, for a root misconfigured so that most of the disk is due.
# A run that must free space (a watermark, a size cap) takes only what its need takes, oldest first:
# there it bounds one run and is never a reason to delete nothing; the disk must not fill.


def max_delete_text(limit) -> str:
    return f"{limit.files} files" if limit.files is not None else format_bytes(limit.bytes)


def max_delete_guard(policy, files: int, nbytes: int) -> str:
    """Non-empty when a plain run's due entries exceed max_delete: then none of them is deleted."""
    limit = policy.max_delete
    if not exceeds(limit, files, nbytes):
        return ""
    guard = f"{files} files ({format_bytes(nbytes)}) would exceed max_delete {max_delete_text(limit)}"
    log.warning("cleanup %s: stopped, nothing deleted: %s", policy.name, guard)
    return guard


def bounded_note(policy, done: tuple[int, int], needed: tuple[int, int], goal: tuple[str, float],
                 dry_run: bool = False, whole: tuple[str, int, float] | None = None) -> str:
    """Non-empty when max_delete cut short a run that must free space (needed: what its need takes,
    done: what went, goal: ("low", ratio) or ("max_size", bytes)): what went, what is left to free,
    and the setting to raise; or, an emergency's unit taken whole past it (whole), that."""
    limit = policy.max_delete
    if limit is None or not exceeds(limit, *needed):
        return ""
    left = max(0, needed[1] - done[1])
    target = f"reach {goal[1]:.0%}" if goal[0] == "low" else f"get under max_size {format_bytes(int(goal[1]))}"
    went = "would go" if dry_run else "deleted"
    if whole is not None:
        note = whole_note(whole, limit, dry_run) + (f"; {format_bytes(left)} more to free to {target}, from the "
                                                    "next run on" if left else "")
        log.warning("cleanup %s: %s", policy.name, note)
        return note
    note = (f"max_delete {max_delete_text(limit)} reached: {done[0]} of about {needed[0]} files {went}, oldest "
            f"first; {format_bytes(left)} more to free to {target}; raise max_delete for this policy")
    log.warning("cleanup %s: %s", policy.name, note)
    return note
