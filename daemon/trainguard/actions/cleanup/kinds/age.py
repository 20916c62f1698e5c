"""The age kind (and the caches, which are age with units, locks and a size cap): which passes of
the age engine (engine/agepass.Pass) a run makes. Every pass is one scan of the root judging each entry
from a fresh lstat with every rule just before it is counted or unlinked; between two passes nothing
is kept per file but a guarded run's due names (remembered.py, bounded), so memory stays flat.

- max_delete = false, no watermark, no dry run: one pass, judging and deleting.
- a max_delete guard: a counting pass that remembers what is due (remembered.py), then, if the
  guard allows it, the deletion of only that, bounded by max_delete: never more than the guard
  allowed, even if more became due in between. Past remembered.BUDGET, a second (deleting) walk.
- a dry run: the counting pass is the answer.
- a watermark run or a size cap: a counting pass that keeps the oldest entries the need takes
  (oldest.py: at most what max_delete allows, in bounded memory), then the deletion of exactly those,
  oldest first, stopping once the need is freed. A plain run of a capped cache then expires its
  due entries as above, unless max_delete refused them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainguard.actions.cleanup import selection as sel
from trainguard.actions.cleanup.engine import oldest, remembered
from trainguard.actions.cleanup.engine.agepass import Pass
from trainguard.actions.cleanup.engine.bound import Bound
from trainguard.actions.cleanup.plan import Ctx, Planned, full_path
from trainguard.actions.cleanup.safety.roots import Root
from trainguard.config import AgePolicy
from trainguard.units import format_bytes


@dataclass(slots=True)
class AgePlan:
    """The counting pass's result: counts, and for a need the oldest entries it takes."""

    expired_files: int = 0
    expired_bytes: int = 0
    total_files: int = 0  # every eligible entry (a need's count)
    total_bytes: int = 0  # cache size (for max_size)
    cap_need: int = 0  # bytes to free to get under max_size
    need: int = 0  # a watermark's bytes to free
    young: int = 0  # eligible but newer than older_than
    inline_done: bool = False  # deleted during the counting pass (one pass)
    remembered: list | None = None  # where the due entries are (remembered.Remembering.dirs)
    problems: dict[str, int] = field(default_factory=dict)  # quiet skips seen while planning
    selection: oldest.Oldest | None = None  # a need's count: the oldest entries and their directories
    chosen: list[oldest.Entry] = field(default_factory=list)  # what the needs take, oldest first

    def less(self, freed: int, older_than: float | None) -> None:
        """Needs that `freed` bytes (gone before this plan runs) already meet in part: fewer chosen."""
        self.need, self.cap_need = max(0, self.need - freed), max(0, self.cap_need - freed)
        self.chosen = oldest.prefix(self.chosen, self.cap_need, self.need, _since(older_than))

    def needed(self) -> tuple[int, int]:
        """(files, bytes) the needs take: the chosen entries, and past a bound or the memory budget the
        rest estimated at the eligible entries' mean size."""
        files, nbytes = sum(e.files for e in self.chosen), sum(e.bytes for e in self.chosen)
        if self.selection is None or not self.selection.capped():
            return files, nbytes
        cand_files, cand_bytes = ((self.total_files, self.total_bytes) if self.cap_need or not self.expired_files
                                  else (self.expired_files, self.expired_bytes))
        want = min(max(self.need, self.cap_need), cand_bytes)
        if want <= nbytes:
            return files, nbytes
        if want == cand_bytes:
            return cand_files, cand_bytes
        return min(cand_files, files + math.ceil((want - nbytes) * cand_files / cand_bytes)), want


class AgeKind:
    def plan(self, ctx: Ctx, root: Root, need: int | None) -> Planned:
        policy = ctx.policy
        older_than = policy.older_than if policy.older_than is not None else math.inf
        capped = getattr(policy, "max_size", None) is not None
        if isinstance(policy, AgePolicy) and need is None and policy.max_delete is None and not ctx.dry_run:
            p = Pass(ctx, root, older_than, delete=True, remove_dirs=policy.remove_empty_dirs)
            p.run()
            plan = AgePlan(p.files, p.bytes, young=p.young, inline_done=True)
        elif isinstance(policy, AgePolicy) and need is None and not ctx.dry_run:
            p = remembered.Remembering(ctx, root, older_than, policy.remove_empty_dirs)
            p.run()
            plan = AgePlan(p.files, p.bytes, young=p.young, remembered=p.dirs)
        elif need is None and not capped:
            p = Pass(ctx, root, older_than, reports=ctx.dry_run)
            p.run()
            plan = AgePlan(p.files, p.bytes, young=p.young)
        else:
            p = Pass(ctx, root, -math.inf, reports=ctx.dry_run, listed=True)
            count = _Count(policy, need, capped, ctx.left())
            p.on_gone = count.add
            p.run()
            plan = count.done()
        if p.busy:
            return Planned(note=p.busy)
        plan.problems = dict(p.scratch.skipped)
        if plan.young:
            ctx.tally.skipped["young"] = ctx.tally.skipped.get("young", 0) + plan.young
        return self.planned(plan, need)

    @staticmethod
    def planned(plan: AgePlan, need: int | None) -> Planned:
        """A watermark run has no plain part; a plain run of a capped cache has both."""
        plain = (plan.expired_files, plan.expired_bytes) if need is None else (0, 0)
        files, nbytes = plan.needed()
        return Planned(*plain, data=plan, need_files=files, need_bytes=nbytes)

    def execute(self, ctx: Ctx, root: Root, planned: Planned, need: int | None) -> None:
        plan: AgePlan = planned.data
        problems = [plan.problems]
        if plan.chosen:  # what a need takes goes first, oldest first
            problems.append(_delete_chosen(ctx, root, plan, need is not None))
        if plan.inline_done or need is not None or ctx.refused:
            pass  # done; a watermark run has no plain part; max_delete refused it
        elif ctx.dry_run and ctx.tally.on_item is None:
            overlap = [e for e in plan.chosen if e.age >= _since(ctx.policy.older_than)]
            ctx.tally.files += planned.files - sum(e.files for e in overlap)  # no second scan
            ctx.tally.bytes += planned.bytes - sum(e.bytes for e in overlap)
        elif plan.remembered is not None:
            older_than = ctx.policy.older_than if ctx.policy.older_than is not None else math.inf
            problems.append(remembered.delete_remembered(ctx, root, plan.remembered, older_than,
                                                         _left(ctx),
                                                         ctx.policy.remove_empty_dirs))
        elif ctx.policy.older_than is not None:
            problems.append(_delete_expired(ctx, root, plan))
        for seen in problems:  # a skip seen in more than one pass counts once
            for reason, n in seen.items():
                ctx.tally.skipped[reason] = max(ctx.tally.skipped.get(reason, 0), n)


class _Count:
    """A need's count (a watermark, a size cap), from every eligible entry's (name, bytes, age) as a
    listing pass hands them out: totals, and the oldest entries the need takes (oldest.Oldest)."""

    def __init__(self, policy, need: int | None, capped: bool, bound: Bound):
        self.policy, self.need, self.capped, self.plan = policy, need, capped, AgePlan()
        # A watermark knows its need before the count, and takes only due entries; a size cap knows its
        # need only after it, and takes any entry.
        self.heap = oldest.Oldest(None if capped else need, bound, emergency=need is not None)

    def add(self, lst, gone: list[tuple[str, int, float]], files: int = 1) -> None:
        plan, older_than = self.plan, self.policy.older_than
        due = gone
        if older_than is not None:
            due = [g for g in gone if g[2] >= older_than]
            plan.young += (len(gone) - len(due)) * files
            plan.expired_files += len(due) * files
            plan.expired_bytes += sum(b for _n, b, _a in due)
        plan.total_files += len(gone) * files
        plan.total_bytes += sum(b for _n, b, _a in gone)
        self.heap.add(lst, gone if self.capped else due, files)

    def done(self) -> AgePlan:
        plan, policy = self.plan, self.policy
        if self.capped and plan.total_bytes > policy.max_size:
            plan.cap_need = plan.total_bytes - policy.max_size
        plan.need = self.need or 0
        plan.selection = self.heap
        plan.chosen = oldest.prefix(self.heap.chosen(), plan.cap_need, plan.need, _since(policy.older_than))
        return plan


def _since(older_than: float | None) -> float:
    """The age from which a watermark may take an entry (any age without older_than)."""
    return -math.inf if older_than is None else older_than


def _delete_chosen(ctx: Ctx, root: Root, plan: AgePlan, watermark: bool) -> dict[str, int]:
    """Delete (in a dry run: list) what the needs took, oldest first, within max_delete; the quiet skips."""
    policy = ctx.policy
    need = max(plan.need, plan.cap_need)
    p = Pass(ctx, root, plan.chosen[-1].age, delete=not ctx.dry_run,
             bound=ctx.left(need))
    if watermark:
        p.reason = sel.age_reason(policy, True)
    else:
        p.reason = f"{policy.type}: over max_size {format_bytes(policy.max_size)}, least recently used first"
    p.watermark = watermark and not plan.cap_need  # a watermark alone: the filesystem at low is enough too
    p.emergency = watermark
    oldest.delete(p, plan.selection.dirs, plan.chosen)
    if p.busy:
        ctx.tally.skip("in-use", root.path, p.busy)
    return dict(p.scratch.skipped)


def _delete_expired(ctx: Ctx, root: Root, plan: AgePlan) -> dict[str, int]:
    """A plain run's deleting walk (or, in a dry run, its listing) of what older_than made due, within
    max_delete; the quiet skips it saw."""
    policy = ctx.policy
    p = Pass(ctx, root, policy.older_than, delete=not ctx.dry_run, reports=not ctx.dry_run, listed=ctx.dry_run,
             bound=_left(ctx),
             remove_dirs=isinstance(policy, AgePolicy) and policy.remove_empty_dirs)
    p.reason = sel.age_reason(policy, False)
    if ctx.dry_run:
        listed = {(plan.selection.dirs[e.dir][0], e.name) for e in plan.chosen} if plan.selection else set()
        p.on_gone = _lister(ctx, root, p, listed)
    p.run()
    return dict(p.scratch.skipped)


def _left(ctx: Ctx) -> Bound:
    """What max_delete still allows a plain pass; a dry run of one shows every due entry."""
    return Bound() if ctx.dry_run else ctx.left()


def _lister(ctx: Ctx, root: Root, p: Pass, listed: set[tuple[str, str]]):
    """A dry run's listing pass: each entry that would go, but those a size cap already listed."""

    def listing(lst, gone, files: int = 1) -> None:
        for name, nbytes, age in gone:
            if (lst.path, name) not in listed:
                ctx.went(root, full_path(root, lst.prefix + name), (nbytes, files), p.reason, age, files > 1 or
                         lst.parent is None and p.units is not None and p.units(name, name))

    return listing
