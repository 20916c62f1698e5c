"""Builds the daemon's workers from the configuration, and joins their output to the cycle's events.

Each builder returns None when the configuration does not ask for the worker, so a daemon that never
cleans up or mirrors does not load those modules at all.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from trainguard import config as configmod
from trainguard.clock import Clock
from trainguard.diagnosis.stall import StallDiagnoser
from trainguard.notify import Notifier
from trainguard.notify.worker import OutboxNotifier
from trainguard.records import AlertEvent, AlertStatus, Finding
from trainguard.store.state import StateDb
from trainguard.store.writes import WriteHealth

if TYPE_CHECKING:
    from trainguard.actions.cleanup.worker import CleanupWorker
    from trainguard.actions.mirror.worker import MirrorWorker

CLEANUP_NOTE_FOR = 6 * 3600.0  # a threshold alert mentions a cleanup on its mount for this long


def make_diagnoser(cfg: configmod.Config, clock: Clock) -> StallDiagnoser:
    return StallDiagnoser(cfg.general.proc_root, window=cfg.gpu.for_, py_spy=cfg.gpu.py_spy, clock=clock.time)


def start_cleanup(cfg: configmod.Config, connect: Callable[[], sqlite3.Connection],
                  clock: Clock) -> CleanupWorker | None:
    policies = [p for p in cfg.cleanup if p.enabled]
    if not policies:
        return None
    # Loaded only when a policy is on: a daemon that never cleans up need not carry the walker and policies.
    from trainguard.actions.cleanup.worker import CleanupWorker, make_runner_factory

    worker = CleanupWorker(make_runner_factory(policies, connect, cfg.general.proc_root, cfg.mirror,
                                               audit_retention=cfg.history.audit_retention), clock=clock.time)
    worker.start()
    return worker


def start_mirror(cfg: configmod.Config, connect: Callable[[], sqlite3.Connection],
                 clock: Clock) -> MirrorWorker | None:
    mirrors = [m for m in cfg.mirror if m.enabled]
    if not mirrors:
        return None
    from trainguard.actions.mirror.worker import (
        MirrorWorker,  # only a daemon that mirrors carries it
    )

    worker = MirrorWorker(mirrors, connect, clock)
    worker.start()
    return worker


def configure_outbox(notifiers: list[Notifier], cfg: configmod.Config, db: StateDb, clock: Clock,
                     writes: WriteHealth) -> None:
    """Alert delivery through the outbox, when notify targets are configured (apprise loads on first send)."""
    outbox = next((n for n in notifiers if isinstance(n, OutboxNotifier)), None)
    if outbox is not None:
        outbox.configure(cfg.notify, cfg.general.host)
    elif cfg.notify.targets:
        notifiers.append(OutboxNotifier(db, cfg.notify, cfg.general.host, clock=clock, writes=writes))


@dataclass
class CleanupNotes:
    """Cleanup results are one-shot messages (no pending/resolved), and a threshold alert on
    the same mount says what cleanup already did there (for CLEANUP_NOTE_FOR)."""

    notes: dict[str, tuple[float, str]] = field(default_factory=dict)  # mount -> (when, what cleanup did there)

    def join(self, events: list[AlertEvent], reports: list[Finding], now: float) -> list[AlertEvent]:
        out = list(events)
        for finding in reports:
            out.append(AlertEvent(AlertStatus.FIRING, finding, started_at=now, ts=now))
            mount = finding.labels.get("mountpoint")
            if mount and finding.key.startswith("cleanup.report:"):
                self.notes[mount] = (now, finding.summary)
        self.notes = {m: n for m, n in self.notes.items() if now - n[0] < CLEANUP_NOTE_FOR}
        for i, event in enumerate(out):
            mount = event.finding.labels.get("mountpoint")
            if mount in self.notes and event.finding.key.startswith("fs."):
                details = {**event.finding.details, "action_taken": self.notes[mount][1]}
                out[i] = replace(event, finding=replace(event.finding, details=details))
        return out
