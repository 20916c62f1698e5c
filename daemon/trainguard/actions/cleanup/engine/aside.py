"""Deleting a judged checkpoint, cache unit or blob by name without deleting what stands there now.

A name judged a moment ago can hold something else by the time it is deleted: `last.ckpt` or
`model.safetensors` saved again in place (written aside, renamed over the old one), a file inside a
unit re-created or opened since the /proc scan. So these deletions go as the age kinds' do
(quarantine.py), one entry at a time:

1. rename the name aside to a private name (never replacing anything): from now on nobody reaches
   the entry by its name, and a new save lands under the name, beside it;
2. check the private name holds the entry judged (quarantine.same; for a unit, the same files and
   nothing inside changed), and read /proc again: nothing has it open or mapped, no process that
   could not be inspected could, no kernel holder that cannot be identified could be it;
3. delete it (a unit: its tree, relative to the parent's fd), or rename it back (never replacing)
   and keep it.
"""

from __future__ import annotations

import os

from trainguard.actions.cleanup.engine import unittree
from trainguard.actions.cleanup.engine.quarantine import PREFIX, Changed, Quarantine
from trainguard.actions.cleanup.plan import Ctx
from trainguard.actions.cleanup.safety.roots import Root


def delete_aside(ctx: Ctx, root: Root, parent_fd: int, name: str, judged: os.stat_result, path: str,
                 unit: unittree.UnitStats | None = None) -> bool:
    """Delete name (a file, or with unit its measure as judged, a directory unit) in the three steps
    above; whether it went. What kept it is tallied (changed, open, in-use, mount-point)."""
    q = set_aside(ctx, parent_fd, name, judged, path)
    return q is not None and settle(ctx, root, parent_fd, q, judged, path, unit)


def set_aside(ctx: Ctx, parent_fd: int, name: str, judged: os.stat_result, path: str) -> Quarantine | None:
    """Step 1 and the identity check: the entry under a private name (the Quarantine holding it), or None
    when the name no longer held the entry judged (then put back and tallied as changed)."""
    q = Quarantine(parent_fd, atime=False, named=True)  # a crash leaves a name leftover.py can put back
    try:
        q.unlink(name, judged)
    except Changed as exc:
        _changed(ctx, path, exc.errno)
        return None
    return q


def settle(ctx: Ctx, root: Root, parent_fd: int, q: Quarantine, judged: os.stat_result, path: str,
           unit: unittree.UnitStats | None, refresh: bool = True) -> bool:
    """Steps 2 and 3 for what q holds: delete it, or put it back; whether it went. refresh=False: the
    caller read /proc after every entry it settles was set aside (one reading for several units)."""
    private = q.private
    why = _still_judged(ctx, root, parent_fd, private, judged, path, unit, refresh)
    if why:
        err = q.restore()
        if why == "changed" or err:
            _changed(ctx, path, err)
        return False
    if unit is None:
        q.release()
        if q.failed:
            _name, err, _ino = q.failed[0]
            raise OSError(err, os.strerror(err), path)
    else:
        try:
            unittree.remove_tree_at(parent_fd, private, root.dev, root.mnt, judged.st_ino)
        except OSError:
            q.restore()  # what is left of it goes back under its own name, where its owner looks
            raise
        q.forget()
    return True


def _still_judged(ctx: Ctx, root: Root, parent_fd: int, private: str, judged: os.stat_result, path: str,
                  unit: unittree.UnitStats | None, refresh: bool) -> str:
    """Why the entry under its private name may not go now ("" when it may): changed, or in use."""
    inodes = [(judged.st_dev, judged.st_ino)]
    if unit is not None:
        again = unittree.measure_unit(parent_fd, private, root.dev, root.mnt, ctx.tools.hook)
        if again.mounts:
            ctx.tally.skip("mount-point", path, "a mount point inside; this unit is never deleted")
            return "mount-point"
        if again.problems or sorted(again.inodes) != sorted(unit.inodes) or again.inside_change != unit.inside_change:
            return "changed"
        inodes = again.inodes
    of = ctx.tools.open_files
    if refresh:
        of.refresh()  # after the rename: whoever opened it since the last scan is seen now
    held = of.unknown(judged.st_dev, root.path, root.mnt)
    if held:
        ctx.tally.skip("in-use", path, held)
        return "in-use"
    if of.any_open(inodes):
        ctx.skip_open(path, inodes)
        return "open"
    if of.unverifiable(judged):
        ctx.tally.skip("unverifiable-open", path)
        return "unverifiable-open"
    return ""


def _changed(ctx: Ctx, path: str, err: int) -> None:
    detail = "replaced or changed between judging and deleting, so kept"
    if err:
        detail += f"; it could not be put back ({os.strerror(err)}) and is left under a {PREFIX}* name"
    ctx.tally.skip("changed", path, detail)
