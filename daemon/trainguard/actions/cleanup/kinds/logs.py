"""The `logs` cleanup policy: rotate growing training logs in place into compressed generations.

Trainers keep their log open, so the file cannot be renamed away (logrotate's `create`); it is
copied and then emptied in place (logrotate's `copytruncate`). Differences from logrotate:
- nothing is lost where the filesystem can cut a file's head (ext4, xfs): the copy stops at a
  block boundary and exactly the copied bytes are removed with fallocate(COLLAPSE_RANGE), so
  what the trainer writes meanwhile stays in the file. Elsewhere (tmpfs, NFS) the copy runs to
  end of file and the file is truncated at once: only lines written between the last read and
  the truncate (microseconds) are lost, where logrotate's copy-then-truncate loses everything
  written from the end of its copy to its truncate;
- a file held open for writing without O_APPEND (`python train.py > train.log`) is skipped:
  the writer's offset would stay where it was and turn the emptied file into a sparse one;
- binary content (event files, checkpoints: a NUL byte in the first 8 KiB) is never touched.
The same safety rules as every cleanup policy: roots checked (safety/roots.py), other
mounts below a root pruned, no symlink followed, every file opened relative to its directory.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from typing import Callable

from trainguard.actions.cleanup import selection as sel
from trainguard.actions.cleanup.engine import walker
from trainguard.actions.cleanup.kinds.logfile import O_APPEND, Rotated, is_binary, rotate_file, writers
from trainguard.actions.cleanup.record.audit import AuditLog
from trainguard.actions.cleanup.record.report import CleanupReport, Item, RootReport, describe
from trainguard.actions.cleanup.safety.roots import Root, UnsafeRoot, open_root
from trainguard.config import LogsPolicy
from trainguard.units import format_bytes

NEVER = ("events.out.tfevents.*", "*.pt", "*.pth", "*.ckpt", "*.safetensors", "*.bin", "*.gz", "*.zst", "*.xz")
log = logging.getLogger(__name__)


class _Tally:
    def __init__(self, on_item: Callable[[Item], None] | None):
        self.items: list[Item] = []
        self.skipped: dict[str, int] = {}
        self.on_item = on_item

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def add(self, item: Item) -> None:
        self.items.append(item)
        if self.on_item is not None:
            self.on_item(item)


def _candidates(policy: LogsPolicy, root_fd: int, dev: int, below: frozenset[str], tally: _Tally):
    wanted, excluded, never = sel.globset(policy.patterns), sel.globset(policy.exclude), sel.globset(NEVER)

    def descend(entry: walker.Entry) -> bool:
        return not excluded(entry.name, entry.path)

    for entry in walker.walk(root_fd, dev=dev, descend=descend, prune_paths=below,
                             on_problem=lambda p: tally.skip(p.reason)):
        st = entry.st
        if entry.is_dir or not wanted(entry.name, entry.path) or excluded(entry.name, entry.path):
            continue
        if not stat.S_ISREG(st.st_mode):
            tally.skip("symlink" if stat.S_ISLNK(st.st_mode) else "not-a-file")
        elif never(entry.name, entry.path):
            tally.skip("binary")
        elif st.st_size > policy.max_size:
            yield entry.path, st


def _rotate_root(policy: LogsPolicy, root: Root, tally: _Tally, dry_run: bool, proc_root: str) -> list[Rotated]:
    found = list(_candidates(policy, root.fd, root.dev, root.below, tally))
    held = writers({(st.st_dev, st.st_ino) for _, st in found}, proc_root) if found else {}
    done = []
    for relpath, st in found:
        if any(not flags & O_APPEND for _pid, flags in held.get((st.st_dev, st.st_ino), ())):
            tally.skip("writer-without-append")
            continue
        parent, _, name = relpath.rpartition("/")
        try:
            dir_fd = walker.open_beneath(root.fd, parent, root.dev, root.mnt)
        except OSError as exc:
            tally.skip(walker.classify_error(exc))
            continue
        try:
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:
            os.close(dir_fd)
            tally.skip(walker.classify_error(exc))
            continue
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode):
                tally.skip("replaced")
            elif is_binary(fd):
                tally.skip("binary")
            elif dry_run:
                done.append(Rotated(relpath, now.st_blocks * 512, 0, 0, 0, "dry-run"))
            else:
                done.append(rotate_file(dir_fd, name, relpath, fd, policy))
        except OSError as exc:
            tally.skip("no-space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else walker.classify_error(exc))
        finally:
            os.close(fd)
            os.close(dir_fd)
    return done


def rotate_logs(policy: LogsPolicy, *, trigger: str = "manual", dry_run: bool = False,
                on_item: Callable[[Item], None] | None = None, audit: AuditLog | None = None,
                proc_root: str = "/proc", homes: frozenset[str] | None = None,
                clock: Callable[[], float] = time.time) -> CleanupReport:
    """One run of a logs policy over all its roots; the report cleanup's alerts and CLI read."""
    started = clock()
    tally = _Tally(on_item)
    roots: list[RootReport] = []
    for where in policy.roots:
        try:
            root = open_root(where, homes, proc_root)
        except UnsafeRoot as exc:
            tally.skip("unsafe-root")
            roots.append(RootReport(where, "", note=str(exc)))
            continue
        try:
            done = _rotate_root(policy, root, tally, dry_run, proc_root)
        finally:
            os.close(root.fd)
        for r in done:
            path = os.path.join(root.path, r.relpath)
            saved = r.before if dry_run else r.saved
            reason = f"logs: above max_size {format_bytes(policy.max_size)}, "
            if dry_run:
                reason += "would be rotated"
            elif policy.keep:
                reason += f"rotated ({r.method}) into {format_bytes(r.generation)} compressed"
            else:
                reason += f"emptied ({r.method}; keep = 0)"
            tally.add(Item(path, saved, 1, reason, 0.0))
            if audit is not None and not dry_run:
                audit.record(policy.name, root.mount, path, saved, 0, reason)
        roots.append(RootReport(root.path, root.mount, len(done), sum(i.before if dry_run else i.saved for i in done)))
    if audit is not None and not dry_run:
        audit.flush()
    files, nbytes = sum(r.files for r in roots), sum(r.bytes for r in roots)
    report = CleanupReport(policy=policy.name, type=policy.type, trigger=trigger, dry_run=dry_run, started=started,
                           finished=clock(), roots=tuple(roots), files=files, bytes=nbytes,
                           skipped=dict(tally.skipped), items=tuple(tally.items), planned_files=files,
                           planned_bytes=nbytes)
    log.info("%s", describe(report))
    return report
