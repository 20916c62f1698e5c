"""The daemon's side of trainguard.guard: what trainers did at save time becomes alerts and audit rows.

Each cycle the daemon drains <state dir>/guard-events.jsonl (trainguard.guardspool). A refused
save, a save in the fallback directory or a run stopped for space is a one-shot alert, like a
cleanup report; every checkpoint deleted by keep_last is a row in the cleanup audit log under
the policy name "guard", so `trainguard status` and the freed-bytes metric count it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from typing import Callable

from trainguard import guardspool
from trainguard.actions.cleanup.record.audit import AUDIT_RETENTION, AuditLog
from trainguard.actions.cleanup.safety.roots import mount_point_of
from trainguard.records import Finding, Severity
from trainguard.units import format_bytes

log = logging.getLogger(__name__)

POLICY = "guard"  # the audit log's policy column for what the guard did
MAX_BEATING = 1024  # processes whose last heartbeat step is kept
STALE_AFTER = 86400.0  # events older than this (spooled while no daemon ran) are audited, not alerted
# The alert kinds the events become, f"guard.{event.kind}" (declared for the renderer check, docs/i18n.md).
FINDING_KINDS = ("guard.wont-fit", "guard.stopped", "guard.fallback")
_SEVERITY = {"wont-fit": Severity.CRITICAL, "stopped": Severity.CRITICAL, "fallback": Severity.WARNING}
_HINTS = {
    "wont-fit": "free space on that filesystem (trainguard cleanup --dry-run shows what cleanup would take), "
                "lower keep_last, or give the save a fallback directory",
    "stopped": "the run saved and stopped cleanly; free space and resume from the last checkpoint",
    "fallback": "the checkpoint is in the fallback directory; free space on the primary one",
}


def _mount_of(path: str) -> str:
    return mount_point_of(os.path.dirname(path))  # the checkpoint itself may not exist


def finding_for(event: guardspool.GuardEvent) -> Finding | None:
    """The alert for an event; None for a plain save (pruned or not: that is the audit log's)."""
    severity = _SEVERITY.get(event.kind)
    if severity is None:
        return None
    mount = _mount_of(event.path)
    what = {
        "wont-fit": f"checkpoint save refused, it would not fit: {event.path}",
        "stopped": f"training run stopped for disk space after saving: {event.path}",
        "fallback": f"checkpoint saved in the fallback directory: {event.path}",
    }[event.kind]
    if event.avail is not None:
        what += f" ({format_bytes(event.avail)} available on {mount})"
    return Finding(
        key=f"guard.{event.kind}:{event.path}", severity=severity, summary=what,
        details={"pid": event.pid, "source": event.source, "bytes": event.bytes, "avail": event.avail,
                 "reserve": event.reserve, "message": event.message, "ts": event.ts},
        labels={"mountpoint": mount, "path": event.path}, value=float(event.bytes), hint=_HINTS[event.kind],
    )


class GuardInbox:
    """Drains the spool on the daemon's cycle thread; the audit connection is opened on first use."""

    def __init__(self, state_dir: str, connect: Callable[[], sqlite3.Connection], *,
                 clock: Callable[[], float] = time.time, audit_retention: float = AUDIT_RETENTION):
        self.spool = os.path.join(state_dir, guardspool.GUARD_EVENTS_FILE)
        self.connect = connect
        self.clock = clock
        self.audit_retention = audit_retention
        self._audit: AuditLog | None = None
        # pid -> the last step a trainguard.guard.progress() heartbeat reported (the progress watchdog's)
        self.steps: dict[int, int] = {}

    def drain(self) -> list[Finding]:
        try:
            events, bad = guardspool.drain(self.spool)
        except OSError as exc:
            log.warning("cannot read %s: %s", self.spool, exc.strerror)
            return []
        if bad:
            log.warning("%s: skipped %d malformed line(s)", self.spool, bad)
        beats = [e for e in events if e.kind == "progress"]
        for e in beats:
            self.steps[e.pid] = e.step
        if len(self.steps) > MAX_BEATING:  # the oldest processes first: they are the likeliest gone
            self.steps = dict(list(self.steps.items())[-MAX_BEATING:])
        events = [e for e in events if e.kind != "progress"]
        if not events:
            return []
        self._record(events)
        now = self.clock()
        return [f for e in events if now - e.ts < STALE_AFTER and (f := finding_for(e)) is not None]

    def _record(self, events: list[guardspool.GuardEvent]) -> None:
        if self._audit is None:
            self._audit = AuditLog(self.connect(), clock=self.clock, retention=self.audit_retention)
        for e in events:
            mount = _mount_of(e.path)
            for path, nbytes in e.removed:
                self._audit.record(POLICY, mount, path, nbytes, 1, f"keep_last after saving {e.path} (pid {e.pid})")
            if e.kind != "saved":
                self._audit.record(POLICY, mount, e.path, 0, 0, f"{e.kind} (pid {e.pid}): {e.message}"[:500])
        self._audit.flush()

    def close(self) -> None:
        if self._audit is not None:
            self._audit.flush()
            self._audit.conn.close()
            self._audit = None
