"""One pass of the age engine over one root: walker.scan, each directory judged in batches by the
age rules (agerules: the compiled judge, or the same rules in Python), everything else here in
Python: which names are candidates at all (mount points below the root, exclude globs, patterns,
a cache's own files), cache units (judged whole: cacheunits.py) and held locks, the bounds, and every
count, skip, report and audit row. kinds/age.py decides which passes a run makes; a count judges a
directory's subdirectories on several threads (ahead.py).

A pass counts (a plan, a dry run; `listed` also hands back each due entry, for the oldest a need takes or a
listing) or deletes (due from `older_than`, within a Bound). Before each batch the directory's
place below the root is checked again: one that left it is not judged further. A test hook
sees "batch" (relative directory) before each batch; both judges call it with "before_delete"
(relative path) just before each deletion, the Python judge also with "judged" before its last checks.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod
from itertools import filterfalse

from trainguard.actions.cleanup import selection as sel
from trainguard.actions.cleanup.engine import agerules, ahead, walker
from trainguard.actions.cleanup.engine.agerules import Rule
from trainguard.actions.cleanup.engine.bound import Bound
from trainguard.actions.cleanup.engine.cacheunits import CacheUnits
from trainguard.actions.cleanup.engine.quarantine import PREFIX as PRIVATE
from trainguard.actions.cleanup.guard import reached
from trainguard.actions.cleanup.plan import Ctx, full_path
from trainguard.actions.cleanup.record.report import Tally
from trainguard.actions.cleanup.safety.roots import Root
from trainguard.config import AgePolicy, CachePolicy

ENABLED = agerules._agescan is not None  # tests turn it off to run the Python judge on the same trees
READ_BYTES = walker.READ_BYTES


def rule_for(ctx: Ctx, root: Root, older_than: float) -> Rule:
    policy = ctx.policy
    fields = policy.age_by if isinstance(policy, AgePolicy) else ("atime", "mtime")  # a cache: last use
    return Rule(root.dev, agerules.age_mask(fields), ctx.now, older_than, ctx.now - policy.grace)


class Pass(CacheUnits):
    """One scan of one root. Totals in files/bytes/young; quiet skips in scratch (the caller merges)."""

    def __init__(self, ctx: Ctx, root: Root, older_than: float, *, delete: bool = False, reports: bool = True,
                 listed: bool = False, bound: Bound = Bound(), remove_dirs: bool = False):
        policy = ctx.policy
        self.ctx, self.root, self.delete, self.reports, self.listed = ctx, root, delete, reports, listed
        self.rule, self.bound, self.remove_dirs = rule_for(ctx, root, older_than), bound, remove_dirs
        self.scratch = Tally(0, None)
        self.files = self.bytes = self.young = 0
        self.deleted = self.freed = 0  # within this pass, against the bound
        self.busy = ""  # a cache's lock is held: the whole cache is left alone
        self.stopped = False  # the bound or the watermark is reached
        self.reason = sel.age_reason(policy, bound.need_bytes >= 0 and isinstance(policy, AgePolicy))
        self.excluded, self.wanted = sel.globset(policy.exclude), sel.globset(policy.patterns)
        kind = sel.CACHE_KINDS[policy.type] if isinstance(policy, CachePolicy) else None
        self.kind_exclude = kind.exclude if kind else ()
        self.locks = sel.globset(kind.lock_globs) if kind else None
        self.units = sel.globset(kind.unit_globs) if kind else None
        self.watermark = False  # need_bytes is a watermark's: the filesystem at low is enough too
        self.emergency = False  # a watermark run: its first unit goes whole even past max_delete (bound.py)
        self.pending: list = []  # cache units set aside, settled after one reading of /proc (cacheunits.py)
        self.returned: set[str] = set()  # units put back under their names (the listing may show them again)
        self.on_gone = None  # listed: called with (listing, [(name, bytes, age)], files each) as they come
        self.ahead: ahead.Ahead | None = None
        self.before = (0, 0)  # files and bytes when the directory being listed was entered

    def run(self) -> None:
        root, ctx = self.root, self.ctx
        ctx.tools.open_files.refresh()
        held = ctx.tools.open_files.unknown(root.dev, root.path, root.mnt)
        if held:  # the kernel holds a file here whose inode its filesystem did not tell (kernel_holders.py)
            self.busy = f"in use: {held} could not be identified (its filesystem does not answer)"
            return
        # A count judges subdirectories on several threads (ahead.py); a walk that deletes never does.
        if not self.delete and self.threads() > 1:
            self.ahead = ahead.Ahead(self, agerules.THREADS, READ_BYTES)
        try:
            for lst in walker.scan(root.fd, dev=root.dev, on_problem=self.problem, hook=ctx.tools.hook, mnt=root.mnt,
                                   post=self.remove_dirs):
                if lst.done:
                    self.rmdir(lst)
                elif not self.stopped and not self.busy:
                    self.listing(lst)
        finally:
            if self.ahead is not None:
                self.ahead.close()

    def threads(self) -> int:
        """Threads this pass may judge directories on: one for the Python judge (its hooks race one
        entry at a time), for a cache (units, locks) and when some processes' fds could not be read."""
        if ENABLED and self.units is None and getattr(self.ctx.tools.open_files, "hold_back", None) is None:
            return agerules.THREADS
        return 1

    def problem(self, p: walker.WalkProblem) -> None:
        self.scratch.skip(p.reason, full_path(self.root, p.path), p.detail)

    def listing(self, lst: walker.Listing) -> None:
        """All batches of one directory on its first visit; then its subdirectories, one a visit."""
        if lst.data is False:
            return
        if lst.data is None:
            lst.data = []
            self.begin(lst)
            self.batches(lst)
            self.end(lst)
            if lst.data and self.ahead is not None and not self.busy:
                lst.data = self.ahead.count(lst, lst.data)
        if lst.data and not self.stopped and not self.busy:
            lst.enter = lst.data.pop()

    def batches(self, lst: walker.Listing) -> None:
        try:
            while not self.stopped and not self.busy:
                names = lst.read(READ_BYTES)
                if not names:
                    break
                if self.ctx.tools.hook is not None:
                    self.ctx.tools.hook("batch", lst.path)
                if not walker.in_place(lst):  # the last check before the batch is judged
                    self.problem(walker.moved(lst))
                    lst.data = False  # left alone: not judged further, nor removed when empty
                    return
                self.batch(lst, names)
        except OSError as exc:  # reading the directory failed (e.g. removed under us)
            self.problem(walker.WalkProblem.of(lst.path, exc))
        lst.data.reverse()

    def begin(self, lst: walker.Listing) -> None:
        """A directory's first visit starts (before its batches)."""
        self.before = (self.files, self.bytes)

    def end(self, lst: walker.Listing) -> None:
        """A directory's own batches are all judged (lst.data False: it left the root)."""
        files, nbytes = self.before
        if lst.data is not False and not self.delete and not self.listed and self.reports and self.files > files:
            self.ctx.tally.top_add(self.dir_path(lst), self.bytes - nbytes, self.files - files)

    def candidates(self, lst: walker.Listing, names: list[str]) -> tuple[list[str], bytes | None]:
        """The names the judge may see (not a mount point below the root, not excluded), and which
        of them the patterns want (None: all). A held lock among them makes the cache busy."""
        prefix, below, excluded = lst.prefix, self.root.below, self.excluded
        if self.locks is not None:
            self.check_locks(lst, names)
        if below or excluded.path_match is not None or excluded.everything:
            names = [n for n in names if not (prefix + n in below or excluded(n, prefix + n))]
        elif excluded.name_match is not None:  # the usual case: name globs only, one regex call per name
            names = list(filterfalse(excluded.name_match, names))
        if self.kind_exclude:  # a cache's own files (.locks, version.txt): entered, never candidates
            if sel.matches_any_part(lst.path, self.kind_exclude):
                return names, bytes(len(names))
            return names, bytes(not sel.matches_any_part(n, self.kind_exclude) and self.wanted(n, prefix + n)
                                for n in names)
        if self.wanted.everything:
            return names, None
        # A private name left by an interrupted deletion (quarantine.py) is judged whatever the patterns say.
        return names, bytes(self.wanted(n, prefix + n) or n.startswith(PRIVATE) for n in names)

    def check_locks(self, lst: walker.Listing, names: list[str]) -> None:
        of = self.ctx.tools.open_files
        for name in names:
            path = lst.prefix + name
            if self.locks(name, path) and (self.excluded(name, path) or sel.matches_any_part(path, self.kind_exclude)):
                try:
                    st = os.stat(name, dir_fd=lst.fd, follow_symlinks=False)
                except OSError:
                    continue
                if not stat_mod.S_ISDIR(st.st_mode) and of.is_open(st.st_dev, st.st_ino):
                    self.busy = f"in use: {path} is held by a process"

    def batch(self, lst: walker.Listing, names: list[str]) -> None:
        self.take(lst, self.judge(lst, names, self.left() if self.delete else self.bound))

    def left(self) -> Bound:
        """What the bound still allows this pass to unlink."""
        return self.bound.after(self.deleted, self.freed)

    def judge(self, lst: walker.Listing, names: list[str], bound: Bound,
              threads: int = agerules.THREADS) -> agerules.Batch:
        """One batch of lst's names judged (deleting: unlinked within bound); nothing counted yet."""
        names, wanted = self.candidates(lst, names)
        hook = self.ctx.tools.hook
        of = self.ctx.tools.open_files
        dev = self.rule.dev
        return agerules.judge_batch(
            lst.fd, names, wanted, self.rule, of.inodes_on(dev), self.delete, bound, self.listed, ENABLED,
            is_open=lambda ino: of.is_open(dev, ino), hook=None if hook is None else lambda e, n: hook(e, lst.prefix + n),
            hold_back=getattr(of, "hold_back", None), threads=threads)  # hold_back: processes whose fds could not be read

    def take(self, lst: walker.Listing, got: agerules.Batch) -> None:
        """One judged batch: its counts, its subdirectories (lst.data), its issues and what went."""
        self.files += got.files
        self.bytes += got.bytes
        self.young += got.young
        if got.grace:  # a quiet reason: counted, never logged
            self.scratch.skipped["grace"] = self.scratch.skipped.get("grace", 0) + got.grace
        for name, ino in got.dirs:
            if self.units is not None and lst.parent is None and (name.startswith(PRIVATE) or name in self.returned):
                self.leftover(lst, name)  # a unit an interrupted deletion left aside (engine/leftover.py)
            elif self.units is None or lst.parent is not None or not self.units(name, name):
                lst.data.append((name, ino))  # excluded names are gone already: every directory left is entered
            elif not sel.matches_any_part(name, self.kind_exclude):
                self.unit(lst, name)  # a cache unit is judged whole, never entered (nor one of the cache's own)
        self.settle(lst)
        for issue in got.issues:
            self.issue(lst, *issue)
        if got.gone:
            self.gone(lst, got.gone)

    def gone(self, lst: walker.Listing, gone: list[tuple[str, int, float]]) -> None:
        if self.delete:
            self.deleted += len(gone)
            self.freed += sum(b for _n, b, _a in gone)
            self.ctx.went_files(self.root, self.dir_path(lst), gone, self.reason)
            need = self.bound.need_bytes
            if need >= 0 and (self.freed >= need or self.watermark and reached(self.root, need, self.freed,
                                                                               False, self.ctx.policy.low)):
                self.stopped = True  # freed what was needed (a watermark: or the filesystem is at low)
        elif self.on_gone is not None:
            self.on_gone(lst, gone)

    def issue(self, lst: walker.Listing, name: str, code: int, err: int, ino: int, nbytes: int) -> None:
        path = self.dir_path(lst) + "/" + name
        ctx = self.ctx
        if code == agerules.STAT_ERROR:
            self.scratch.skip(walker.classify_error(OSError(err, "")), path, os.strerror(err))
        elif code == agerules.OTHER_DEV:
            self.scratch.skip("other-filesystem", path, "on another filesystem")
        elif code == agerules.CHANGED:  # renamed over (or written) between judging and deleting: kept
            detail = "replaced or changed between judging and deleting, so kept"
            if err:
                detail += f"; it could not be put back ({os.strerror(err)}) and is left under a {PRIVATE}* name"
            ctx.tally.skip("changed", path, detail)
        elif code == agerules.OVER_BOUND:
            self.stopped = True  # the bound is reached: nothing more goes in this run
            if self.bound.need_bytes < 0:
                ctx.tally.skip("max-delete", path, "more became due than the guard allowed when the run was counted")
        elif code == agerules.HELD_BACK:
            (ctx.tally if self.reports else self.scratch).skip("unverifiable-open", path)
        elif code == agerules.OPEN and not self.reports:
            self.scratch.skip("open", path)
        elif code == agerules.OPEN:
            ctx.skip_open(path, ((self.rule.dev, ino),))
        else:
            ctx.skip_error(path, OSError(err, os.strerror(err)))
        if self.delete and code in (agerules.OPEN, agerules.UNLINK_ERROR):  # due, though it stays: planned
            self.files += 1
            self.bytes += nbytes

    def rmdir(self, lst: walker.Listing) -> None:
        """A directory the pass finished: removed if it is empty now and was old before it was cleaned
        (aged by mtime/ctime only: reading a directory bumps its atime)."""
        ctx = self.ctx
        if ctx.dry_run or not self.aged_dir(lst.st):
            return
        if lst.data is False or not walker.in_place(lst.parent):
            return  # it left the root, or its parent did
        try:
            if os.stat(lst.name, dir_fd=lst.parent.fd, follow_symlinks=False).st_ino != lst.st.st_ino:
                return  # not the directory that was cleaned
            os.rmdir(lst.name, dir_fd=lst.parent.fd)  # the kernel refuses a non-empty directory
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                ctx.skip_error(full_path(self.root, lst.path), exc)
            return
        if ctx.tools.audit is not None:
            ctx.tools.audit.record(ctx.policy.name, self.root.mount, full_path(self.root, lst.path) + "/", 0, 0,
                                   "empty directory")
        ctx.tally.dirs += 1

    def aged_dir(self, st: os.stat_result) -> bool:
        return self.ctx.now - max(st.st_mtime, st.st_ctime) >= self.rule.older_than

    def dir_path(self, lst: walker.Listing) -> str:
        return full_path(self.root, lst.path)
