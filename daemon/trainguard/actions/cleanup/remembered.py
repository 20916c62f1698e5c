"""A guarded age run in one walk: count what is due and remember where, then delete only that.

max_delete means "nothing goes if more is due than this": the count must be complete before the
first unlink. The counting walk (age_fast.Pass, listing what is due) therefore also remembers each
due name with its directory's path, inode and lstat, in compact strings; the deletion, once the
count is within the guard, reopens each directory below the root (walker.open_beneath: one
component at a time, no symlinks, same mount) and hands the remembered names to the same judge,
which lstats each one again just before its unlink, with the bound left. A directory that is not
the inode counted (renamed away, replaced) is not cleaned; one that leaves the root between two
batches is noticed before the next, as in a walk. No getdents, no stat of the young files, no
directory opened twice per level: the second walk's cost, minus what the count already learned.

Memory is bounded: past BUDGET bytes of remembered names the walk forgets them and the deletion is
a second walk (kind_age._delete), as before this module.
"""

from __future__ import annotations

import os

from trainguard.actions.cleanup import agerules, walker
from trainguard.actions.cleanup.age_fast import Pass
from trainguard.actions.cleanup.agerules import Bound
from trainguard.actions.cleanup.guard import Root
from trainguard.actions.cleanup.plan import Ctx

BUDGET = 16 << 20  # bytes of remembered names and directories, per root
CHUNK = 1000  # names judged per batch: the bound, the audit and the place checks go this often
_DIR_COST = 400  # a directory's path, lstat and list, roughly


class Remembering(Pass):
    """The counting pass of a guarded age run that also remembers what is due."""

    def __init__(self, ctx: Ctx, root: Root, older_than: float, remove_dirs: bool):
        super().__init__(ctx, root, older_than, reports=False, listed=True)
        self.on_gone = self.due
        self.rmdir_old = remove_dirs
        # [relpath, name in parent, lstat before cleaning, due names "\0"-joined per batch], walk order
        self.dirs: list[list] | None = []
        self.size = 0
        self.here: list = []

    def begin(self, lst: walker.Listing) -> None:
        super().begin(lst)
        self.here = [lst.path, lst.name, lst.st, []]
        if self.dirs is not None:
            self.dirs.append(self.here)

    def end(self, lst: walker.Listing) -> None:
        super().end(lst)
        if self.dirs is None:
            return
        if not self.here[3] and not self.may_remove(lst.st):
            self.dirs.pop()  # nothing to do there: not kept
        else:
            self.size += _DIR_COST + len(lst.path)
            self.check_budget()

    def due(self, _lst: walker.Listing, gone: list[tuple[str, int, float]], _files: int = 1) -> None:
        self.remember([name for name, _b, _a in gone])

    def issue(self, lst: walker.Listing, name: str, code: int, err: int, ino: int, nbytes: int) -> None:
        if code in (agerules.OPEN, agerules.HELD_BACK) and self.dirs is not None:
            self.remember([name])  # judged again when deleting: if due and still held, reported with its path
        else:
            super().issue(lst, name, code, err, ino, nbytes)

    def remember(self, names: list[str]) -> None:
        if self.dirs is None:
            return
        names = "\0".join(names)
        self.here[3].append(names)
        self.size += len(names) + 64
        self.check_budget()

    def check_budget(self) -> None:
        if self.size > BUDGET:
            self.dirs = None  # too much to remember: the deletion walks again

    def may_remove(self, st: os.stat_result) -> bool:
        """An empty directory is removed if it was old before it was cleaned (Pass.rmdir's rule)."""
        return self.rmdir_old and self.aged_dir(st)


def delete_remembered(ctx: Ctx, root: Root, dirs: list[list], older_than: float, bound: Bound,
                      remove_dirs: bool) -> dict[str, int]:
    """Delete what the counting pass remembered, within bound; children before their parents, so
    a directory emptied here can go. Returns the quiet skips seen."""
    p = Pass(ctx, root, older_than, delete=True, bound=bound, remove_dirs=remove_dirs)
    ctx.tools.open_files.refresh()  # what is open now, not when the count began
    parents = _Parents(root)
    try:
        for path, name, st, chunks in reversed(dirs):
            if chunks and not p.stopped:
                _delete_in(p, root, path, name, st, chunks)
            if remove_dirs and path:
                parent = parents.get(path.rpartition("/")[0])
                if parent is not None:
                    gone = walker.Listing(-1, path, name, st, parent, None)
                    gone.done = True
                    p.rmdir(gone)
    finally:
        parents.close()
    return dict(p.scratch.skipped)


def _delete_in(p: Pass, root: Root, path: str, name: str, st: os.stat_result, chunks: list[str]) -> None:
    hook = p.ctx.tools.hook
    if hook is not None:
        hook("open_dir", path)
    try:
        fd = walker.open_beneath(root.opened.fd, path, root.opened.dev)
    except OSError as exc:
        p.problem(walker.WalkProblem.of(path, exc))
        return
    try:
        lst = walker.Listing(fd, path, name, st, None, walker.place_of(fd))
        lst.data = []
        if os.fstat(fd).st_ino != st.st_ino:
            p.problem(walker.moved(lst))
            return
        for joined in chunks:
            names = joined.split("\0")
            for start in range(0, len(names), CHUNK):
                if p.stopped:
                    return
                if hook is not None:
                    hook("batch", path)
                if not walker.in_place(lst):
                    p.problem(walker.moved(lst))
                    return
                p.batch(lst, names[start:start + CHUNK])
    finally:
        os.close(fd)


class _Parents:
    """The open parent of the directories being removed: siblings come one after another."""

    def __init__(self, root: Root):
        self.root, self.path, self.lst = root, None, None

    def get(self, path: str) -> walker.Listing | None:
        if path != self.path:
            self.close()
            self.path = path
            try:
                fd = walker.open_beneath(self.root.opened.fd, path, self.root.opened.dev)
            except OSError:
                return None  # gone or moved: nothing below it is removed
            self.lst = walker.Listing(fd, path, path.rpartition("/")[2], os.fstat(fd), None, walker.place_of(fd))
        return self.lst

    def close(self) -> None:
        if self.lst is not None:
            os.close(self.lst.fd)
            self.lst = None
