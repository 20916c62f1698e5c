"""The checkpoints kind: pattern-matched files and checkpoint-* units, kept per run directory
(selection.select_checkpoints), optionally only when mirrored (mirrorcheck), deleted oldest first."""

from __future__ import annotations

import dataclasses
import os
import stat as stat_mod

from trainguard.actions.cleanup import selection as sel
from trainguard.actions.cleanup.engine import leftover, unittree, walker
from trainguard.actions.cleanup.engine.aside import delete_aside
from trainguard.actions.cleanup.engine.bound import takes_whole
from trainguard.actions.cleanup.engine.quarantine import PREFIX
from trainguard.actions.cleanup.guard import reached
from trainguard.actions.cleanup.plan import Ctx, Planned, full_path
from trainguard.actions.cleanup.safety.inuse import in_grace
from trainguard.actions.cleanup.safety.roots import Root


class CheckpointsKind:
    def plan(self, ctx: Ctx, root: Root, need: int | None) -> Planned:
        ctx.tools.open_files.refresh()
        held = ctx.tools.open_files.unknown(root.dev, root.path, root.mnt)
        if held:  # the kernel holds a file that could be here and cannot be identified (kernel_holders.py)
            return Planned(note=f"in use: {held}")
        items, left = [], []
        for item in _scan(ctx, root):
            (left if isinstance(item, sel.Candidate) else items).append(item)
        cands = sorted(sel.select_checkpoints(root.path, items, ctx.policy, ctx.now) + left, key=lambda c: c.age_ts)
        kept = sum(1 for i in items if not i.busy) - len(cands)
        if kept > 0:
            ctx.tally.skipped["kept"] = ctx.tally.skipped.get("kept", 0) + kept
        if ctx.policy.only_if_mirrored and cands:
            cands = _mirrored(ctx, root, cands)
        if need is None:  # a plain run: every candidate, all or nothing under max_delete
            return Planned(sum(c.files for c in cands), sum(c.bytes for c in cands), data=cands)
        chosen = sel.oldest_until(cands, need)  # a watermark run: what reaching low takes, oldest first
        return Planned(data=cands, need_files=sum(c.files for c in chosen), need_bytes=sum(c.bytes for c in chosen))

    def execute(self, ctx: Ctx, root: Root, planned: Planned, need: int | None) -> None:
        if need is None and ctx.refused:
            return
        freed = 0
        for cand in planned.data:  # oldest first
            if need is not None and reached(root, need, freed, ctx.dry_run, ctx.policy.low):
                return
            if ctx.left().fits(cand.files, cand.bytes):
                freed += _delete_one(ctx, root, cand)
            elif takes_whole(need is not None, ctx.tally.files):  # an emergency's first checkpoint: whole
                freed += ctx.take_whole(root, cand.relpath, cand.files, lambda c=cand: _delete_one(ctx, root, c))
            else:
                return  # max_delete: a watermark run goes no further (a plain one never gets here)


def _scan(ctx: Ctx, root: Root):
    policy = ctx.policy
    excluded, units, wanted = sel.globset(policy.exclude), sel.globset(policy.dir_patterns), sel.globset(policy.patterns)

    def descend(entry: walker.Entry) -> bool:
        return not (excluded(entry.name, entry.path) or units(entry.name, entry.path) or entry.name.startswith(PREFIX))

    def problem(p: walker.WalkProblem) -> None:
        ctx.tally.skip(p.reason, p.path, p.detail)

    returned: set[tuple[int, int]] = set()
    for entry in walker.walk(root.fd, dev=root.dev, descend=descend, prune_paths=root.below, mnt=root.mnt,
                             on_problem=problem, hook=ctx.tools.hook):
        if (entry.st.st_dev, entry.st.st_ino) in returned:
            continue  # put back below: the listing may show it again under its name
        put_back = entry.name.startswith(PREFIX) and not entry.post
        if put_back:
            entry = _put_back(ctx, root, entry)
            if not isinstance(entry, walker.Entry):
                if entry is not None:
                    yield entry
                continue
            returned.add((entry.st.st_dev, entry.st.st_ino))
        if excluded(entry.name, entry.path):
            continue
        item = None
        if entry.is_dir:
            if units(entry.name, entry.path):
                item = _unit_item(ctx, root, entry)
        elif stat_mod.S_ISREG(entry.st.st_mode) and wanted(entry.name, entry.path):
            item = _file_item(ctx, entry)
        if item is not None:
            # Just put back (renamed into place now): judged as a save in progress, never deleted in the
            # run that restored it, nor counted among the kept, whatever the grace.
            yield dataclasses.replace(item, busy=True) if put_back else item


def _put_back(ctx: Ctx, root: Root, entry: walker.Entry) -> walker.Entry | sel.Candidate | None:
    """A private name left by an interrupted deletion (engine/leftover.py): put back, the entry under its
    own name, to be judged as any; else the leftover as a candidate, or None (a dry run that would put it
    back; a unit that cannot be measured)."""
    path = full_path(root, entry.path)
    parent = entry.path.rpartition("/")[0]
    name = leftover.put_back(entry.dir_fd, entry.name, path, ctx.dry_run)
    if name is not None:
        if ctx.dry_run:
            return None
        try:
            st = os.stat(name, dir_fd=entry.dir_fd, follow_symlinks=False)
        except OSError as exc:
            ctx.skip_error(path, exc)
            return None
        return entry._replace(name=name, path=f"{parent}/{name}" if parent else name, st=st)
    item = _unit_item(ctx, root, entry) if entry.is_dir else _file_item(ctx, entry)
    if item is None:
        return None
    return sel.Candidate(root.path, item.relpath, item.dev, item.ino, item.bytes, item.files, item.is_unit,
                         item.mtime, "left under a private name by an interrupted deletion")


def _unit_item(ctx: Ctx, root: Root, entry: walker.Entry) -> sel.CheckpointItem | None:
    try:
        unit = unittree.measure_unit(entry.dir_fd, entry.name, root.dev, root.mnt, ctx.tools.hook)
    except OSError as exc:
        ctx.skip_error(entry.path, exc)
        return None
    if unit.mounts:
        ctx.tally.skip("mount-point", entry.path, "a mount point inside; this unit is never deleted")
        return None
    busy = (ctx.now - unit.newest_change < ctx.policy.grace or unit.problems > 0
            or ctx.tools.open_files.any_open(unit.inodes))
    st = entry.st
    return sel.CheckpointItem(entry.path.rpartition("/")[0], entry.path, entry.name, sel.parse_step(entry.name),
                              st.st_mtime, unit.bytes, unit.files, True, st.st_dev, st.st_ino, busy)


def _file_item(ctx: Ctx, entry: walker.Entry) -> sel.CheckpointItem:
    st = entry.st
    busy = in_grace(st, ctx.now, ctx.policy.grace) or ctx.tools.open_files.is_open(st.st_dev, st.st_ino)
    return sel.CheckpointItem(entry.path.rpartition("/")[0], entry.path, entry.name, sel.parse_step(entry.name),
                              st.st_mtime, sel.freed_bytes(st), 1, False, st.st_dev, st.st_ino, busy)


def _mirrored(ctx: Ctx, root: Root, cands: list[sel.Candidate]) -> list[sel.Candidate]:
    name = ctx.policy.only_if_mirrored
    mirror = ctx.tools.mirrors.get(name)
    if mirror is None:
        for cand in cands:
            ctx.tally.skip("not-mirrored", cand.relpath, f"mirror {name!r} is not known here")
        return []
    from trainguard.actions.cleanup.kinds import mirrorcheck  # a child process on the share: only when asked for

    return mirrorcheck.only_mirrored(cands, root, mirror, ctx.tally, ctx.tools.mirror_timeout)


def _delete_one(ctx: Ctx, root: Root, cand: sel.Candidate) -> int:
    """Re-check one candidate from a fresh lstat and delete it; the bytes freed (0: skipped)."""
    parent, _, name = cand.relpath.rpartition("/")
    path = full_path(root, cand.relpath)
    try:
        pfd = walker.open_beneath(root.fd, parent, root.dev, root.mnt)
    except OSError as exc:
        ctx.skip_error(path, exc)
        return 0
    try:
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        if (st.st_dev, st.st_ino) != (cand.dev, cand.ino):
            ctx.tally.skip("replaced", path, "not the entry that was judged")
            return 0
        unit = _recheck(ctx, root, pfd, name, st, cand, path)
        now = ctx.tools.clock()
        if unit is None:
            return 0
        sized = (unit.bytes, unit.files) if cand.is_unit else (sel.freed_bytes(st), 1)
        if not ctx.dry_run:
            ctx.before_delete(cand.relpath)
            # Renamed aside, checked again, then deleted: a checkpoint saved again under the same name
            # (last.ckpt) or opened since the scan is kept (engine/aside.py).
            if not delete_aside(ctx, root, pfd, name, st, path, unit if cand.is_unit else None):
                return 0
        ctx.went(root, path, sized, cand.reason, now - cand.age_ts, cand.is_unit)
        return sized[0]
    except OSError as exc:
        ctx.skip_error(path, exc)
        return 0
    finally:
        os.close(pfd)


def _recheck(ctx: Ctx, root: Root, pfd: int, name: str, st: os.stat_result, cand: sel.Candidate,
             path: str) -> unittree.UnitStats | bool | None:
    """Grace, open files and mount points just before the delete: a unit's measure (a file: True),
    or None to skip."""
    of, now = ctx.tools.open_files, ctx.tools.clock()
    if cand.is_unit:
        unit = unittree.measure_unit(pfd, name, root.dev, root.mnt, ctx.tools.hook)
        of.refresh()  # just before the delete
        if of.unknown(st.st_dev, root.path, root.mnt):
            ctx.tally.skip("in-use", path, of.unknown(st.st_dev, root.path, root.mnt))
        elif now - unit.newest_change < ctx.policy.grace:
            ctx.tally.skip("grace", path)
        elif unit.problems:
            ctx.tally.skip("mount-point" if unit.mounts else "unreadable", path)
        elif of.any_open(unit.inodes):
            ctx.skip_open(path, unit.inodes)
        elif of.unverifiable(st):
            ctx.tally.skip("unverifiable-open", path)
        else:
            return unit
        return None
    of.refresh()
    if of.unknown(st.st_dev, root.path, root.mnt):
        ctx.tally.skip("in-use", path, of.unknown(st.st_dev, root.path, root.mnt))
    elif in_grace(st, now, ctx.policy.grace):
        ctx.tally.skip("grace", path)
    elif of.is_open(st.st_dev, st.st_ino):
        ctx.skip_open(path, [(st.st_dev, st.st_ino)])
    elif of.unverifiable(st):
        ctx.tally.skip("unverifiable-open", path)
    else:
        return True
    return None
