"""Whether trainguard's own state can be written, so a full disk degrades the daemon instead of blinding it.

The state database usually lives on a disk that trainguard watches. When that disk fills,
every write fails with "database or disk is full"; the daemon must keep detecting from its
in-memory history and keep delivering alerts (from an in-memory outbox) exactly then. Each
writer reports here through attempt(); problem() says what cannot be written, since when
and why, and becomes an alert of its own that resolves when writes succeed again.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import dataclass
from typing import Callable

from trainguard.records import Finding, Severity

log = logging.getLogger(__name__)

# "database or disk is full", "disk I/O error", "attempt to write a readonly database", "unable to open":
# the write did not happen and the database itself is fine. Other errors (a bug in a statement) still raise.
_WRITE_ERRORS = (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY,
                 sqlite3.SQLITE_CANTOPEN) if hasattr(sqlite3, "SQLITE_FULL") else ()  # Python >= 3.11
_WRITE_MESSAGES = ("disk is full", "disk i/o error", "readonly database", "unable to open")


def is_disk_error(exc: BaseException) -> bool:
    """A full, read-only or failing disk, not a damaged or misplaced file (which is "unable to open")."""
    return is_write_error(exc) and "unable to open" not in str(exc).lower()


def is_write_error(exc: BaseException) -> bool:
    """True for the errors a full, read-only or failing disk causes."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and _WRITE_ERRORS:
        return (code & 0xFF) in _WRITE_ERRORS
    return any(m in str(exc).lower() for m in _WRITE_MESSAGES)


@dataclass(frozen=True, slots=True)
class WriteProblem:
    since: float                 # wall time of the first failed write in this episode
    error: str                   # the last error, as SQLite says it
    parts: tuple[str, ...]       # what could not be written: history, alerts, outbox, heartbeat, cycles, ...


class WriteHealth:
    """Failed writes per part of the state, shared by the cycle and the delivery threads."""

    def __init__(self, path: str, clock: Callable[[], float]):
        self.path = path
        self.clock = clock
        self._lock = threading.Lock()
        self._failing: dict[str, tuple[float, str]] = {}

    def failed(self, part: str, exc: BaseException) -> None:
        with self._lock:
            first = not self._failing
            since = self._failing.get(part, (self.clock(), ""))[0]
            self._failing[part] = (since, str(exc))
        if first:
            log.error("cannot write the state database %s (%s): %s; detecting from memory and keeping "
                      "undelivered alerts in memory until it can be written again", self.path, part, exc)

    def succeeded(self, part: str) -> None:
        if part not in self._failing:
            return
        with self._lock:
            self._failing.pop(part, None)
            recovered = not self._failing
        if recovered:
            log.warning("the state database %s can be written again", self.path)

    def attempt(self, part: str, fn: Callable[..., object], *args, **kwargs) -> bool:
        """fn(*args, **kwargs); False when it failed with a write error (recorded, not raised)."""
        try:
            fn(*args, **kwargs)
        except sqlite3.OperationalError as exc:
            if not is_write_error(exc):
                raise
            self.failed(part, exc)
            return False
        self.succeeded(part)
        return True

    def problem(self) -> WriteProblem | None:
        with self._lock:
            if not self._failing:
                return None
            since = min(s for s, _ in self._failing.values())
            last = max(self._failing.values())[1]
            return WriteProblem(since, last, tuple(sorted(self._failing)))


def unwritable_finding(problem: WriteProblem, state_dir: str, now: float) -> Finding:
    """The alert that trainguard's own state cannot be written: where, why, what is kept meanwhile."""
    return Finding(
        key=f"state.unwritable:{state_dir}",
        severity=Severity.WARNING,
        summary=f"trainguard cannot write its state in {state_dir}: {problem.error}",
        details={"state_dir": state_dir, "error": problem.error, "parts": list(problem.parts),
                 "since": problem.since},
        labels={"state_dir": state_dir},
        hint=(f"free space on the filesystem holding {state_dir}, or move general.state_dir to another disk; "
              "until then history and undelivered alerts are kept in memory only (a restart loses them)"),
    )
