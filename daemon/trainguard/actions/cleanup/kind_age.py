"""The age kind (and the caches, which are age with units, locks and a size cap): which passes of
the age engine (age_fast.Pass) a run makes. Every pass is one scan of the root judging each entry
from a fresh lstat with every rule just before it is counted or unlinked; between two passes nothing
is kept per file but a guarded run's due names (remembered.py, bounded), so memory stays flat.

- max_delete = false, no watermark, no dry run: one pass, judging and deleting.
- a max_delete guard: a counting pass that remembers what is due (remembered.py), then, if the
  guard allows it, the deletion of only that, bounded by max_delete: never more than the guard
  allowed, even if more became due in between. Past remembered.BUDGET, a second (deleting) walk.
- a dry run: the counting pass is the answer.
- a watermark run or a size cap: a pass that builds an age histogram (constant memory), then a
  deleting pass from the cutoff age that frees what is needed, stopping once it is freed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainguard.actions.cleanup import policies as sel
from trainguard.actions.cleanup import remembered
from trainguard.actions.cleanup.age_fast import Pass
from trainguard.actions.cleanup.agerules import NO_LIMIT, Bound
from trainguard.actions.cleanup.guard import Root
from trainguard.actions.cleanup.plan import Ctx, Planned, full_path
from trainguard.config import AgePolicy
from trainguard.units import format_bytes


@dataclass(slots=True)
class AgePlan:
    """The counting pass's result: counts and histograms, no per-file state."""

    expired_files: int = 0
    expired_bytes: int = 0
    hist: sel.AgeHistogram = field(default_factory=sel.AgeHistogram)  # due entries by age
    total_bytes: int = 0  # cache size (for max_size)
    cap_min_age: float = math.inf  # entries at least this old go to get under max_size
    cap_need: int = 0
    young: int = 0  # eligible but newer than older_than
    inline_done: bool = False  # deleted during the counting pass (one pass)
    remembered: list | None = None  # where the due entries are (remembered.Remembering.dirs)
    problems: dict[str, int] = field(default_factory=dict)  # quiet skips seen while planning


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
            hists = _Histograms(policy, need is not None or capped, capped)
            p.on_gone = hists.add
            p.run()
            plan = hists.done()
        if p.busy:
            return Planned(note=p.busy)
        plan.problems = dict(p.scratch.skipped)
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
        problems = [plan.problems]
        if plan.inline_done:
            pass
        elif ctx.dry_run and ctx.tally.on_item is None:
            ctx.tally.files += planned.files  # the counting pass is the answer: no second scan
            ctx.tally.bytes += planned.bytes
        elif plan.remembered is not None:
            older_than = ctx.policy.older_than if ctx.policy.older_than is not None else math.inf
            problems.append(remembered.delete_remembered(ctx, root, plan.remembered, older_than,
                                                         Bound(*_left(ctx.policy.max_delete, ctx)),
                                                         ctx.policy.remove_empty_dirs))
        else:
            problems += _delete(ctx, root, plan, need)
        for seen in problems:  # a skip seen in more than one pass counts once
            for reason, n in seen.items():
                ctx.tally.skipped[reason] = max(ctx.tally.skipped.get(reason, 0), n)


class _Histograms:
    """A watermark's or a size cap's plan, from every eligible entry's (age, bytes) as a listing pass
    hands them out: counts and histograms only, constant memory."""

    def __init__(self, policy, by_age: bool, capped: bool):
        self.policy, self.by_age, self.plan = policy, by_age, AgePlan()
        self.all_hist = sel.AgeHistogram() if capped else None

    def add(self, _lst, gone: list[tuple[str, int, float]], files: int = 1) -> None:
        plan, older_than, all_hist = self.plan, self.policy.older_than, self.all_hist
        for _name, nbytes, age in gone:
            plan.total_bytes += nbytes
            if all_hist is not None:
                all_hist.add(age, nbytes, files)
            if older_than is None or age >= older_than:
                if self.by_age:
                    plan.hist.add(age, nbytes, files)
                if older_than is not None:
                    plan.expired_files += files
                    plan.expired_bytes += nbytes
            else:
                plan.young += files

    def done(self) -> AgePlan:
        plan, policy = self.plan, self.policy
        if self.all_hist is not None and plan.total_bytes > policy.max_size:
            plan.cap_need = plan.total_bytes - policy.max_size
            plan.cap_min_age, _f, _b = self.all_hist.cutoff_for(plan.cap_need)
        return plan


def _delete(ctx: Ctx, root: Root, plan: AgePlan, need: int | None) -> list[dict[str, int]]:
    """The deleting (or, in a dry run, listing) passes; the quiet skips each saw."""
    policy = ctx.policy
    limit = policy.max_delete
    if need is not None:
        min_age, _f, _b = plan.hist.cutoff_for(need)
        # Histogram buckets are ~3 % wide: never let one reach below older_than.
        passes = [(max(min_age, policy.older_than or 0.0), need, sel.age_reason(policy, True))]
    else:
        passes = [(policy.older_than if policy.older_than is not None else math.inf, NO_LIMIT,
                   sel.age_reason(policy, False))]
    if plan.cap_need:
        cap = format_bytes(policy.max_size)
        passes.append((plan.cap_min_age, plan.cap_need, f"{policy.type}: over max_size {cap}, least recently used first"))
    seen, freed = [], 0
    for n, (older_than, need_bytes, reason) in enumerate(passes):
        if n and need_bytes != NO_LIMIT:
            need_bytes -= freed  # a size cap: what the expired entries freed counts
            if need_bytes <= 0:
                break
        bound = Bound(*_left(limit, ctx), need_bytes)
        remove_dirs = isinstance(policy, AgePolicy) and policy.remove_empty_dirs and need is None and n == 0
        p = Pass(ctx, root, older_than, delete=not ctx.dry_run, reports=not ctx.dry_run, listed=ctx.dry_run,
                 bound=bound, remove_dirs=remove_dirs)
        p.reason, p.watermark = reason, need is not None and n == 0
        if ctx.dry_run:
            p.on_gone = _lister(ctx, root, p, need_bytes)
        p.run()
        freed += p.freed
        seen.append(dict(p.scratch.skipped))
        if p.stopped and need_bytes == NO_LIMIT:
            break  # the max_delete bound
    return seen


def _left(limit, ctx: Ctx) -> tuple[int, int]:
    """What max_delete still allows this run (every root and pass so far counted), -1: no limit."""
    if limit is None or ctx.dry_run:
        return NO_LIMIT, NO_LIMIT
    files = NO_LIMIT if limit.files is None else max(0, limit.files - ctx.tally.files)
    return files, NO_LIMIT if limit.bytes is None else max(0, limit.bytes - ctx.tally.bytes)


def _lister(ctx: Ctx, root: Root, p: Pass, need_bytes: int):
    """A dry run's listing pass: each entry that would go, until what is needed is listed."""

    def listed(lst, gone, files: int = 1) -> None:
        for name, nbytes, age in gone:
            if need_bytes != NO_LIMIT and p.freed >= need_bytes:
                p.stopped = True
                return
            p.freed += nbytes
            ctx.went(root, full_path(root, lst.prefix + name), (nbytes, files), p.reason, age, files > 1 or
                     lst.parent is None and p.units is not None and p.units(name, name))

    return listed
