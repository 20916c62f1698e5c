"""The age policy's one-pass delete and counting dry run, a batch of names at a time in C.

Where pass 1 of the age kind needs no per-entry state (a one-pass delete, or a dry run that
only counts), the per-entry work is the same for a million files: lstat, the stat rules,
unlink. _agescan.c does that for a batch of names with the GIL released; this module keeps
everything else in Python, in one place: which names are candidates at all (mount points
below the root, exclude globs, patterns), which directories are entered (opened by the
walker with all its checks), and every count, skip, report and audit row. The rules the C
loop applies are those of age_judge.make_judge, with the same numbers, built here from the
policy; tests run the same trees through both loops and compare.

Not used (kind_age's Python loop runs instead) when the extension was not built, or for a
policy that needs histograms (watermark runs, size caps) or per-entry marks (max_delete's
two passes). A test hook sees "batch" before each call, not the per-entry events
("judged", "before_delete") of the Python loop.
"""

from __future__ import annotations

import os

from trainguard.actions.cleanup import walker
from trainguard.actions.cleanup import policies as sel
from trainguard.actions.cleanup.age_judge import age_fields
from trainguard.actions.cleanup.guard import Root
from trainguard.actions.cleanup.plan import Ctx
from trainguard.config import AgePolicy

try:
    from trainguard.actions.cleanup import _agescan
except ImportError:  # installed without a C compiler: the Python loop does the same work
    _agescan = None

ENABLED = _agescan is not None  # tests turn it off to run the Python loop on the same trees
# The codes _agescan.c gives the entries it cannot just count.
STAT_ERROR, OTHER_DEV, OPEN, UNLINK_ERROR = 2, 3, 6, 8
READ_BYTES = 32768  # getdents64 buffer: up to ~1000 names per batch, so memory stays flat on any directory
_AGE_BITS = {"atime": 1, "mtime": 2, "ctime": 4}


def usable(ctx: Ctx, counting: bool) -> bool:
    """Whether this pass 1 can run batched: an age policy, deleting in one pass or only counting."""
    return ENABLED and isinstance(ctx.policy, AgePolicy) and counting and ctx.tools.open_files.hold_back is None


class AgeBatches:
    """Reads each listing of a pass-1 scan in batches (kind_age._Pass1.listing's contract)."""

    def __init__(self, ctx: Ctx, root: Root, plan, scratch: Ctx):
        policy = ctx.policy
        self.ctx, self.root, self.plan, self.scratch = ctx, root, plan, scratch
        self.excluded, self.wanted = sel.globset(policy.exclude), sel.globset(policy.patterns)
        self.delete = not ctx.dry_run
        self.reason = sel.age_reason(policy, False)
        fields = age_fields(policy)
        mask = 0 if fields == ("mtime",) else sum({_AGE_BITS[f] for f in fields})
        # The C loop's numbers, as make_judge uses them.
        self.rule = (root.opened.dev, mask, ctx.now, policy.older_than, ctx.now - policy.grace)

    def listing(self, lst: walker.Listing) -> None:
        """Judge the whole listing on its first visit; then hand out its subdirectories one by one."""
        if lst.pending is None:
            lst.pending = []
            before = (self.plan.expired_files, self.plan.expired_bytes)
            # lst.entries (a scandir of lst.fd) stays unread: the names come in getdents64-sized batches.
            while names := _agescan.read_names(lst.fd, READ_BYTES):
                self.batch(lst, names)
            os.lseek(lst.fd, 0, os.SEEK_SET)  # the offset is shared with the root's fd, which is read again later
            lst.pending.reverse()
            self.count_top_dir(lst, before)
        if lst.pending:
            lst.enter = lst.pending.pop()

    def candidates(self, lst: walker.Listing, names: list[str]) -> list[str]:
        """The names the C loop may judge: not a mount point below the root, not excluded."""
        prefix, below, excluded = lst.prefix, self.root.below, self.excluded
        if below or excluded.path_match is not None or excluded.everything:
            return [n for n in names if not (prefix + n in below or excluded(n, prefix + n))]
        if excluded.name_match is not None:  # the usual case: name globs only, one regex call per name
            is_excluded = excluded.name_match
            return [n for n in names if not is_excluded(n)]
        return names

    def batch(self, lst: walker.Listing, names: list[str]) -> None:
        prefix = lst.prefix
        names = self.candidates(lst, names)
        wanted = None if self.wanted.everything else bytes(self.wanted(n, prefix + n) for n in names)
        dev, mask, now, older_than, changed_after = self.rule
        if self.ctx.tools.hook is not None:
            self.ctx.tools.hook("batch", lst.path)
        dirs, issues, gone, files, nbytes, young, grace = _agescan.age_batch(
            lst.fd, names, wanted, dev, mask, now, older_than, changed_after,
            self.ctx.tools.open_files.inodes_on(dev), self.delete)
        plan = self.plan
        plan.expired_files += files
        plan.expired_bytes += nbytes
        plan.young += young
        if grace:  # a quiet reason: counted, never logged
            skipped = self.scratch.tally.skipped
            skipped["grace"] = skipped.get("grace", 0) + grace
        lst.pending.extend(dirs)  # excluded names are gone already: every directory left is entered
        for name, code, err, ino, nbytes in issues:
            self.issue(lst, name, code, err, ino, nbytes)
        if gone:
            self.ctx.went_files(self.root, self.dir_path(lst), gone, self.reason)

    def issue(self, lst: walker.Listing, name: str, code: int, err: int, ino: int, nbytes: int) -> None:
        path = self.dir_path(lst) + "/" + name
        if code == STAT_ERROR:
            self.scratch.tally.skip(walker.classify_error(OSError(err, "")), path, os.strerror(err))
        elif code == OTHER_DEV:
            self.scratch.tally.skip("other-filesystem", path, "on another filesystem")
        elif code == OPEN:
            self.ctx.skip_open(path, ((self.root.opened.dev, ino),))
        else:
            self.ctx.skip_error(path, OSError(err, os.strerror(err)))
        if self.delete and code in (OPEN, UNLINK_ERROR):  # due, though it stays: planned, as in the Python loop
            self.plan.expired_files += 1
            self.plan.expired_bytes += nbytes

    def dir_path(self, lst: walker.Listing) -> str:
        return self.root.path.rstrip("/") + "/" + lst.path if lst.path else self.root.path

    def count_top_dir(self, lst: walker.Listing, before: tuple[int, int]) -> None:
        """A counting dry run's top directories: what this listing would free."""
        plan = self.plan
        if not self.delete and plan.expired_files > before[0]:
            self.ctx.tally.top_add(self.dir_path(lst), plan.expired_bytes - before[1],
                                   plan.expired_files - before[0])

