"""The cache units of an age pass (agepass.Pass): a whole model of the huggingface hub, a package of
pip's or conda's cache, judged by the newest use of anything inside it and deleted whole
(unittree), never entered file by file. Held when a file inside it is open, or could be open
by a process whose open files could not be read; within the same bounds as single files.
"""

from __future__ import annotations

import os

from trainguard.actions.cleanup.engine import unittree, walker
from trainguard.actions.cleanup.engine.aside import delete_aside
from trainguard.actions.cleanup.engine.bound import takes_whole
from trainguard.actions.cleanup.plan import full_path


class CacheUnits:
    """The unit rules of Pass; they use its counts, bounds, reports and context."""

    def unit(self, lst: walker.Listing, name: str) -> None:
        """A cache unit (a whole model, a package): judged by its newest use inside, deleted whole."""
        ctx, path = self.ctx, full_path(self.root, name)
        report = ctx.tally if self.reports else self.scratch
        try:
            unit = unittree.measure_unit(lst.fd, name, self.root.dev, self.root.mnt, ctx.tools.hook)
        except OSError as exc:
            report.skip_error(path, exc, walker.classify_error)
            return
        if unit.newest_change > self.rule.changed_after:
            self.scratch.skip("grace", path)
        elif unit.multi_linked:
            self.scratch.skip("linked-elsewhere", path)  # e.g. a conda package hard-linked into an environment
        elif unit.problems:
            self.scratch.skip("mount-point" if unit.mounts else "unreadable", path)
        elif (self.delete or not ctx.dry_run or not self.held(path, unit)) and not self.stopped:
            self.unit_due(lst, name, path, unit, ctx.now - unit.newest_access)

    def unit_due(self, lst: walker.Listing, name: str, path: str, unit: unittree.UnitStats, age: float) -> None:
        if not age >= self.rule.older_than:
            self.young += unit.files
            return
        if self.held_back(lst, name, path):
            return
        if not self.delete:
            self.files += unit.files
            self.bytes += unit.bytes
            if self.listed:
                self.gone_unit(lst, name, unit, age)
            return
        if 0 <= self.bound.need_bytes <= self.freed:
            self.stopped = True
        elif self.bound.fits(self.deleted + unit.files, self.freed + unit.bytes):
            self.remove(lst, name, path, unit, age)
        elif takes_whole(self.emergency, self.ctx.tally.files):
            self.ctx.take_whole(self.root, name, unit.files, lambda: self.remove(lst, name, path, unit, age))
        else:
            self.stopped = True

    def remove(self, lst: walker.Listing, name: str, path: str, unit: unittree.UnitStats, age: float) -> int:
        """Delete a due unit whole unless it is in use now; the bytes freed."""
        if self.held(path, unit):
            return 0
        try:
            st = os.stat(name, dir_fd=lst.fd, follow_symlinks=False)
            self.ctx.before_delete(name)
            if not delete_aside(self.ctx, self.root, lst.fd, name, st, path, unit):  # renamed aside, checked again
                return 0
        except OSError as exc:
            self.ctx.skip_error(path, exc)
            return 0
        self.files += unit.files
        self.bytes += unit.bytes
        self.freed += unit.bytes
        self.deleted += unit.files
        self.ctx.went(self.root, path, (unit.bytes, unit.files), self.reason, age, True)
        return unit.bytes

    def gone_unit(self, lst: walker.Listing, name: str, unit: unittree.UnitStats, age: float) -> None:
        if self.on_gone is not None:
            self.on_gone(lst, [(name, unit.bytes, age)], unit.files)

    def held_back(self, lst: walker.Listing, name: str, path: str) -> bool:
        """A due unit a process whose open files could not be read could hold (OpenFiles.hold_back)."""
        hold_back = getattr(self.ctx.tools.open_files, "hold_back", None)
        if hold_back is None:
            return False
        try:
            st = os.stat(name, dir_fd=lst.fd, follow_symlinks=False)
        except OSError:
            return True
        if hold_back(st):
            (self.ctx.tally if self.reports else self.scratch).skip("unverifiable-open", path)
            return True
        return False

    def held(self, path: str, unit: unittree.UnitStats) -> bool:
        if self.ctx.tools.open_files.any_open(unit.inodes):
            if self.reports:
                self.ctx.skip_open(path, unit.inodes)
            else:
                self.scratch.skip("open", path)
            return True
        return False
