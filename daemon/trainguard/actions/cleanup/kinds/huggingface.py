"""The Hugging Face hub cache, revision-aware (what huggingface-cli delete-cache does by hand).

Layout (huggingface_hub's documented cache): <repo>/refs/<ref> holds a commit hash,
<repo>/snapshots/<commit>/... are symlinks into <repo>/blobs/<hash>. First, detached
revisions (snapshots no ref points to) go with the blobs only they use, when unused for
older_than, or, when space must be freed (a watermark, over max_size), oldest first as far as
the need takes them; then whole repos by last use, as the age kind judges cache units. A repo
with any file open or mapped by a process is never touched, nor one changed within grace.
Everything is opened relative to the root's fd, never through a symlink or a mount point.
"""

from __future__ import annotations

import os
import stat as stat_mod
from dataclasses import dataclass

from trainguard.actions.cleanup import selection as sel
from trainguard.actions.cleanup.engine import leftover, unittree, walker
from trainguard.actions.cleanup.engine.aside import delete_aside
from trainguard.actions.cleanup.engine.bound import takes_whole
from trainguard.actions.cleanup.kinds.age import AgeKind
from trainguard.actions.cleanup.plan import Ctx, Planned, full_path
from trainguard.actions.cleanup.safety.roots import Root
from trainguard.units import format_duration


@dataclass(frozen=True, slots=True)
class Detached:
    repo: str  # the repo directory's name below the root
    commit: str
    blobs: tuple[tuple[str, int, int], ...]  # (name, ino, bytes) used by no other snapshot
    bytes: int
    last_use: float


class HfKind:
    """Detached revisions first (plan and execute here), then whole repos (the age kind)."""

    def __init__(self) -> None:
        self.repos = AgeKind()

    def plan(self, ctx: Ctx, root: Root, need: int | None) -> Planned:
        repos = self.repos.plan(ctx, root, need)
        if repos.note:  # a held lock: leave the whole cache alone
            return repos
        plan = repos.data
        revs = sorted(_detached(ctx, root), key=lambda d: d.last_use)  # oldest first
        # Space to free (a watermark run, over max_size): detached revisions first, only what the need
        # takes; the repos (AgeKind, oldest first) then take what is left of it.
        taken = sel.oldest_until(revs, max(plan.need, plan.cap_need))
        if taken:
            plan.less(sum(d.bytes for d in taken), ctx.policy.older_than)
            repos = self.repos.planned(plan, need)
        due = [d for d in revs if need is None and d not in taken and _due(ctx, d)]  # a plain run's
        return Planned(repos.files + _files(due), repos.bytes + sum(d.bytes for d in due), repos.note,
                       (taken, due, repos), repos.need_files + _files(taken),
                       repos.need_bytes + sum(d.bytes for d in taken))

    def execute(self, ctx: Ctx, root: Root, planned: Planned, need: int | None) -> None:
        if planned.note:
            return
        taken, due, repos = planned.data
        for rev in taken + ([] if ctx.refused else due):
            if ctx.left().fits(1 + len(rev.blobs), rev.bytes):
                _delete_revision(ctx, root, rev)
            elif need is not None and takes_whole(rev in taken, ctx.tally.files):  # an emergency's first: whole
                ctx.take_whole(root, f"{rev.repo}@{rev.commit[:12]}", 1 + len(rev.blobs),
                               lambda r=rev: _delete_revision(ctx, root, r))
            else:
                break  # max_delete: no more revisions in this run
        self.repos.execute(ctx, root, repos, need)


def _files(revs: list[Detached]) -> int:
    return sum(1 + len(d.blobs) for d in revs)


def _due(ctx: Ctx, rev: Detached) -> bool:
    """A detached revision may still be used (pinned by commit hash): a plain run takes it when unused
    for older_than (a run that must free space takes the oldest first, whatever their age)."""
    older_than = ctx.policy.older_than
    return older_than is not None and ctx.now - rev.last_use >= older_than


def _detached(ctx: Ctx, root: Root):
    units = sel.globset(sel.CACHE_KINDS["huggingface-cache"].unit_globs)
    try:
        names = sorted(os.listdir(root.fd))
    except OSError as exc:
        ctx.skip_error(root.path, exc)
        return
    older_than = ctx.policy.older_than
    for name in names:
        if units(name, name) and name not in root.below:
            if older_than is not None and _whole_repo_due(ctx, root, name, older_than):
                continue  # the age kind takes the whole repo
            try:
                yield from _repo_detached(ctx, root, name)
            except OSError as exc:
                ctx.skip_error(full_path(root, name), exc)


def _whole_repo_due(ctx: Ctx, root: Root, name: str, older_than: float) -> bool:
    try:
        unit = unittree.measure_unit(root.fd, name, root.dev, root.mnt, ctx.tools.hook)
    except OSError:
        return False
    return ctx.now - unit.newest_access >= older_than


def _read_refs(fd: int, root: Root) -> set[str]:
    """Every commit hash a ref file below refs/ names (refs/pr/1 too)."""
    out = set()
    for entry in walker.walk(fd, dev=root.dev, on_problem=lambda p: None, mnt=root.mnt):
        if stat_mod.S_ISREG(entry.st.st_mode) and entry.st.st_size < 4096:
            with open(_open_noatime(fd, entry.path), encoding="ascii", errors="replace") as fh:
                out.add(fh.read().strip())
    return out


def _open_noatime(dir_fd: int, path: str) -> int:
    """Reading a ref must not look like a use of the repo (its atime is the last-use signal)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_NOATIME, dir_fd=dir_fd)
    except PermissionError:  # O_NOATIME needs the file's owner or CAP_FOWNER
        return os.open(path, flags, dir_fd=dir_fd)


def _snapshot_blobs(fd: int, root: Root) -> set[str]:
    """The blob names a snapshot's symlinks point to (../../blobs/<hash>, at any depth)."""
    out = set()
    for entry in walker.walk(fd, dev=root.dev, on_problem=lambda p: None, mnt=root.mnt):
        if stat_mod.S_ISLNK(entry.st.st_mode):
            parent, _, name = entry.path.rpartition("/")
            pfd = walker.open_beneath(fd, parent, root.dev, root.mnt)
            try:
                target = os.readlink(name, dir_fd=pfd)
            finally:
                os.close(pfd)
            if "/blobs/" in target:
                out.add(target.rpartition("/")[2])
    return out


def _repo_detached(ctx: Ctx, root: Root, name: str):
    repo = walker.open_beneath(root.fd, name, root.dev, root.mnt)
    try:
        snaps = walker.open_beneath(repo, "snapshots", root.dev, root.mnt)
    except OSError:
        os.close(repo)
        return
    try:
        try:
            refs_fd = walker.open_beneath(repo, "refs", root.dev, root.mnt)
        except OSError:
            refs = set()
        else:
            try:
                refs = _read_refs(refs_fd, root)
            finally:
                os.close(refs_fd)
        returning = _put_back(ctx, root, name, repo, snaps)
        uses = {}
        for commit in sorted(set(os.listdir(snaps)) - returning):
            cfd = walker.open_beneath(snaps, commit, root.dev, root.mnt)
            try:
                uses[commit] = _snapshot_blobs(cfd, root)
            finally:
                os.close(cfd)
        kept = set().union(*(b for c, b in uses.items() if c in refs)) if refs else set()
        detached = [c for c in uses if c not in refs]
        if not detached or not refs:  # no ref at all: the repo is judged whole, by the age kind
            return
        blobs_fd = walker.open_beneath(repo, "blobs", root.dev, root.mnt)
        try:
            for commit in detached:
                rev = _measure(ctx, root, name, commit, uses[commit] - kept, (snaps, blobs_fd))
                if rev is not None:
                    yield rev
        finally:
            os.close(blobs_fd)
    finally:
        os.close(snaps)
        os.close(repo)


def _put_back(ctx: Ctx, root: Root, name: str, repo: int, snaps: int) -> set[str]:
    """Revisions and blobs an interrupted deletion left under private names, put back under their own
    (engine/leftover.py): a ref may name that revision again, a revision may share that blob. In a dry
    run, the snapshots that would be put back."""
    at = full_path(root, name)
    try:
        blobs_fd = walker.open_beneath(repo, "blobs", root.dev, root.mnt)
    except OSError:
        pass
    else:
        try:
            leftover.put_back_all(blobs_fd, f"{at}/blobs", ctx.dry_run)
        finally:
            os.close(blobs_fd)
    return leftover.put_back_all(snaps, f"{at}/snapshots", ctx.dry_run)


def _measure(ctx: Ctx, root: Root, repo: str, commit: str, only_here: set[str], fds) -> Detached | None:
    snaps, blobs_fd = fds
    dev = root.dev
    unit = unittree.measure_unit(snaps, commit, dev, root.mnt, ctx.tools.hook)
    blobs, inodes = [], list(unit.inodes)
    last_use, newest_change = 0.0, unit.newest_change  # last use: its own blobs' atime/mtime
    unverifiable = False  # an uninspected process could hold one of its blobs
    for blob in sorted(only_here):
        try:
            st = os.stat(blob, dir_fd=blobs_fd, follow_symlinks=False)
        except OSError:
            continue
        if stat_mod.S_ISREG(st.st_mode) and st.st_dev == dev:
            blobs.append((blob, st.st_ino, sel.freed_bytes(st)))
            inodes.append((st.st_dev, st.st_ino))
            unverifiable = unverifiable or ctx.tools.open_files.unverifiable(st)
            last_use = max(last_use, st.st_atime, st.st_mtime)
            newest_change = max(newest_change, st.st_mtime, st.st_ctime)
    last_use = last_use or unit.newest_access
    path = full_path(root, f"{repo}/snapshots/{commit}")
    if unit.problems:
        ctx.tally.skip("mount-point" if unit.mounts else "unreadable", path)
    elif ctx.now - newest_change < ctx.policy.grace:
        ctx.tally.skip("grace", path)
    elif ctx.tools.open_files.any_open(inodes):
        ctx.skip_open(path, inodes)
    elif unverifiable:
        ctx.tally.skip("unverifiable-open", path)
    else:
        return Detached(repo, commit, tuple(blobs), sum(b for _n, _i, b in blobs), last_use)
    return None


def _delete_revision(ctx: Ctx, root: Root, rev: Detached) -> None:
    """Re-check and delete one detached revision: its snapshot directory, then its own blobs."""
    path = full_path(root, f"{rev.repo}/snapshots/{rev.commit}")
    reason = (f"huggingface-cache: detached revision {rev.commit[:12]} (no ref points to it), "
              f"unused for {format_duration(ctx.now - rev.last_use)}")
    try:
        repo_fd = walker.open_beneath(root.fd, rev.repo, root.dev, root.mnt)
    except OSError as exc:
        ctx.skip_error(path, exc)
        return
    try:
        if _recheck_open(ctx, root, rev, path):
            return
        snaps = walker.open_beneath(repo_fd, "snapshots", root.dev, root.mnt)
        try:
            st = os.stat(rev.commit, dir_fd=snaps, follow_symlinks=False)
            if not ctx.dry_run:
                unit = unittree.measure_unit(snaps, rev.commit, root.dev, root.mnt, ctx.tools.hook)
                ctx.before_delete(f"{rev.repo}/snapshots/{rev.commit}")
                if not delete_aside(ctx, root, snaps, rev.commit, st, path, unit):  # renamed aside, checked again
                    return
        finally:
            os.close(snaps)
        ctx.went(root, path, (0, 1), reason, ctx.now - rev.last_use, True)
        _delete_blobs(ctx, root, repo_fd, rev, reason)
    except OSError as exc:
        ctx.skip_error(path, exc)
    finally:
        os.close(repo_fd)


def _recheck_open(ctx: Ctx, root: Root, rev: Detached, path: str) -> bool:
    ctx.tools.open_files.refresh()
    inodes = [(root.dev, ino) for _n, ino, _b in rev.blobs]
    if ctx.tools.open_files.any_open(inodes):
        ctx.skip_open(path, inodes)
        return True
    return False


def _delete_blobs(ctx: Ctx, root: Root, repo_fd: int, rev: Detached, reason: str) -> None:
    blobs_fd = walker.open_beneath(repo_fd, "blobs", root.dev, root.mnt)
    try:
        for name, ino, nbytes in rev.blobs:
            path = full_path(root, f"{rev.repo}/blobs/{name}")
            try:
                st = os.stat(name, dir_fd=blobs_fd, follow_symlinks=False)
                if st.st_ino != ino:
                    ctx.tally.skip("replaced", path, "not the blob that was judged")
                    continue
                if not ctx.dry_run and not delete_aside(ctx, root, blobs_fd, name, st, path):
                    continue  # downloaded again, or opened, since it was judged: kept
                ctx.went(root, path, (nbytes, 1), reason, ctx.now - rev.last_use)
            except OSError as exc:
                ctx.skip_error(path, exc)
    finally:
        os.close(blobs_fd)
