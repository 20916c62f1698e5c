"""Running cleanup policies: plan, guard, delete (or only list), audit, report.

One run of one policy:
1. each root is opened and checked (safety.open_checked_root) and the mount points
   below it are collected, so bind mounts are never entered;
2. plan: checkpoints are scanned into a short list of candidates; age and cache
   policies are scanned in constant memory into counts and an age histogram;
3. guard: if the planned deletion exceeds max_delete, nothing is deleted and the
   report carries a warning finding;
4. delete oldest-first (a watermark run stops as soon as the filesystem is at or
   below `low`), relative to an open directory fd, re-checking just before each
   delete that the entry is the one judged, not open by any process and not
   changed within the grace period. A failure on one entry is counted and skipped.

The runner holds no thread of its own; CleanupWorker (worker.py) calls it off the
sampling thread.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import stat as stat_mod
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from trainguard.actions import policies as sel
from trainguard.actions import mirrorcheck, walker
from trainguard.actions.audit import AuditLog
from trainguard.actions.report import printable
from trainguard.actions.safety import (
    OpenedRoot,
    OpenFiles,
    UnsafeRoot,
    home_dirs,
    in_grace,
    mount_point_of,
    mounts_below,
    open_checked_root,
)
from trainguard.config import AgePolicy, CachePolicy, CheckpointsPolicy, Mirror
from trainguard.records import Finding, FsUsage, Severity
from trainguard.sources.fs import usage_from_statvfs
from trainguard.units import format_bytes, format_ratio

log = logging.getLogger(__name__)

Policy = CheckpointsPolicy | AgePolicy | CachePolicy


@dataclass(frozen=True, slots=True)
class Item:
    """One entry deleted (or, in a dry run, that would be)."""

    path: str
    bytes: int
    files: int
    reason: str
    age_s: float
    unit: bool = False


@dataclass(frozen=True, slots=True)
class RootReport:
    root: str
    mount: str
    files: int = 0
    bytes: int = 0
    usage_before: float | None = None  # used ratio when the run started on this root
    usage_after: float | None = None
    note: str = ""  # why nothing happened here, when nothing did


@dataclass(frozen=True, slots=True)
class CleanupReport:
    policy: str
    type: str
    trigger: str  # "manual", "schedule", "watermark"
    dry_run: bool
    started: float
    finished: float
    roots: tuple[RootReport, ...]
    files: int
    bytes: int
    skipped: Mapping[str, int] = field(default_factory=dict)  # reason -> count
    guard: str = ""  # non-empty: max_delete stopped the run; nothing was deleted
    items: tuple[Item, ...] = ()  # the first max_items entries
    planned_files: int = 0
    planned_bytes: int = 0
    dirs_removed: int = 0
    blocked: tuple[str, ...] = ()  # roots this policy cannot delete in, with the reason

    @property
    def mounts(self) -> list[str]:
        return sorted({r.mount for r in self.roots if r.files}, key=lambda m: -sum(r.bytes for r in self.roots if r.mount == m))


def bytes_above(usage: FsUsage, ratio: float) -> int:
    """Bytes to free for used / (used + avail) to reach ratio (df's view)."""
    return max(0, math.ceil(usage.used_bytes - ratio * (usage.used_bytes + usage.avail_bytes)))


class _Run:
    """Mutable tallies of one policy run."""

    def __init__(self, max_items: int, on_item: Callable[[Item], None] | None):
        self.files = 0
        self.bytes = 0
        self.dirs = 0  # empty directories removed
        self.skipped: dict[str, int] = {}
        self.items: list[Item] = []
        self.max_items = max_items
        self.on_item = on_item
        self._logged: dict[str, int] = {}
        self.blocked: list[str] = []

    def skip(self, reason: str, path: str = "", detail: str = "") -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if reason in ("grace", "open", "busy-run", "excluded"):
            return  # expected, not worth a log line each
        shown = self._logged.get(reason, 0)
        if shown < 5:
            log.warning("cleanup: skipped %s (%s%s)", path, reason, f": {detail}" if detail else "")
        elif shown == 5:
            log.warning("cleanup: more entries skipped for %s; see the run summary", reason)
        self._logged[reason] = shown + 1

    def skip_error(self, path: str, exc: OSError) -> None:
        reason = walker.classify_error(exc)
        if reason in ("read-only", "permission") and not any(b.startswith(path) for b in self.blocked):
            if len(self.blocked) < 5:
                self.blocked.append(f"{printable(path)}: {exc.strerror}")
        self.skip(reason, path, exc.strerror or "")

    def add(self, item: Item) -> None:
        self.files += item.files
        self.bytes += item.bytes
        if len(self.items) < self.max_items:
            self.items.append(item)
        if self.on_item is not None:
            self.on_item(item)

    def deleted(self, policy: str, mount: str, path: str, nbytes: int, files: int, reason: str, age: float,
                unit: bool, audit: AuditLog | None) -> None:
        """add() for the age scan's hot path: the Item is built only when someone reads it."""
        if audit is not None:
            audit.record(policy, mount, path, nbytes, files, reason)
        if self.on_item is not None or len(self.items) < self.max_items:
            self.add(Item(path, nbytes, files, reason, age, unit))
        else:
            self.files += files
            self.bytes += nbytes


@dataclass(slots=True)
class _AgePlan:
    """Pass-1 result for age and cache policies: counts and histograms, no per-file state."""

    expired_files: int = 0
    expired_bytes: int = 0
    hist: sel.AgeHistogram = field(default_factory=sel.AgeHistogram)  # eligible entries by age
    total_bytes: int = 0  # cache size (for max_size)
    cap_min_age: float = math.inf  # entries at least this old go to get under max_size
    cap_need: int = 0
    busy: str = ""  # non-empty: a lock is held, leave this cache alone
    problems: dict[str, int] = field(default_factory=dict)  # walk problems seen while planning
    dirs: list[_DirMarks] = field(default_factory=list)  # where pass 2 looks again, in post-order


@dataclass(frozen=True, slots=True)
class _DirMarks:
    """A directory pass 2 revisits: what it was in pass 1 and which listing positions were candidates."""

    path: str  # relative to the root, "" for the root
    ino: int
    mtime_ns: int  # changed mtime or ctime: entries were added, removed or renamed since
    ctime_ns: int
    count: int  # entries listed
    order: int  # walker.listing_order over them: catches changes within one timestamp tick
    marks: bytes  # bit n set: the n-th entry listed (counting from 1) was a candidate
    rmdir: bool  # old enough to be removed once empty (remove_empty_dirs)


@dataclass(slots=True)
class _DeleteState:
    cap_left: int  # bytes a size cap still has to take
    freed: int = 0


class CleanupRunner:
    """Runs policies on demand. Not thread-safe: one runner per thread."""

    def __init__(
        self,
        policies: Sequence[Policy],
        *,
        audit: AuditLog | None = None,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.time,
        environ: Mapping[str, str] | None = None,
        homes: frozenset[str] | None = None,
        hook: walker.Hook | None = None,
        open_files: OpenFiles | None = None,
        max_items: int = 1000,
        mirrors: Sequence[Mirror] = (),
        mirror_timeout: float = 10.0,
    ):
        self.policies = {p.name: p for p in policies}
        self.audit = audit
        self.proc_root = proc_root
        self.clock = clock
        self.environ = os.environ if environ is None else environ
        self.homes = homes
        self.hook = hook
        self.open_files = open_files or OpenFiles(proc_root)
        self.max_items = max_items
        self.mirrors = {m.name: m for m in mirrors}
        self.mirror_timeout = mirror_timeout

    # ------------------------------------------------------------ roots

    def roots_of(self, policy: Policy) -> list[str]:
        if policy.roots or not isinstance(policy, CachePolicy):
            return list(policy.roots)
        homes = sorted(self.homes if self.homes is not None else home_dirs())
        own = self.environ.get("HOME") or os.path.expanduser("~")
        found = sel.cache_dirs(policy.type, self.environ, homes if policy.all_users else [],
                               as_root=os.geteuid() == 0, own_home=own)
        return [d for d in found if os.path.isdir(d)]

    # ------------------------------------------------------------ entry point

    def run(
        self,
        policy: Policy,
        *,
        trigger: str = "manual",
        dry_run: bool = False,
        on_item: Callable[[Item], None] | None = None,
    ) -> CleanupReport:
        """Run one policy once. trigger "watermark" frees down to `low`; "schedule" takes every
        candidate; "manual" does what the policy's own triggers would (a watermark-only policy
        deletes nothing while its filesystem is below `high`)."""
        started = self.clock()
        watermark = trigger == "watermark" or (trigger == "manual" and policy.watermark and policy.schedule is None)
        run = _Run(self.max_items, on_item)
        opened: list[tuple[OpenedRoot, str, frozenset[str]]] = []
        notes: dict[str, str] = {}
        root_paths = self.roots_of(policy)
        try:
            for root in root_paths:
                try:
                    o = open_checked_root(root, self.homes)
                except UnsafeRoot as exc:
                    log.error("cleanup %s: %s", policy.name, exc)
                    notes[root] = str(exc)
                    run.skip("unsafe-root", root, str(exc))
                    continue
                why = write_blocked(o)
                if why:
                    log.warning("cleanup %s: %s", policy.name, why)
                    run.blocked.append(why)
                    if not dry_run:
                        os.close(o.fd)
                        notes[root] = why
                        run.skip("read-only", root, why)
                        continue
                try:
                    below = mounts_below(o.path, self.proc_root)
                except OSError as exc:
                    os.close(o.fd)
                    notes[root] = f"cannot read mount table: {exc.strerror}"
                    run.skip("error", root, notes[root])
                    continue
                opened.append((o, mount_point_of(o.path), below))
            return self._run_opened(policy, opened, notes, run, trigger, watermark, dry_run, started)
        finally:
            for o, _mount, _below in opened:
                os.close(o.fd)
            if self.audit is not None:
                self.audit.flush()

    def _run_opened(self, policy, opened, notes, run, trigger, watermark, dry_run, started) -> CleanupReport:
        now = self.clock()
        plans = []
        planned_files = planned_bytes = 0
        for o, mount, below in opened:
            usage = usage_from_statvfs(os.fstatvfs(o.fd))
            need = None
            if watermark:
                threshold = policy.high if trigger == "manual" else policy.low
                if usage.used_ratio < threshold or bytes_above(usage, policy.low) == 0:
                    notes[o.path] = f"{format_ratio(usage.used_ratio)} used, below the {format_ratio(threshold)} watermark"
                    plans.append((o, mount, below, usage, None, 0))
                    continue
                need = bytes_above(usage, policy.low)
            if isinstance(policy, CheckpointsPolicy):
                plan = self._plan_checkpoints(policy, o, below, run, now)
                chosen = plan if need is None else _take_until(plan, need)
                files, nbytes = sum(c.files for c in chosen), sum(c.bytes for c in chosen)
            else:
                remove_dirs = isinstance(policy, AgePolicy) and policy.remove_empty_dirs and need is None
                plan = self._plan_age(policy, o, below, run, now, remove_dirs)
                if plan.busy:
                    notes[o.path] = plan.busy
                    plans.append((o, mount, below, usage, None, 0))
                    continue
                if need is None:
                    files, nbytes = plan.expired_files, plan.expired_bytes
                    if plan.cap_need:
                        _age, cf, cb = plan.hist.cutoff_for(plan.cap_need)
                        files, nbytes = max(files, cf), max(nbytes, cb)
                else:
                    _age, files, nbytes = plan.hist.cutoff_for(need)
            planned_files += files
            planned_bytes += nbytes
            plans.append((o, mount, below, usage, plan, need))

        guard = ""
        if policy.max_delete is not None and policy.max_delete.exceeded_by(planned_files, planned_bytes):
            guard = (
                f"{planned_files} files ({format_bytes(planned_bytes)}) would exceed max_delete "
                f"{_describe_limit(policy.max_delete)}"
            )
            log.warning("cleanup %s: stopped, nothing deleted: %s", policy.name, guard)

        roots: list[RootReport] = []
        for o, mount, below, usage, plan, need in plans:
            before_files, before_bytes = run.files, run.bytes
            if plan is not None and not guard:
                if isinstance(policy, CheckpointsPolicy):
                    self._delete_checkpoints(policy, o, mount, plan, need, run, dry_run)
                else:
                    self._delete_age(policy, o, mount, below, plan, need, run, dry_run, now)
            if isinstance(plan, _AgePlan):
                for reason, n in plan.problems.items():  # seen in either pass: count once
                    run.skipped[reason] = max(run.skipped.get(reason, 0), n)
            after = usage_from_statvfs(os.fstatvfs(o.fd)).used_ratio if not dry_run else None
            roots.append(RootReport(o.path, mount, run.files - before_files, run.bytes - before_bytes,
                                    usage.used_ratio, after, notes.pop(o.path, "")))
        for root, note in notes.items():
            roots.append(RootReport(root, "", note=note))
        if self.audit is not None and not dry_run and run.files:
            self.audit.flush()
        report = CleanupReport(
            policy=policy.name, type=policy.type, trigger=trigger, dry_run=dry_run, started=started,
            finished=self.clock(), roots=tuple(roots), files=run.files, bytes=run.bytes,
            skipped=dict(run.skipped), guard=guard, items=tuple(run.items),
            planned_files=planned_files, planned_bytes=planned_bytes, dirs_removed=run.dirs,
            blocked=tuple(run.blocked),
        )
        log.info("%s", describe(report))
        return report

    # ------------------------------------------------------------ checkpoints

    def _plan_checkpoints(self, policy: CheckpointsPolicy, o: OpenedRoot, below: frozenset[str],
                          run: _Run, now: float) -> list[sel.Candidate]:
        items: list[sel.CheckpointItem] = []
        self.open_files.refresh()

        def descend(entry: walker.Entry) -> bool:
            return not (sel.matches(entry.name, entry.path, policy.exclude)
                        or sel.matches(entry.name, entry.path, policy.dir_patterns))

        for entry in walker.walk(o.fd, dev=o.dev, descend=descend, prune_paths=below, mnt=o.mnt,
                                 on_problem=lambda p: run.skip(p.reason, p.path, p.detail), hook=self.hook):
            if sel.matches(entry.name, entry.path, policy.exclude):
                continue
            group = entry.path.rpartition("/")[0]
            st = entry.st
            if entry.is_dir:
                if not sel.matches(entry.name, entry.path, policy.dir_patterns):
                    continue
                try:
                    unit = walker.measure_unit(entry.dir_fd, entry.name, o.dev, self.hook)
                except OSError as exc:
                    run.skip_error(entry.path, exc)
                    continue
                if unit.mounts:
                    run.skip("mount-point", entry.path, "a mount point inside; this unit is never deleted")
                    continue
                busy = (now - unit.newest_change < policy.grace or unit.problems > 0
                        or self.open_files.any_open(unit.inodes))
                items.append(sel.CheckpointItem(group, entry.path, entry.name, sel.parse_step(entry.name),
                                                st.st_mtime, unit.bytes, unit.files, True, st.st_dev, st.st_ino, busy))
            elif sel.is_deletable_type(st) and not _is_symlink(st) and sel.matches(entry.name, entry.path, policy.patterns):
                busy = in_grace(st, now, policy.grace) or self.open_files.is_open(st.st_dev, st.st_ino)
                items.append(sel.CheckpointItem(group, entry.path, entry.name, sel.parse_step(entry.name),
                                                st.st_mtime, sel.freed_bytes(st), 1, False, st.st_dev, st.st_ino, busy))
        cands = sel.select_checkpoints(o.path, items, policy, now)
        if policy.only_if_mirrored and cands:
            mirror = self.mirrors.get(policy.only_if_mirrored)
            if mirror is None:
                for cand in cands:
                    run.skip("not-mirrored", cand.relpath, f"mirror {policy.only_if_mirrored!r} is not known here")
                return []
            cands = mirrorcheck.only_mirrored(cands, o, mirror, run, self.mirror_timeout)
        return cands

    def _delete_checkpoints(self, policy, o: OpenedRoot, mount: str, plan: list[sel.Candidate],
                            need: int | None, run: _Run, dry_run: bool) -> None:
        freed = 0
        for cand in plan:  # oldest first
            if need is not None and self._reached(o, need, freed, dry_run, policy.low):
                return
            parent, _, name = cand.relpath.rpartition("/")
            path = os.path.join(o.path, cand.relpath)
            try:
                pfd = walker.open_beneath(o.fd, parent, o.dev)
            except OSError as exc:
                run.skip_error(path, exc)
                continue
            try:
                st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) != (cand.dev, cand.ino):
                    run.skip("replaced", path, "not the entry that was judged")
                    continue
                now = self.clock()
                if cand.is_unit:
                    unit = walker.measure_unit(pfd, name, o.dev, self.hook)
                    self.open_files.refresh()  # just before the delete
                    if now - unit.newest_change < policy.grace:
                        run.skip("grace", path)
                        continue
                    if unit.problems or self.open_files.any_open(unit.inodes):
                        run.skip("open" if not unit.problems else "mount-point" if unit.mounts else "unreadable", path)
                        continue
                    nbytes, nfiles = unit.bytes, unit.files
                else:
                    self.open_files.refresh()
                    if in_grace(st, now, policy.grace):
                        run.skip("grace", path)
                        continue
                    if self.open_files.is_open(st.st_dev, st.st_ino):
                        run.skip("open", path)
                        continue
                    nbytes, nfiles = sel.freed_bytes(st), 1
                item = Item(path, nbytes, nfiles, cand.reason, now - cand.age_ts, cand.is_unit)
                if not dry_run:
                    if self.hook is not None:
                        self.hook("before_delete", cand.relpath)
                    if cand.is_unit:
                        walker.remove_tree_at(pfd, name, o.dev, cand.ino)
                    else:
                        os.unlink(name, dir_fd=pfd)
                    self._audit(policy.name, mount, item)
                run.add(item)
                freed += nbytes
            except OSError as exc:
                run.skip_error(path, exc)
            finally:
                os.close(pfd)

    # ------------------------------------------------------------ age and caches
    #
    # Two passes, because max_delete must be checked against the whole plan before
    # anything goes. Pass 1 stats every entry once and keeps, per directory holding
    # candidates, a small record: the directory's identity and change times and one
    # bit per listing position that was a candidate. Pass 2 reopens only those
    # directories and re-stats only the marked entries, re-judging each one from that
    # fresh lstat with every rule (identity, filesystem, grace, age, open files) just
    # before the unlink. The marks only choose what to look at again: a directory
    # changed since pass 1 (other mtime/ctime) is judged entry by entry in full.

    def _judge_fn(self, policy: AgePolicy | CachePolicy, kind: sel.CacheKind | None, run: _Run, now: float,
                  plan: _AgePlan | None) -> Callable[[int, str, str, os.stat_result, bool], tuple[float, int, int, bool] | None]:
        """A judge with the globs compiled and the times precomputed: it runs once per entry."""
        excluded = sel.globset(policy.exclude)
        wanted = sel.globset(policy.patterns)
        # The usual globs are name-only ("*.lock"; "*" for wanted): then one regex call, or none.
        ex_simple = excluded.path_match is None and not excluded.everything
        ex_name = excluded.name_match or (lambda _name: None)
        wanted_all = wanted.everything
        kind_exclude = kind.exclude if kind else ()
        locks = sel.globset(kind.lock_globs) if kind else None
        units = sel.globset(kind.unit_globs) if kind else None
        changed_after = now - policy.grace  # changed later than this: may still be being written
        age_by = tuple(policy.age_by) if isinstance(policy, AgePolicy) else ("atime", "mtime", "ctime")
        by_mtime = age_by == ("mtime",)
        is_reg, is_lnk = stat_mod.S_ISREG, stat_mod.S_ISLNK

        def judge(dir_fd: int, name: str, path: str, st: os.stat_result, is_dir: bool) -> tuple[float, int, int, bool] | None:
            if ((ex_name(name) if ex_simple else excluded(name, path))
                    or (kind_exclude and sel.matches_any_part(path, kind_exclude))):
                if locks is not None and plan is not None and not is_dir and locks(name, path):
                    if self.open_files.is_open(st.st_dev, st.st_ino):
                        plan.busy = f"in use: {path} is held by a process"
                return None
            if is_dir:
                if units is None or "/" in path or not units(name, path):
                    return None
                try:
                    unit = walker.measure_unit(dir_fd, name, st.st_dev, self.hook)
                except OSError as exc:
                    run.skip_error(path, exc)
                    return None
                if unit.newest_change > changed_after:
                    run.skip("grace", path)
                    return None
                if unit.multi_linked:
                    run.skip("linked-elsewhere", path)  # e.g. a conda package hard-linked into an environment
                    return None
                if unit.problems:
                    run.skip("mount-point" if unit.mounts else "unreadable", path)
                    return None
                return unit.newest_access, unit.bytes, unit.files, True
            mode = st.st_mode
            if not (is_reg(mode) or is_lnk(mode)) or not (wanted_all or wanted(name, path)):
                return None
            if st.st_mtime > changed_after or st.st_ctime > changed_after:
                run.skip("grace", path)
                return None
            ts = st.st_mtime if by_mtime else sel.age_timestamp(st, age_by)
            return ts, (st.st_blocks * 512 if st.st_nlink <= 1 else 0), 1, False

        return judge

    def _enters_fn(self, policy: AgePolicy | CachePolicy, kind: sel.CacheKind | None) -> Callable[[str, str], bool]:
        """Which directories the age scan enters (excluded ones and cache units are not)."""
        excluded = sel.globset(policy.exclude)
        units = sel.globset(kind.unit_globs) if kind else None

        def enters(name: str, path: str) -> bool:
            if excluded(name, path):
                return False
            # Cache units are judged whole; a cache's own excluded directories (.locks) are
            # entered, so that held locks are seen, but nothing in them is ever a candidate.
            return units is None or "/" in path or not units(name, path)

        return enters

    def _plan_age(self, policy: AgePolicy | CachePolicy, o: OpenedRoot, below: frozenset[str],
                  run: _Run, now: float, remove_dirs: bool) -> _AgePlan:
        kind = sel.CACHE_KINDS[policy.type] if isinstance(policy, CachePolicy) else None
        plan = _AgePlan()
        all_hist = sel.AgeHistogram() if getattr(policy, "max_size", None) is not None else None
        older_than = policy.older_than
        # A size cap may take entries younger than older_than: mark every eligible one then.
        mark_from = -math.inf if all_hist is not None or older_than is None else older_than
        scratch = _Run(0, None)  # pass 1 skips are counted again in pass 2; count them once
        self.open_files.refresh()
        judge = self._judge_fn(policy, kind, scratch, now, plan)
        enters = self._enters_fn(policy, kind)
        dev, hist = o.dev, plan.hist
        is_dir_mode, freed = stat_mod.S_ISDIR, sel.freed_bytes
        order_mul, order_mask = walker.ORDER_MUL, walker.ORDER_MASK

        def problem(p: walker.WalkProblem) -> None:
            scratch.skip(p.reason, p.path, p.detail)

        for lst in walker.scan(o.fd, dev=dev, on_problem=problem, hook=self.hook, mnt=o.mnt):
            fd, prefix, pos, marks, order = lst.fd, lst.prefix, lst.pos, lst.marks, lst.order
            try:
                # The hot loop: one lstat per entry (fstatat on the directory fd), no
                # per-entry objects beyond the stat result.
                for dirent in lst.entries:
                    pos += 1
                    order = (order * order_mul ^ dirent.inode()) & order_mask  # walker.listing_order
                    name = dirent.name
                    path = prefix + name
                    if below and path in below:
                        continue  # a mount point: never entered nor judged
                    try:
                        st = dirent.stat(follow_symlinks=False)
                    except OSError as exc:
                        problem(walker.WalkProblem(path, walker.classify_error(exc), exc.strerror or ""))
                        continue
                    if st.st_dev != dev:
                        scratch.skip("other-filesystem", path, "on another filesystem")
                        continue
                    is_dir = is_dir_mode(st.st_mode)
                    judged = judge(fd, name, path, st, is_dir)
                    if judged is None:
                        if is_dir:
                            if enters(name, path):
                                lst.pos, lst.marks, lst.order, lst.enter = pos, marks, order, (name, st)
                                break
                        elif kind is not None:
                            plan.total_bytes += freed(st)
                        continue
                    age_ts, nbytes, files, _unit = judged
                    age = now - age_ts
                    plan.total_bytes += nbytes
                    if all_hist is not None:
                        all_hist.add(age, nbytes, files)
                    if older_than is None or age >= older_than:
                        hist.add(age, nbytes, files)
                        if older_than is not None:
                            plan.expired_files += files
                            plan.expired_bytes += nbytes
                    if age >= mark_from:
                        if marks is None:
                            marks = bytearray()
                        byte = pos >> 3
                        if byte >= len(marks):
                            marks.extend(bytes(byte + 1 - len(marks)))
                        marks[byte] |= 1 << (pos & 7)
                else:
                    self._plan_dir(plan, lst, pos, marks, order, remove_dirs, now, older_than)
            except OSError as exc:  # reading the directory failed (e.g. removed under us)
                problem(walker.WalkProblem(lst.path or ".", walker.classify_error(exc), exc.strerror or ""))
                self._plan_dir(plan, lst, pos, marks, order, remove_dirs, now, older_than)
        plan.problems = dict(scratch.skipped)
        if all_hist is not None and plan.total_bytes > policy.max_size:
            plan.cap_need = plan.total_bytes - policy.max_size
            plan.cap_min_age, _f, _b = all_hist.cutoff_for(plan.cap_need)
        return plan

    @staticmethod
    def _plan_dir(plan: _AgePlan, lst: walker.Listing, count: int, marks: bytearray | None, order: int,
                  remove_dirs: bool, now: float, older_than: float | None) -> None:
        """A directory fully read in pass 1: remember it if pass 2 has anything to do there."""
        st = lst.st
        # Reading a directory bumps its atime, so directories are aged by mtime/ctime only.
        rmdir = bool(remove_dirs and lst.path and now - max(st.st_mtime, st.st_ctime) >= older_than)
        if marks or rmdir:
            plan.dirs.append(_DirMarks(lst.path, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, count, order,
                                       bytes(marks or b""), rmdir))

    def _delete_age(self, policy, o: OpenedRoot, mount: str, below: frozenset[str], plan: _AgePlan,
                    need: int | None, run: _Run, dry_run: bool, now: float) -> None:
        kind = sel.CACHE_KINDS[policy.type] if isinstance(policy, CachePolicy) else None
        older_than = policy.older_than
        if need is not None:
            min_age, _f, _b = plan.hist.cutoff_for(need)
            # Histogram buckets are ~3 % wide: never let one reach below older_than.
            min_age = max(min_age, older_than or 0.0)
        else:
            min_age = older_than if older_than is not None else math.inf
        state = _DeleteState(plan.cap_need)
        reason = sel.age_reason(policy, need is not None)
        cap_reason = f"{policy.type}: over max_size {format_bytes(getattr(policy, 'max_size', 0) or 0)}, oldest first"
        prefix = o.path.rstrip("/") + "/"
        judge = self._judge_fn(policy, kind, run, now, None)
        chain = walker.DirChain(o.fd, o.dev, self.hook)
        try:
            for rec in plan.dirs:  # in pass 1's post-order: a directory after its subdirectories
                try:
                    fd, dst = chain.open(rec.path)
                except OSError as exc:
                    run.skip_error(prefix + rec.path, exc)
                    continue
                if dst.st_ino != rec.ino:
                    run.skip("replaced", prefix + rec.path, "not the directory that was judged")
                    continue
                everything = (dst.st_mtime_ns, dst.st_ctime_ns) != (rec.mtime_ns, rec.ctime_ns)
                if rec.marks or everything:
                    done = self._delete_in_dir(
                        policy, o, mount, below, plan, need, run, dry_run, now, fd, rec,
                        None if everything else rec.marks, judge, min_age, state, reason, cap_reason, prefix)
                    if done:
                        return
                if rec.rmdir:
                    self._remove_empty_dir(policy, o, mount, chain, rec.path, dst, run, dry_run, now)
        finally:
            chain.close()

    def _delete_in_dir(self, policy, o: OpenedRoot, mount: str, below: frozenset[str], plan: _AgePlan,
                       need: int | None, run: _Run, dry_run: bool, now: float, fd: int, rec: _DirMarks,
                       marks: bytes | None, judge, min_age: float, state: _DeleteState, reason: str,
                       cap_reason: str, prefix: str) -> bool:
        """Pass 2 in one directory: re-judge the marked entries (all of them if marks is None)
        from a fresh lstat and delete those still due. True: the watermark run is done."""
        dev = o.dev
        dir_prefix = rec.path + "/" if rec.path else ""
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
                    name = dirent.name
                    relpath = dir_prefix + name
                    if below and relpath in below:
                        continue
                    path = prefix + relpath
                    try:
                        st = dirent.stat(follow_symlinks=False)
                    except OSError as exc:
                        run.skip_error(path, exc)
                        continue
                    if st.st_dev != dev:
                        run.skip("other-filesystem", path, "on another filesystem")
                        continue
                    is_dir = stat_mod.S_ISDIR(st.st_mode)
                    judged = judge(fd, name, relpath, st, is_dir)
                    if judged is None:
                        continue
                    age_ts, nbytes, files, is_unit = judged
                    age = now - age_ts
                    by_cap = False
                    if age < min_age:
                        # Not expired; a cache above max_size still loses its oldest entries.
                        if state.cap_left <= 0 or age < plan.cap_min_age:
                            continue
                        by_cap = True
                    if need is not None and self._reached(o, need, state.freed, dry_run, policy.low):
                        return True
                    if is_unit:
                        unit = walker.measure_unit(fd, name, dev, self.hook)
                        if self.open_files.any_open(unit.inodes):
                            run.skip("open", path)
                            continue
                    elif self.open_files.is_open(st.st_dev, st.st_ino):
                        run.skip("open", path)
                        continue
                    if not dry_run:
                        try:
                            if self.hook is not None:
                                self.hook("before_delete", relpath)
                            if is_unit:
                                walker.remove_tree_at(fd, name, dev, st.st_ino)
                            else:
                                os.unlink(name, dir_fd=fd)
                        except OSError as exc:
                            run.skip_error(path, exc)
                            continue
                    run.deleted(policy.name, mount, path, nbytes, files, cap_reason if by_cap else reason, age,
                                is_unit, None if dry_run else self.audit)
                    state.freed += nbytes
                    if by_cap:
                        state.cap_left -= nbytes
        except OSError as exc:  # reading the directory failed
            run.skip_error(prefix + rec.path, exc)
            return False
        if marks is not None and (pos, order) != (rec.count, rec.order):
            # Listed differently than in pass 1 (a change within one timestamp tick):
            # the marks may have pointed elsewhere, so judge every entry once more.
            return self._delete_in_dir(policy, o, mount, below, plan, need, run, dry_run, now, fd, rec, None,
                                       judge, min_age, state, reason, cap_reason, prefix)
        return False

    def _remove_empty_dir(self, policy: AgePolicy, o: OpenedRoot, mount: str, chain: walker.DirChain,
                          relpath: str, dst: os.stat_result, run: _Run, dry_run: bool, now: float) -> None:
        # dst was taken when the directory was opened, before its contents were cleaned;
        # reading a directory bumps its atime, so directories are aged by mtime/ctime only.
        if dry_run or now - max(dst.st_mtime, dst.st_ctime) < policy.older_than:
            return
        path = os.path.join(o.path, relpath)
        try:
            os.rmdir(relpath.rpartition("/")[2], dir_fd=chain.parent_fd)  # the kernel refuses a non-empty directory
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                run.skip_error(path, exc)
            return
        chain.forget_last()
        item = Item(path + "/", 0, 0, "empty directory", now - dst.st_mtime)
        self._audit(policy.name, mount, item)
        run.dirs += 1

    # ------------------------------------------------------------ helpers

    def _reached(self, o: OpenedRoot, need: int, freed: int, dry_run: bool, low: float) -> bool:
        """Watermark runs stop at `low`: by the filesystem's own count, or by what was freed."""
        if freed >= need:
            return True
        if dry_run:
            return False
        return usage_from_statvfs(os.fstatvfs(o.fd)).used_ratio <= low

    def _audit(self, policy: str, mount: str, item: Item) -> None:
        if self.audit is not None:
            self.audit.record(policy, mount, item.path, item.bytes, item.files, item.reason)


def write_blocked(o: OpenedRoot) -> str:
    """Why this process cannot delete below the root ('' when it can): a read-only mount (the
    systemd unit's ProtectSystem=/ProtectHome= make one), or no write permission."""
    if os.fstatvfs(o.fd).f_flag & os.ST_RDONLY:
        return f"{o.path} is read-only for trainguard (mounted read-only here)"
    if not os.access(o.path, os.W_OK | os.X_OK):
        return f"{o.path} is not writable for trainguard (uid {os.geteuid()})"
    return ""


def _take_until(plan: list[sel.Candidate], need: int) -> list[sel.Candidate]:
    out, total = [], 0
    for cand in plan:
        if total >= need:
            break
        out.append(cand)
        total += cand.bytes
    return out


def _is_symlink(st: os.stat_result) -> bool:
    import stat as _stat

    return _stat.S_ISLNK(st.st_mode)


def _describe_limit(limit) -> str:
    return f"{limit.files} files" if limit.files is not None else format_bytes(limit.bytes)


def describe(report: CleanupReport) -> str:
    """One line for logs and the CLI."""
    verb = "would free" if report.dry_run else "freed"
    if report.guard:
        return f"cleanup {report.policy}: stopped, nothing deleted: {report.guard}"
    where = ", ".join(report.mounts) or ", ".join(r.root for r in report.roots) or "no roots"
    line = f"cleanup {report.policy} ({report.trigger}) {verb} {format_bytes(report.bytes)} on {where} ({report.files} files)"
    if report.skipped:
        line += "; skipped " + ", ".join(f"{n} {reason}" for reason, n in sorted(report.skipped.items()))
    if report.blocked:
        line += "; cannot delete: " + "; ".join(report.blocked)
    return line


def findings_for(report: CleanupReport) -> list[Finding]:
    """What the alert path gets after a run: what was freed, or why the guard stopped it."""
    out: list[Finding] = []
    details = {
        "roots": [
            {"root": r.root, "mount": r.mount, "files": r.files, "bytes": r.bytes,
             "usage_before": r.usage_before, "usage_after": r.usage_after, "note": r.note}
            for r in report.roots
        ],
        "trigger": report.trigger,
        "skipped": dict(report.skipped),
    }
    labels = {"policy": report.policy}
    if report.blocked:
        out.append(Finding(
            key=f"cleanup.blocked:{report.policy}",
            severity=Severity.WARNING,
            summary=f"cleanup {report.policy} cannot delete: {'; '.join(report.blocked)}",
            details=details, labels=labels, value=float(len(report.blocked)),
            hint="give trainguard write access there: under the shipped systemd unit add the root to "
                 "ReadWritePaths= (systemctl edit trainguard, then restart); elsewhere remount it "
                 "read-write or fix its permissions",
        ))
    if report.guard:
        out.append(Finding(
            key=f"cleanup.guard:{report.policy}",
            severity=Severity.WARNING,
            summary=f"cleanup {report.policy} stopped, nothing deleted: {report.guard}",
            details=details, labels=labels,
            value=float(report.planned_files),
            hint=f"check it with: trainguard cleanup --dry-run --policy {report.policy}; "
                 "if the list is right, raise max_delete for this policy",
        ))
    elif report.files and not report.dry_run:
        mounts = report.mounts
        out.append(Finding(
            key=f"cleanup.report:{report.policy}",
            severity=Severity.INFO,
            summary=f"cleanup freed {format_bytes(report.bytes)} on {', '.join(mounts)} "
                    f"({report.policy}: {report.files} files)",
            details=details, labels={**labels, "mountpoint": mounts[0] if mounts else ""},
            value=float(report.bytes),
        ))
    return out
