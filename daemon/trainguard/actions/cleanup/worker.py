"""Runs cleanup policies on a background thread, fed the latest snapshot by the daemon.

submit() never blocks: it replaces the pending snapshot and wakes the thread. A scan
of a huge tree therefore delays only the next cleanup decision, never sampling or
alerts. Findings produced by runs are collected for the daemon to drain each cycle.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from typing import Callable, Sequence

from trainguard.actions.cleanup.record.audit import AuditLog
from trainguard.actions.cleanup.runner import (
    CleanupReport,
    CleanupRunner,
    Policy,
    findings_for,
)
from trainguard.config import Mirror
from trainguard.records import Finding, FsSample, Snapshot
from trainguard.sources.fs import usage_from_statvfs
from trainguard.sources.mounts import containing_mount

log = logging.getLogger(__name__)

# A policy whose watermark run could not reach `low` (nothing more it may delete) is not rescanned
# every cycle; one that freed what it could within max_delete goes on at the next.
WATERMARK_RETRY = 300.0


def sample_for_path(snapshot: Snapshot | None, path: str) -> FsSample | None:
    """The snapshot's sample of the filesystem holding path (longest mount point prefix)."""
    if snapshot is None:
        return None
    mount = containing_mount(path, [sample.mount for sample in snapshot.filesystems])
    return next((sample for sample in snapshot.filesystems if sample.mount is mount), None)


class Scheduler:
    """Decides which policies are due: pure apart from the statvfs fallback for unwatched roots."""

    def __init__(self, runner: CleanupRunner, *, statvfs: Callable[[str], os.statvfs_result] = os.statvfs):
        self.runner = runner
        self.statvfs = statvfs
        self.last_run: dict[str, float] = {}
        self.last_watermark: dict[str, float] = {}
        self.draining: set[str] = set()  # watermark runs cut short (max_delete): the next goes on to low

    def due(self, snapshot: Snapshot | None, now: float) -> list[tuple[Policy, str]]:
        out = []
        for policy in self.runner.policies.values():
            if not policy.enabled:
                continue
            # A due watermark wins over a due schedule: the disk is filling, and the schedule's plain run
            # may be refused whole by max_delete; the schedule stays due for a cycle without an emergency.
            if self._watermark_due(policy, snapshot, now):
                out.append((policy, "watermark"))
            elif policy.schedule is not None and now - self.last_run.get(policy.name, -1e18) >= policy.schedule:
                out.append((policy, "schedule"))
        return out

    def _watermark_due(self, policy: Policy, snapshot: Snapshot | None, now: float) -> bool:
        if not policy.watermark or now - self.last_watermark.get(policy.name, -1e18) < WATERMARK_RETRY / 10:
            return False
        # Started at `high`; once cut short by max_delete it goes on below high, down to `low`.
        threshold = policy.low if policy.name in self.draining else policy.high
        return any(self._at_or_above(snapshot, root, threshold) for root in self.runner.roots_of(policy))

    def _at_or_above(self, snapshot: Snapshot | None, root: str, ratio: float) -> bool:
        sample = sample_for_path(snapshot, root)
        if sample is not None and (not sample.responsive or sample.usage is None):
            return False  # never scan a filesystem whose probe hangs or fails
        if sample is not None and sample.mount.mount_point != "/":
            usage = sample.usage
        else:
            try:  # not watched (or only "/" matched): ask the filesystem itself, on this thread
                usage = usage_from_statvfs(self.statvfs(root))
            except OSError:
                return False
        return usage.used_ratio >= ratio

    def ran(self, report: CleanupReport, now: float) -> None:
        if report.trigger != "watermark":  # a watermark run frees only its need: the schedule stays due
            self.last_run[report.policy] = now
        else:
            reached = all(r.usage_after is None or r.usage_after <= self.runner.policies[report.policy].low
                          for r in report.roots)
            if not reached and report.files and report.bytes < report.needed_bytes:
                self.draining.add(report.policy)  # cut short (max_delete): it goes on at the next cycle
                self.last_watermark[report.policy] = now - WATERMARK_RETRY / 10
                return
            self.draining.discard(report.policy)
            # Try again soon if it worked; back off if there was nothing left to delete.
            self.last_watermark[report.policy] = now if reached else now + WATERMARK_RETRY


class CleanupWorker:
    """The daemon's cleanup thread. make_runner runs on that thread (sqlite connections stay there)."""

    def __init__(self, make_runner: Callable[[], CleanupRunner], *, clock: Callable[[], float] = time.time,
                 idle_wake: float = 60.0):
        self._make_runner = make_runner
        self._clock = clock
        self._idle_wake = idle_wake
        self._snapshot: Snapshot | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._submitted = self._handled = 0  # snapshots handed in; the last one whose due policies ran
        self._findings: collections.deque[Finding] = collections.deque(maxlen=1000)
        self.reports: collections.deque[CleanupReport] = collections.deque(maxlen=100)
        self._thread = threading.Thread(target=self._loop, name="trainguard-cleanup", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._snapshot = snapshot
            self._submitted += 1
        self._wake.set()

    def settle(self) -> None:
        """Wait until the policies the last snapshot made due have run (`run --once`: its one cycle's
        cleanup, reported in that cycle, rather than cut short by the exit)."""
        with self._settled:
            self._settled.wait_for(lambda: self._handled >= self._submitted or not self._thread.is_alive())

    def drain(self) -> list[Finding]:
        out = []
        while self._findings:
            out.append(self._findings.popleft())
        return out

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        runner = self._make_runner()
        scheduler = Scheduler(runner)
        try:
            while not self._stop.is_set():
                self._wake.wait(self._idle_wake)
                self._wake.clear()
                if self._stop.is_set():
                    break
                with self._lock:
                    snapshot, taken = self._snapshot, self._submitted
                self._run_due(runner, scheduler, snapshot)
                with self._settled:
                    self._handled = taken
                    self._settled.notify_all()
        finally:
            with self._settled:
                self._handled = self._submitted  # settle() never waits for a thread that ended
                self._settled.notify_all()
            if runner.audit is not None:
                runner.audit.flush()
                runner.audit.conn.close()

    def _run_due(self, runner: CleanupRunner, scheduler: Scheduler, snapshot: Snapshot | None) -> None:
        for policy, trigger in scheduler.due(snapshot, self._clock()):
            if self._stop.is_set():
                break
            try:
                report = runner.run(policy, trigger=trigger)
            except Exception:  # one broken policy must not stop the others
                log.exception("cleanup %s failed", policy.name)
                continue
            scheduler.ran(report, self._clock())
            self.reports.append(report)
            self._findings.extend(findings_for(report))


def make_runner_factory(policies: Sequence[Policy], connect: Callable[[], object], proc_root: str = "/proc",
                        mirrors: Sequence[Mirror] = (), *, audit_retention: float):
    """A make_runner for CleanupWorker: audit connection opened on the worker thread.
    mirrors: the config's [[mirror]] list, for only_if_mirrored."""

    def make() -> CleanupRunner:
        return CleanupRunner(policies, audit=AuditLog(connect(), retention=audit_retention), proc_root=proc_root,
                             mirrors=mirrors)

    return make
