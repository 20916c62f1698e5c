"""A guarded age run in one walk: count what is due and remember where, then delete only that.

max_delete means "nothing goes if more is due than this": the count must be complete before the
first unlink. The counting walk (agepass.Pass, listing what is due) therefore also remembers each
due name with its directory's path, inode and lstat, in compact strings; the deletion, once the
count is within the guard, reopens each directory below the root (walker.open_beneath: one
component at a time, no symlinks, same mount) and hands the remembered names to the same judge,
which lstats each one again just before its unlink, with the bound left. A directory that is not
the inode counted (renamed away, replaced) is not cleaned; one that leaves the root between two
batches is noticed before the next, as in a walk. No getdents, no stat of the young files, no
directory opened twice per level: the second walk's cost, minus what the count already learned.
Several directories are deleted at once, one a thread (_InOrder), their results taken in order.

Memory is bounded: past BUDGET bytes of remembered names the walk forgets them and the deletion is
a second walk (kinds/age.py: _delete_expired), as before this module.
"""

from __future__ import annotations

import os
from collections import deque

from trainguard.actions.cleanup.engine import agerules, walker
from trainguard.actions.cleanup.engine.agepass import Pass
from trainguard.actions.cleanup.engine.bound import Bound
from trainguard.actions.cleanup.plan import Ctx
from trainguard.actions.cleanup.safety.roots import Root

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
    order = _InOrder(p, p.threads() if bound.max_bytes < 0 else 1)
    try:
        for path, name, st, chunks in reversed(dirs):
            if chunks and not p.stopped:
                lst = open_counted(p, root, path, name, st)
                if lst is not None:
                    order.delete_in(lst, chunks)
            if remove_dirs and path:
                order.then(lambda path=path, name=name, st=st: _rmdir(p, parents, path, name, st))
        order.drain()
    finally:
        order.close()
        parents.close()
    return dict(p.scratch.skipped)


def open_counted(p: Pass, root: Root, path: str, name: str, st: os.stat_result) -> walker.Listing | None:
    """The counted directory, reopened below the root; None (reported) if it is not there."""
    if p.ctx.tools.hook is not None:
        p.ctx.tools.hook("open_dir", path)
    try:
        fd = walker.open_beneath(root.fd, path, root.dev, root.mnt)
    except OSError as exc:
        p.problem(walker.WalkProblem.of(path, exc))
        return None
    lst = walker.Listing(fd, path, name, st, None, walker.place_of(fd))
    lst.data = []
    if os.fstat(fd).st_ino != st.st_ino:
        p.problem(walker.moved(lst))
        os.close(fd)
        return None
    return lst


def _deleted_in(p: Pass, lst: walker.Listing, chunks: list[str], bound: Bound) -> list[agerules.Batch | None]:
    """Unlink the remembered names of one directory, batch by batch, within bound; a None after the
    batches: the directory left the root (checked before each batch), nothing more judged there.
    Nothing is counted here: this may run on a thread of its own (_InOrder)."""
    hook, got = p.ctx.tools.hook, []
    for joined in chunks:
        names = joined.split("\0")
        for start in range(0, len(names), CHUNK):
            if hook is not None:
                hook("batch", lst.path)
            if not walker.in_place(lst):
                return got + [None]
            batch = p.judge(lst, names[start:start + CHUNK], bound, threads=1)
            got.append(batch)
            if any(code == agerules.OVER_BOUND for _n, code, *_rest in batch.issues):
                return got  # the bound is reached: nothing more goes in this run
            bound = bound.after(batch.files, batch.bytes)
    return got


class _InOrder:
    """The deletion of several directories at once, each on one of `threads` threads, each result
    taken on this thread in the order given, as one thread deleting them in turn would take it
    (counts, audit rows, the next step queued with then()).

    max_delete stays a hard bound: a directory goes to a thread only if the names it holds fit in
    what the bound still allows, less what the directories in flight may take; else the ones in
    flight are taken first and it is deleted here, with the exact remainder (a bound in bytes: every
    directory here, since a size is only known from its lstat)."""

    def __init__(self, p: Pass, threads: int):
        self.p, self.threads = p, threads
        self.pool = None  # a ThreadPoolExecutor, from the first directory handed to a thread
        self.queue: deque = deque()  # in order: (listing, names reserved, future) or a step to run
        self.reserved = self.in_flight = 0

    def delete_in(self, lst: walker.Listing, chunks: list[str]) -> None:
        """Delete the remembered names of lst (its fd is closed once its result is taken, or on an error)."""
        n = sum(joined.count("\0") + 1 for joined in chunks)
        left = self.p.left().max_files
        if self.threads < 2 or 0 <= left < self.reserved + n:
            try:
                self.drain()  # may raise what a thread raised
                if not self.p.stopped:
                    self._take(lst, _deleted_in(self.p, lst, chunks, self.p.left()))
            finally:
                os.close(lst.fd)
            return
        try:
            if self.pool is None:
                from concurrent.futures import ThreadPoolExecutor  # a guarded deletion of many directories only

                self.pool = ThreadPoolExecutor(self.threads, "cleanup-delete")
            bound = Bound(-1 if left < 0 else n)  # the names it holds: reserved below
            future = self.pool.submit(_deleted_in, self.p, lst, chunks, bound)
        except BaseException:
            os.close(lst.fd)  # not queued: close() would not see it
            raise
        self.queue.append((lst, n, future))
        self.reserved += n
        self.in_flight += 1
        while self.in_flight > 2 * self.threads:
            self._next()

    def then(self, step) -> None:
        """Run step once every directory handed over before it is taken."""
        if self.queue:
            self.queue.append(step)
        else:
            step()

    def drain(self) -> None:
        while self.queue:
            self._next()

    def _next(self) -> None:
        item = self.queue.popleft()
        if callable(item):
            item()
            return
        lst, n, future = item
        self.reserved -= n
        self.in_flight -= 1
        try:
            self._take(lst, future.result())
        finally:
            os.close(lst.fd)

    def _take(self, lst: walker.Listing, got: list[agerules.Batch | None]) -> None:
        for batch in got:
            if batch is None:
                self.p.problem(walker.moved(lst))
            else:
                self.p.take(lst, batch)

    def close(self) -> None:
        """After an error: what the threads deleted is still taken (counted, audited) while taking
        works; nothing more is started. Every fd is closed."""
        taking = True
        for item in self.queue:
            if callable(item):
                continue
            lst, _n, future = item
            try:
                got = future.result()  # waits for its thread
                if taking:
                    self._take(lst, got)
            except Exception:  # the error being raised already says what failed
                taking = False
            finally:
                os.close(lst.fd)
        self.queue.clear()
        if self.pool is not None:
            self.pool.shutdown()


def _rmdir(p: Pass, parents: _Parents, path: str, name: str, st: os.stat_result) -> None:
    parent = parents.get(path.rpartition("/")[0])
    if parent is not None:
        gone = walker.Listing(-1, path, name, st, parent, None)
        gone.done = True
        p.rmdir(gone)


class _Parents:
    """The open parent of the directories being removed: siblings come one after another."""

    def __init__(self, root: Root):
        self.root, self.path, self.lst = root, None, None

    def get(self, path: str) -> walker.Listing | None:
        if path != self.path:
            self.close()
            self.path = path
            try:
                fd = walker.open_beneath(self.root.fd, path, self.root.dev, self.root.mnt)
            except OSError:
                return None  # gone or moved: nothing below it is removed
            self.lst = walker.Listing(fd, path, path.rpartition("/")[2], os.fstat(fd), None, walker.place_of(fd))
        return self.lst

    def close(self) -> None:
        if self.lst is not None:
            os.close(self.lst.fd)
            self.lst = None
