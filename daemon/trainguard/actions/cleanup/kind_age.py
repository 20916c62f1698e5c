"""The age kind (and the caches, which are age with units, locks and a size cap): pass 1.

Two passes, because max_delete must be checked against the whole plan before anything
goes. Pass 1 (here) stats every entry once and keeps, per directory holding candidates,
a small record: the directory's identity and change times and one bit per listing
position that was a candidate; counts and an age histogram stand for the rest, so
memory stays flat. Pass 2 (age_delete.py) reopens only those directories and re-stats
only the marked entries, re-judging each from that fresh lstat with every rule
(identity, filesystem, grace, age, open files) just before the unlink. A dry run never
does pass 2: pass 1's counts are its answer (the entries are listed with --verbose).

A one-pass delete and a counting dry run keep no per-entry state, so an age policy's pass 1
reads their listings in batches through the compiled loop instead (age_fast.py), with the
same rules; the loop below runs where that is not built or a pass needs marks or histograms.
"""

from __future__ import annotations

import math
import os
import stat as stat_mod
from dataclasses import dataclass, field

from trainguard.actions.cleanup import age_delete, age_fast, unittree, walker
from trainguard.actions.cleanup import policies as sel
from trainguard.actions.cleanup.age_judge import Busy, make_enters, make_judge
from trainguard.actions.cleanup.guard import Root
from trainguard.actions.cleanup.plan import Ctx, Planned
from trainguard.actions.cleanup.report import Tally
from trainguard.config import AgePolicy


@dataclass(slots=True)
class AgePlan:
    """Pass-1 result: counts and histograms, no per-file state."""

    expired_files: int = 0
    expired_bytes: int = 0
    hist: sel.AgeHistogram = field(default_factory=sel.AgeHistogram)  # eligible entries by age
    total_bytes: int = 0  # cache size (for max_size)
    cap_min_age: float = math.inf  # entries at least this old go to get under max_size
    cap_need: int = 0
    young: int = 0  # eligible but newer than older_than
    inline_done: bool = False  # deleted during the scan (one pass): pass 2 only removes empty dirs
    problems: dict[str, int] = field(default_factory=dict)  # walk problems seen while planning
    dirs: list[age_delete.DirMarks] = field(default_factory=list)  # where pass 2 looks again, in post-order


class AgeKind:
    def plan(self, ctx: Ctx, root: Root, need: int | None) -> Planned:
        policy = ctx.policy
        remove_dirs = isinstance(policy, AgePolicy) and policy.remove_empty_dirs and need is None
        busy = Busy()
        # One pass (judge and delete in the same walk) where nothing must be weighed first:
        # no max_delete guard, no size cap, no watermark, no dry run.
        inline = (isinstance(policy, AgePolicy) and need is None and policy.max_delete is None
                  and not ctx.dry_run)
        plan = _scan(ctx, root, remove_dirs, busy, (inline, need is not None))
        if busy.why:
            return Planned(note=busy.why)
        if plan.young:
            ctx.tally.skipped["young"] = ctx.tally.skipped.get("young", 0) + plan.young
        if need is None:
            files, nbytes = plan.expired_files, plan.expired_bytes
            if plan.cap_need:
                _age, cf, cb = plan.hist.cutoff_for(plan.cap_need)
                files, nbytes = max(files, cf), max(nbytes, cb)
        else:
            _age, files, nbytes = plan.hist.cutoff_for(need)
        return Planned(files, nbytes, data=plan)

    def execute(self, ctx: Ctx, root: Root, planned: Planned, need: int | None) -> None:
        plan: AgePlan = planned.data
        if plan.inline_done:
            if plan.dirs:
                age_delete.run_pass2(ctx, root, plan, need)  # only empty directories are left to remove
        elif ctx.dry_run and ctx.tally.on_item is None:
            ctx.tally.files += planned.files  # pass 1's count is the answer: no second walk
            ctx.tally.bytes += planned.bytes
        else:
            age_delete.run_pass2(ctx, root, plan, need)
        for reason, n in plan.problems.items():  # seen in either pass: count once
            ctx.tally.skipped[reason] = max(ctx.tally.skipped.get(reason, 0), n)


def _scan(ctx: Ctx, root: Root, remove_dirs: bool, busy: Busy, mode: tuple[bool, bool]) -> AgePlan:
    """mode: (inline: delete during the scan, watermark: a byte count must be met)."""
    policy, o = ctx.policy, root.opened
    inline = mode[0]
    ctx.tools.open_files.refresh()
    p1 = _Pass1(ctx, root, busy, mode)
    for lst in walker.scan(o.fd, dev=o.dev, on_problem=p1.problem, hook=ctx.tools.hook, mnt=o.mnt):
        try:
            (p1.batches or p1).listing(lst)
        except OSError as exc:  # reading the directory failed (e.g. removed under us)
            p1.problem(walker.WalkProblem(lst.path or ".", walker.classify_error(exc), exc.strerror or ""))
            lst.enter = None
        if lst.enter is None:
            _plan_dir(p1.plan, lst, remove_dirs, ctx.now, policy.older_than)
    plan = p1.plan
    plan.inline_done = inline
    plan.problems = dict(p1.scratch.tally.skipped)
    if p1.all_hist is not None and plan.total_bytes > policy.max_size:
        plan.cap_need = plan.total_bytes - policy.max_size
        plan.cap_min_age, _f, _b = p1.all_hist.cutoff_for(plan.cap_need)
    return plan


class _Pass1:
    """Pass 1's state, shared by every listing of one root."""

    def __init__(self, ctx: Ctx, root: Root, busy: Busy, mode: tuple[bool, bool]):
        policy = ctx.policy
        inline, watermark = mode
        self.ctx, self.root, self.inline, self.prefix = ctx, root, inline, root.path.rstrip("/") + "/"
        # Pass 2 needs marks, unless this pass deletes or a dry run only counts.
        self.marking = not inline and not (ctx.dry_run and ctx.tally.on_item is None)
        self.reason = sel.age_reason(policy, False)
        self.now, self.below, self.plan = ctx.now, root.below, AgePlan()
        self.all_hist = sel.AgeHistogram() if getattr(policy, "max_size", None) is not None else None
        self.older_than = policy.older_than
        # A size cap may take entries younger than older_than: mark every eligible one then.
        self.mark_from = -math.inf if self.all_hist is not None or self.older_than is None else self.older_than
        self.hist = self.plan.hist if watermark or self.all_hist is not None else None  # cutoffs need it
        self.scratch = Ctx(policy, Tally(0, None), ctx.tools, ctx.dry_run, ctx.now)  # pass 2 counts skips again
        self.judge, self.enters = make_judge(self.scratch, busy), make_enters(policy)
        counting = not self.marking and self.hist is None and self.all_hist is None
        self.batches = age_fast.AgeBatches(ctx, root, self.plan, self.scratch) if age_fast.usable(ctx, counting) else None

    def problem(self, p: walker.WalkProblem) -> None:
        self.scratch.tally.skip(p.reason, p.path, p.detail)

    def listing(self, lst: walker.Listing) -> None:
        """The hot loop over one listing: one lstat per entry (fstatat on the directory fd), no
        per-entry objects beyond the stat result. Stops early (lst.enter set) to descend."""
        now, below, judge, enters, plan = self.now, self.below, self.judge, self.enters, self.plan
        all_hist, older_than, mark_from, skip = self.all_hist, self.older_than, self.mark_from, self.scratch.tally.skip
        dev, hist, marking, inline = lst.st.st_dev, self.hist, self.marking, self.inline
        is_dir_mode, freed = stat_mod.S_ISDIR, sel.freed_bytes
        order_mul, order_mask = walker.ORDER_MUL, walker.ORDER_MASK
        fd, prefix, pos, marks, order, dry = lst.fd, lst.prefix, lst.pos, lst.marks, lst.order, self.ctx.dry_run
        open_keys = self.ctx.tools.open_files.keys()  # a dry run's count checks open files too
        expired_before = (plan.expired_files, plan.expired_bytes)
        try:
            for dirent in lst.entries:
                pos += 1
                if marking:
                    order = (order * order_mul ^ dirent.inode()) & order_mask  # walker.listing_order
                name = dirent.name
                path = prefix + name
                if below and path in below:
                    continue  # a mount point: never entered nor judged
                try:
                    st = dirent.stat(follow_symlinks=False)
                except OSError as exc:
                    skip(walker.classify_error(exc), path, exc.strerror or "")
                    continue
                if st.st_dev != dev:
                    skip("other-filesystem", path, "on another filesystem")
                    continue
                is_dir = is_dir_mode(st.st_mode)
                judged = judge(fd, name, path, st, is_dir)
                if judged is None:
                    if is_dir and enters(name, path):
                        lst.enter = (name, st.st_ino)
                        return
                    if not is_dir:
                        plan.total_bytes += freed(st)
                    continue
                age_ts, nbytes, files, is_unit = judged
                age = now - age_ts
                if dry and (is_unit or (st.st_dev, st.st_ino) in open_keys) and self.held(fd, name, path, st, is_unit):
                    continue  # a dry run's count is final: what is open now would be kept
                plan.total_bytes += nbytes
                if all_hist is not None:
                    all_hist.add(age, nbytes, files)
                if older_than is None or age >= older_than:
                    if hist is not None:
                        hist.add(age, nbytes, files)
                    if older_than is not None:
                        plan.expired_files += files
                        plan.expired_bytes += nbytes
                else:
                    plan.young += files
                if age >= mark_from:
                    if inline:
                        self.delete_now(fd, name, path, st, nbytes, age)
                    elif marking:
                        marks = _mark(marks, pos)
        finally:
            lst.pos, lst.marks, lst.order = pos, marks, order
            self._count_top_dir(lst, expired_before)

    def _count_top_dir(self, lst: walker.Listing, before: tuple[int, int]) -> None:
        """A counting dry run's top directories: what this listing would free."""
        plan = self.plan
        if self.ctx.dry_run and not self.marking and plan.expired_files > before[0]:
            self.ctx.tally.top_add(self.prefix + lst.path if lst.path else self.root.path,
                                   plan.expired_bytes - before[1], plan.expired_files - before[0])

    def held(self, fd: int, name: str, relpath: str, st, is_unit: bool) -> bool:
        of = self.ctx.tools.open_files
        inodes = unittree.measure_unit(fd, name, st.st_dev).inodes if is_unit else ((st.st_dev, st.st_ino),)
        if of.any_open(inodes):
            self.ctx.skip_open(self.prefix + relpath, inodes)
            return True
        return False

    def delete_now(self, fd: int, name: str, relpath: str, st, nbytes: int, age: float) -> None:
        """One-pass delete of a file just judged from its lstat: open-file check, then unlink
        relative to the directory fd (a name swapped for a symlink meanwhile: the link goes,
        never its target)."""
        ctx, path = self.ctx, self.prefix + relpath
        hook = ctx.tools.hook
        if hook is not None:
            hook("judged", relpath)
        if ctx.tools.open_files.is_open(st.st_dev, st.st_ino):
            ctx.skip_open(path, ((st.st_dev, st.st_ino),))
            return
        try:
            if hook is not None:
                hook("before_delete", relpath)
            os.unlink(name, dir_fd=fd)
        except OSError as exc:
            ctx.skip_error(path, exc)
            return
        ctx.went(self.root, path, (nbytes, 1), self.reason, age)


def _mark(marks: bytearray | None, pos: int) -> bytearray:
    if marks is None:
        marks = bytearray()
    byte = pos >> 3
    if byte >= len(marks):
        marks.extend(bytes(byte + 1 - len(marks)))
    marks[byte] |= 1 << (pos & 7)
    return marks


def _plan_dir(plan: AgePlan, lst: walker.Listing, remove_dirs: bool, now: float, older_than: float | None) -> None:
    """A directory fully read in pass 1: remember it if pass 2 has anything to do there."""
    st = lst.st
    # Reading a directory bumps its atime, so directories are aged by mtime/ctime only.
    rmdir = bool(remove_dirs and lst.path and now - max(st.st_mtime, st.st_ctime) >= older_than)
    if lst.marks or rmdir:
        plan.dirs.append(age_delete.DirMarks(lst.path, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, lst.pos,
                                             lst.order, bytes(lst.marks or b""), rmdir))
