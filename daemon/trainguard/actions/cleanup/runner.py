"""Running cleanup policies: plan, guard, execute, report.

One run of one policy (CleanupRunner.run):
1. guard: each root is opened and checked (guard.open_root: safe, writable, the mount
   points below it collected so bind mounts are never entered);
2. plan: the policy's kind (KINDS, keyed by policy type) scans each root into a plan;
   a watermark run (and a size cap) plans only what its need takes, oldest first: what brings
   the filesystem down to `low` (the cache under max_size);
3. guard: if a plain run's due entries exceed max_delete, none of them is deleted and the
   report carries a warning finding; what a need takes is only bounded by max_delete
   (guard.py says why);
4. execute: the kind deletes oldest-first relative to open directory fds, re-checking
   just before each delete that the entry is the one judged, not open by any process
   and not changed within the grace period. A failure on one entry is counted and skipped;
5. report: totals, skips by reason, top directories, findings (record/report.py); a need that
   max_delete cut short is a warning with what is left to free.

A new kind (e.g. log rotation) is one class with plan() and execute() (plan.Kind) and
one entry in KINDS. The runner holds no thread of its own; CleanupWorker (worker.py)
calls it off the sampling thread.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from typing import Callable, Mapping, Sequence

from trainguard.actions.cleanup import selection as sel
from trainguard.actions.cleanup.engine import walker
from trainguard.actions.cleanup.guard import (
    bounded_note,
    bytes_above,
    max_delete_guard,
    max_delete_text,
    open_root,
    watermark_need,
)
from trainguard.actions.cleanup.plan import Ctx, Kind, Planned, Tools
from trainguard.actions.cleanup.record.audit import AuditLog
from trainguard.actions.cleanup.record.report import (  # re-exported: the CLI, worker and tests use them
    CleanupReport,
    Item,
    RootReport,
    Tally,
    describe,
    findings_for,
)
from trainguard.actions.cleanup.safety.inuse import OpenFiles
from trainguard.actions.cleanup.safety.roots import Root
from trainguard.config import AgePolicy, CachePolicy, CheckpointsPolicy, Mirror
from trainguard.rootcheck import home_dirs
from trainguard.sources.fs import usage_from_statvfs

log = logging.getLogger(__name__)

Policy = CheckpointsPolicy | AgePolicy | CachePolicy

# policy type -> "module:class" of its kind, imported when a policy of that type first runs (the
# `cleanup` command of an age policy does not pay for the others' imports).
KINDS: dict[str, str] = {
    "checkpoints": "kinds.checkpoints:CheckpointsKind",
    "age": "kinds.age:AgeKind",
    "pip-cache": "kinds.age:AgeKind",
    "huggingface-cache": "kinds.huggingface:HfKind",
    "huggingface-datasets-cache": "kinds.age:AgeKind",
    "torch-cache": "kinds.age:AgeKind",
    "conda-cache": "kinds.age:AgeKind",
}
_KINDS_MADE: dict[str, Kind] = {}


def kind_for(policy_type: str) -> Kind:
    where = KINDS[policy_type]
    kind = _KINDS_MADE.get(where)
    if kind is None:
        module, _, name = where.partition(":")
        kind = _KINDS_MADE[where] = getattr(importlib.import_module(f"trainguard.actions.cleanup.{module}"), name)()
    return kind


__all__ = ["CleanupRunner", "CleanupReport", "Item", "RootReport", "KINDS", "bytes_above", "describe", "findings_for",
           "kind_for"]


class CleanupRunner:
    """Runs policies on demand. Not thread-safe: one runner per thread."""

    def __init__(self, policies: Sequence[Policy], *, audit: AuditLog | None = None, proc_root: str = "/proc",
                 clock: Callable[[], float] = time.time, environ: Mapping[str, str] | None = None,
                 homes: frozenset[str] | None = None, hook: walker.Hook | None = None,
                 open_files: OpenFiles | None = None, max_items: int = 1000,
                 mirrors: Sequence[Mirror] = (), mirror_timeout: float = 10.0):
        self.policies = {p.name: p for p in policies}
        self.audit = audit
        self.proc_root = proc_root
        self.clock = clock
        self.environ = os.environ if environ is None else environ
        self.homes = homes
        self.max_items = max_items
        self.tools = Tools(open_files or OpenFiles(proc_root), audit, clock, hook,
                           {m.name: m for m in mirrors}, mirror_timeout)

    @property
    def open_files(self) -> OpenFiles:
        return self.tools.open_files

    def roots_of(self, policy: Policy) -> list[str]:
        if policy.roots or not isinstance(policy, CachePolicy):
            return list(policy.roots)
        homes = sorted(self.homes if self.homes is not None else home_dirs())
        own = self.environ.get("HOME") or os.path.expanduser("~")
        found = sel.cache_dirs(policy.type, self.environ, homes if policy.all_users else [],
                               as_root=os.geteuid() == 0, own_home=own)
        return [d for d in found if os.path.isdir(d)]

    def run(self, policy: Policy, *, trigger: str = "manual", dry_run: bool = False,
            on_item: Callable[[Item], None] | None = None) -> CleanupReport:
        """Run one policy once. trigger "watermark" frees down to `low`; "schedule" takes every
        candidate; "manual" does what the policy's own triggers would (a watermark-only policy
        deletes nothing while its filesystem is below `high`)."""
        if policy.type == "logs":  # rotation, not deletion: its own module (kinds/logs.py)
            from trainguard.actions.cleanup.kinds.logs import rotate_logs

            return rotate_logs(policy, trigger=trigger, dry_run=dry_run, on_item=on_item, audit=self.audit,
                               proc_root=self.proc_root, homes=self.homes, clock=self.clock)
        started = self.clock()
        tally = Tally(self.max_items, on_item)
        roots: list[Root] = []
        notes: dict[str, str] = {}
        try:
            for path in self.roots_of(policy):
                root, why = open_root(path, self.homes, self.proc_root, tally, dry_run)
                if root is None:
                    log.warning("cleanup %s: %s", policy.name, why)
                    notes[path] = why
                else:
                    roots.append(root)
            ctx = Ctx(policy, tally, self.tools, dry_run, self.clock())
            return self._run_roots(ctx, roots, notes, trigger, started)
        finally:
            for root in roots:
                os.close(root.fd)
            if self.audit is not None:
                self.audit.flush()

    def _run_roots(self, ctx: Ctx, roots: list[Root], notes: dict[str, str], trigger: str,
                   started: float) -> CleanupReport:
        policy, kind = ctx.policy, kind_for(ctx.policy.type)
        watermark = trigger == "watermark" or (trigger == "manual" and policy.watermark and policy.schedule is None)
        plans = [self._plan_root(ctx, kind, root, trigger if watermark else None) for root in roots]
        plain = sum(p.files for _r, _u, p, _n in plans), sum(p.bytes for _r, _u, p, _n in plans)
        needed = sum(p.need_files for _r, _u, p, _n in plans), sum(p.need_bytes for _r, _u, p, _n in plans)
        guard = max_delete_guard(policy, *plain)
        ctx.refused = bool(guard)
        reports = []
        for root, usage, planned, need in plans:
            before = ctx.tally.files, ctx.tally.bytes
            if not planned.note and (not guard or planned.need_files or planned.need_bytes):
                kind.execute(ctx, root, planned, need)
            after = usage_from_statvfs(os.fstatvfs(root.fd)).used_ratio if not ctx.dry_run else None
            reports.append(RootReport(root.path, root.mount, ctx.tally.files - before[0],
                                      ctx.tally.bytes - before[1], usage.used_ratio, after, planned.note))
        reports += [RootReport(path, "", note=note) for path, note in notes.items()]
        goal = ("low", policy.low) if watermark else ("", 0.0)
        if not watermark and any(needed):  # a size cap
            goal = ("max_size", float(getattr(policy, "max_size", None) or 0))
        done = ctx.tally.files, ctx.tally.bytes
        bounded = bounded_note(policy, done, needed, goal, ctx.dry_run, ctx.whole) if any(needed) else ""
        return self._report(ctx, trigger, started, tuple(reports), (guard, bounded),
                            (plain[0] + needed[0], plain[1] + needed[1]), needed, goal)

    def _plan_root(self, ctx: Ctx, kind: Kind, root: Root, watermark: str | None):
        usage = usage_from_statvfs(os.fstatvfs(root.fd))
        need = None
        if watermark is not None:
            need, why = watermark_need(ctx.policy, usage, manual=watermark == "manual")
            if need is None:
                return root, usage, Planned(note=why), None
        return root, usage, kind.plan(ctx, root, need), need

    def _report(self, ctx: Ctx, trigger: str, started: float, roots: tuple[RootReport, ...],
                guards: tuple[str, str], planned: tuple[int, int], needed: tuple[int, int],
                goal: tuple[str, float]) -> CleanupReport:
        t = ctx.tally
        report = CleanupReport(
            policy=ctx.policy.name, type=ctx.policy.type, trigger=trigger, dry_run=ctx.dry_run, started=started,
            finished=self.clock(), roots=roots, files=t.files, bytes=t.bytes, skipped=dict(t.skipped),
            guard=guards[0], bounded=guards[1], needed_files=needed[0], needed_bytes=needed[1],
            max_delete=max_delete_text(ctx.policy.max_delete) if ctx.policy.max_delete else "",
            goal=goal[0], goal_value=goal[1], whole=ctx.whole,
            items=tuple(t.items), planned_files=planned[0], planned_bytes=planned[1],
            uninspected=len(ctx.tools.open_files.uninspected), dirs_removed=t.dirs, blocked=tuple(t.blocked), blocked_paths=tuple(t.blocked_paths), top_dirs=t.top_dirs(), holders=tuple(t.holders.values()),
            in_use=tuple(t.in_use),
        )
        log.info("%s", describe(report))
        return report
