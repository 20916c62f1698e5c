"""The age kind's pass 2: revisit the directories pass 1 marked, re-judge each marked entry from
a fresh lstat with every rule, and delete it relative to its directory's fd (never by path)."""

from __future__ import annotations

import errno
import math
import os
import stat as stat_mod
from dataclasses import dataclass

from trainguard.actions.cleanup import policies as sel
from trainguard.actions.cleanup import unittree, walker
from trainguard.actions.cleanup.age_judge import make_judge
from trainguard.actions.cleanup.guard import Root, reached
from trainguard.actions.cleanup.plan import Ctx, full_path
from trainguard.units import format_bytes


@dataclass(frozen=True, slots=True)
class DirMarks:
    """A directory pass 2 revisits: what it was in pass 1 and which listing positions were candidates."""

    path: str  # relative to the root, "" for the root
    ino: int
    mtime_ns: int  # changed mtime or ctime: entries were added, removed or renamed since
    ctime_ns: int
    count: int  # entries listed
    order: int  # walker.listing_order over them: catches changes within one timestamp tick
    marks: bytes  # bit n set: the n-th entry listed (counting from 1) was a candidate
    rmdir: bool  # old enough to be removed once empty (remove_empty_dirs)


def run_pass2(ctx: Ctx, root: Root, plan, need: int | None) -> None:
    """Delete what pass 1 found due. A dry run comes here only to list the entries (--verbose)."""
    _Pass2(ctx, root, plan, need).run()


class _Pass2:
    def __init__(self, ctx: Ctx, root: Root, plan, need: int | None):
        policy = ctx.policy
        self.ctx, self.root, self.plan, self.need = ctx, root, plan, need
        if need is not None:
            min_age, _f, _b = plan.hist.cutoff_for(need)
            # Histogram buckets are ~3 % wide: never let one reach below older_than.
            self.min_age = max(min_age, policy.older_than or 0.0)
        else:
            self.min_age = policy.older_than if policy.older_than is not None else math.inf
        self.cap_left = plan.cap_need  # bytes a size cap still has to take
        self.freed = 0
        self.reason = sel.age_reason(policy, need is not None)
        cap = format_bytes(getattr(policy, "max_size", 0) or 0)
        self.cap_reason = f"{policy.type}: over max_size {cap}, least recently used first"
        self.judge = make_judge(ctx, None)

    def run(self) -> None:
        o = self.root.opened
        chain = walker.DirChain(o.fd, o.dev, self.ctx.tools.hook)
        try:
            for rec in self.plan.dirs:  # in pass 1's post-order: a directory after its subdirectories
                try:
                    fd, dst = chain.open(rec.path)
                except OSError as exc:
                    self.ctx.skip_error(full_path(self.root, rec.path), exc)
                    continue
                if dst.st_ino != rec.ino:
                    self.ctx.tally.skip("replaced", full_path(self.root, rec.path), "not the directory that was judged")
                    continue
                everything = (dst.st_mtime_ns, dst.st_ctime_ns) != (rec.mtime_ns, rec.ctime_ns)
                if (rec.marks or everything) and self.in_dir(fd, rec, None if everything else rec.marks):
                    return
                if rec.rmdir:
                    # After a one-pass scan the directory changed by its own deletions: age it as pass 1 saw it.
                    seen = max(rec.mtime_ns, rec.ctime_ns) / 1e9 if self.plan.inline_done else max(dst.st_mtime, dst.st_ctime)
                    self.remove_empty_dir(chain, rec.path, seen)
        finally:
            chain.close()

    def in_dir(self, fd: int, rec: DirMarks, marks: bytes | None) -> bool:
        """Re-judge the marked entries (all of them if marks is None) and delete those still due.
        True: the watermark run is done."""
        nmarks = len(marks) if marks is not None else 0
        order_mul, order_mask = walker.ORDER_MUL, walker.ORDER_MASK
        pos = order = 0
        try:
            with os.scandir(fd) as entries:
                for dirent in entries:
                    pos += 1
                    if marks is not None:
                        order = (order * order_mul ^ dirent.inode()) & order_mask  # walker.listing_order
                        if not ((pos >> 3) < nmarks and marks[pos >> 3] >> (pos & 7) & 1):
                            continue
                    if self.one(fd, rec, dirent):
                        return True
        except OSError as exc:  # reading the directory failed
            self.ctx.skip_error(full_path(self.root, rec.path), exc)
            return False
        if marks is not None and (pos, order) != (rec.count, rec.order):
            # Listed differently than in pass 1 (a change within one timestamp tick):
            # the marks may have pointed elsewhere, so judge every entry once more.
            return self.in_dir(fd, rec, None)
        return False

    def one(self, fd: int, rec: DirMarks, dirent: os.DirEntry) -> bool:
        name = dirent.name
        relpath = f"{rec.path}/{name}" if rec.path else name
        if relpath in self.root.below:
            return False
        path = full_path(self.root, relpath)
        try:
            st = dirent.stat(follow_symlinks=False)
        except OSError as exc:
            self.ctx.skip_error(path, exc)
            return False
        if st.st_dev != self.root.opened.dev:
            self.ctx.tally.skip("other-filesystem", path, "on another filesystem")
            return False
        judged = self.judge(fd, name, relpath, st, stat_mod.S_ISDIR(st.st_mode))
        if judged is None:
            return False
        age_ts, nbytes, files, is_unit = judged
        age = self.ctx.now - age_ts
        by_cap = age < self.min_age
        if by_cap and (self.cap_left <= 0 or age < self.plan.cap_min_age):
            return False  # not expired; a cache above max_size still loses its least recently used
        if self.need is not None and reached(self.root.opened, self.need, self.freed, self.ctx.dry_run,
                                             self.ctx.policy.low):
            return True
        if self.held(fd, name, st, is_unit, path) or not self.delete(fd, name, st, is_unit, relpath):
            return False
        self.ctx.went(self.root, path, (nbytes, files), self.cap_reason if by_cap else self.reason, age, is_unit)
        self.freed += nbytes
        if by_cap:
            self.cap_left -= nbytes
        return False

    def held(self, fd: int, name: str, st: os.stat_result, is_unit: bool, path: str) -> bool:
        of = self.ctx.tools.open_files
        inodes = unittree.measure_unit(fd, name, st.st_dev, self.ctx.tools.hook).inodes if is_unit else [(st.st_dev, st.st_ino)]
        if of.any_open(inodes):
            self.ctx.skip_open(path, inodes)
            return True
        return False

    def delete(self, fd: int, name: str, st: os.stat_result, is_unit: bool, relpath: str) -> bool:
        if self.ctx.dry_run:
            return True
        try:
            self.ctx.before_delete(relpath)
            if is_unit:
                unittree.remove_tree_at(fd, name, st.st_dev, st.st_ino)
            else:
                os.unlink(name, dir_fd=fd)
            return True
        except OSError as exc:
            self.ctx.skip_error(full_path(self.root, relpath), exc)
            return False

    def remove_empty_dir(self, chain: walker.DirChain, relpath: str, changed: float) -> None:
        # changed: the directory's mtime/ctime before its contents were cleaned; reading a
        # directory bumps its atime, so directories are aged by mtime/ctime only.
        ctx = self.ctx
        if ctx.dry_run or ctx.now - changed < ctx.policy.older_than:
            return
        try:
            os.rmdir(relpath.rpartition("/")[2], dir_fd=chain.parent_fd)  # the kernel refuses a non-empty directory
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                ctx.skip_error(full_path(self.root, relpath), exc)
            return
        chain.forget_last()
        if ctx.tools.audit is not None:
            ctx.tools.audit.record(ctx.policy.name, self.root.mount, full_path(self.root, relpath) + "/", 0, 0,
                                   "empty directory")
        ctx.tally.dirs += 1
