"""The cache units of an age pass (agepass.Pass): a whole model of the huggingface hub, a package of
pip's or conda's cache, judged by the newest use of anything inside it and deleted whole
(unittree), never entered file by file. Held when a file inside it is open, or could be open
by a process whose open files could not be read; within the same bounds as single files.
"""

from __future__ import annotations

import os

from trainguard.actions.cleanup import selection as sel
from trainguard.actions.cleanup.engine import leftover, unittree, walker
from trainguard.actions.cleanup.engine.aside import set_aside
from trainguard.actions.cleanup.engine.aside import settle as settle_aside
from trainguard.actions.cleanup.engine.bound import takes_whole
from trainguard.actions.cleanup.plan import full_path
from trainguard.sources.fs import usage_from_statvfs


class CacheUnits:
    """The unit rules of Pass; they use its counts, bounds, reports and context."""

    def leftover(self, lst: walker.Listing, name: str) -> None:
        """A unit left under a private name by an interrupted deletion: put back and judged under its own
        name, else judged whole as it stands (engine/leftover.py); one put back already is not judged again."""
        if name in self.returned:
            return
        back = leftover.put_back(lst.fd, name, full_path(self.root, name), self.ctx.dry_run)
        if back is None:
            self.unit(lst, name)
        elif not self.ctx.dry_run:
            self.returned.add(back)
            if self.units(back, back) and not sel.matches_any_part(back, self.kind_exclude):
                self.unit(lst, back)

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
            self.aside(lst, name, path, unit, age)
        elif takes_whole(self.emergency, self.ctx.tally.files + sum(p[4].files for p in self.pending)):
            used = usage_from_statvfs(os.fstatvfs(self.root.fd)).used_ratio
            self.aside(lst, name, path, unit, age, used)  # an emergency's first unit: whole (bound.py)
        else:
            self.stopped = True

    def aside(self, lst: walker.Listing, name: str, path: str, unit: unittree.UnitStats, age: float,
              whole: float | None = None) -> None:
        """Set a due unit aside (engine/aside.py) unless it is in use now; it counts against the bound
        until settle() deletes it or puts it back."""
        if self.held(path, unit):
            return
        try:
            st = os.stat(name, dir_fd=lst.fd, follow_symlinks=False)
            self.ctx.before_delete(name)
            q = set_aside(self.ctx, lst.fd, name, st, path)
        except OSError as exc:
            self.ctx.skip_error(path, exc)
            return
        if q is not None:
            self.pending.append((q, st, name, path, unit, age, whole))
            self.deleted += unit.files
            self.freed += unit.bytes

    def settle(self, lst: walker.Listing) -> None:
        """The units a batch set aside: one reading of /proc after the last was renamed, then each is
        checked again and deleted, or put back (and no longer counts against the bound)."""
        if not self.pending:
            return
        ctx, pending, self.pending = self.ctx, self.pending, []
        ctx.tools.open_files.refresh()
        for q, st, name, path, unit, age, whole in pending:
            try:
                went = settle_aside(ctx, self.root, lst.fd, q, st, path, unit, refresh=False)
            except OSError as exc:
                ctx.skip_error(path, exc)
                went = False
            if not went:
                self.deleted -= unit.files
                self.freed -= unit.bytes
                continue
            self.files += unit.files
            self.bytes += unit.bytes
            ctx.went(self.root, path, (unit.bytes, unit.files), self.reason, age, True)
            if whole is not None:
                ctx.whole = (name, unit.files, whole)

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
