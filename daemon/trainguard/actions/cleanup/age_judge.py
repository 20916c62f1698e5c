"""How the age and cache kinds judge one entry (the same rules in both passes), and which
directories their walk enters. Built once per run with the globs compiled: it runs per entry.

The compiled age loop (_agescan.c, driven by age_fast.py) applies make_judge's stat rules
too, for age policies: a rule changed here is changed there, and
tests/test_cleanup_fastpath.py compares the two on the same trees."""

from __future__ import annotations

import os
import stat as stat_mod
from dataclasses import dataclass
from typing import Callable

from trainguard.actions.cleanup import policies as sel
from trainguard.actions.cleanup import unittree
from trainguard.actions.cleanup.plan import Ctx
from trainguard.config import AgePolicy, CachePolicy

# judge(dir_fd, name, relpath, lstat, is_dir) -> (age timestamp, bytes, files, is_unit) or None
Judge = Callable[[int, str, str, os.stat_result, bool], "tuple[float, int, int, bool] | None"]


@dataclass(slots=True)
class Busy:
    """Set by the judge when a cache's lock file is held: the whole cache is left alone."""

    why: str = ""


def cache_kind(policy) -> sel.CacheKind | None:
    return sel.CACHE_KINDS[policy.type] if isinstance(policy, CachePolicy) else None


def age_fields(policy) -> tuple[str, ...]:
    """What "last used" means: the policy's age_by; for a cache, the newest of atime and mtime
    (a ctime bump from chmod or a backup tool is not a use)."""
    return tuple(policy.age_by) if isinstance(policy, AgePolicy) else ("atime", "mtime")


def make_judge(ctx: Ctx, busy: Busy | None) -> Judge:
    """A judge for ctx's policy. busy: pass 1 only, to notice held cache locks."""
    policy, kind = ctx.policy, cache_kind(ctx.policy)
    excluded, wanted = sel.globset(policy.exclude), sel.globset(policy.patterns)
    # The usual globs are name-only ("*.lock"; "*" for wanted): then one regex call, or none.
    ex_simple = excluded.path_match is None and not excluded.everything
    ex_name = excluded.name_match or (lambda _name: None)
    wanted_all = wanted.everything
    kind_exclude = kind.exclude if kind else ()
    locks = sel.globset(kind.lock_globs) if kind else None
    units = sel.globset(kind.unit_globs) if kind else None
    changed_after = ctx.now - policy.grace  # changed later than this: may still be being written
    age_by = age_fields(policy)
    by_mtime = age_by == ("mtime",)
    is_reg, is_lnk = stat_mod.S_ISREG, stat_mod.S_ISLNK
    skip, unverifiable = ctx.tally.skip, ctx.tools.open_files.unverifiable

    def judge(dir_fd: int, name: str, path: str, st: os.stat_result, is_dir: bool) -> tuple[float, int, int, bool] | None:
        if ((ex_name(name) if ex_simple else excluded(name, path))
                or (kind_exclude and sel.matches_any_part(path, kind_exclude))):
            if busy is not None and locks is not None and not is_dir and locks(name, path):
                if ctx.tools.open_files.is_open(st.st_dev, st.st_ino):
                    busy.why = f"in use: {path} is held by a process"
            return None
        if is_dir:
            if units is None or "/" in path or not units(name, path):
                return None
            return _judge_unit(ctx, dir_fd, name, path, st, changed_after)
        mode = st.st_mode
        if not (is_reg(mode) or is_lnk(mode)) or not (wanted_all or wanted(name, path)):
            return None
        if st.st_mtime > changed_after or st.st_ctime > changed_after:
            skip("grace", path)
            return None
        ts = st.st_mtime if by_mtime else sel.age_timestamp(st, age_by)
        if unverifiable(st) and (policy.older_than is None or ctx.now - ts >= policy.older_than):
            skip("unverifiable-open", path)  # due, but a process not inspected could hold it
            return None
        return ts, (st.st_blocks * 512 if st.st_nlink <= 1 else 0), 1, False

    return judge


def _judge_unit(ctx: Ctx, dir_fd: int, name: str, path: str, st: os.stat_result,
                changed_after: float) -> tuple[float, int, int, bool] | None:
    try:
        unit = unittree.measure_unit(dir_fd, name, st.st_dev, ctx.tools.hook)
    except OSError as exc:
        ctx.skip_error(path, exc)
        return None
    if unit.newest_change > changed_after:
        ctx.tally.skip("grace", path)
    elif unit.multi_linked:
        ctx.tally.skip("linked-elsewhere", path)  # e.g. a conda package hard-linked into an environment
    elif unit.problems:
        ctx.tally.skip("mount-point" if unit.mounts else "unreadable", path)
    elif ctx.tools.open_files.unverifiable(st) and (ctx.policy.older_than is None
                                                    or ctx.now - unit.newest_access >= ctx.policy.older_than):
        ctx.tally.skip("unverifiable-open", path)  # due, but a process not inspected could hold a file in it
    else:
        return unit.newest_access, unit.bytes, unit.files, True
    return None


def make_enters(policy) -> Callable[[str, str], bool]:
    """Which directories the age scan enters (excluded ones and cache units are not)."""
    kind = cache_kind(policy)
    excluded = sel.globset(policy.exclude)
    units = sel.globset(kind.unit_globs) if kind else None

    def enters(name: str, path: str) -> bool:
        if excluded(name, path):
            return False
        # Cache units are judged whole; a cache's own excluded directories (.locks) are
        # entered, so that held locks are seen, but nothing in them is ever a candidate.
        return units is None or "/" in path or not units(name, path)

    return enters
