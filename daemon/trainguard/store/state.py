"""The state database: one SQLite file (WAL) under the state directory.

History, alert states, the cleanup audit log and the notification outbox all live
here, so a restart loses none of them. Each component opens its own connection
(one per thread) and creates its own tables. A database that cannot be opened or
fails its integrity check is moved aside and a fresh one started: a corrupt file
must never turn the daemon into a crash loop.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from trainguard.store.writes import is_disk_error

log = logging.getLogger(__name__)

DB_NAME = "state.db"


def fallback_state_dir() -> str:
    """Where an unprivileged user keeps state when the configured dir is not writable."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "trainguard")


class StateDirError(Exception):
    """An explicitly given state directory that cannot be used."""


def _unusable(path: str) -> str | None:
    """Why path cannot hold the state database, or None when it can."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return exc.strerror or str(exc)
    if not os.access(path, os.W_OK | os.X_OK):
        return "not writable by this user"
    return None


def usable_dir(path: str) -> bool:
    return _unusable(path) is None


def choose_state_dir(configured: str, *, explicit: bool = False) -> str:
    """The state directory to write to. The implicit one (general.state_dir) falls back to
    $XDG_STATE_HOME/trainguard, then /tmp/trainguard-UID, with a warning; an explicit one
    (--state-dir) that cannot be used raises StateDirError: the user asked for that place."""
    why = _unusable(configured)
    if why is None:
        return configured
    if explicit:
        raise StateDirError(f"--state-dir {configured}: cannot use it as the state directory ({why})")
    fallback = fallback_state_dir()
    if not usable_dir(fallback):
        fallback = os.path.join(tempfile.gettempdir(), f"trainguard-{os.getuid()}")
        Path(fallback).mkdir(parents=True, exist_ok=True)
    log.warning("state dir %s is not writable; using %s instead", configured, fallback)
    return fallback


# How much of the file is checked on opening. quick_check reads every page: the daemon's start pays it
# once (a run of weeks follows); a one-off command (`cleanup`, `mirror`) would pay it every call, growing
# with the audit log and history (0.14 s at 90 MiB), so it reads the header and schema only. A page
# damaged past them then fails that command's writes, and the daemon's next start moves the file aside.
FULL, SCHEMA = "full", "schema"


class StateDb:
    def __init__(self, state_dir: str, *, check: str | None = FULL):
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, DB_NAME)
        if check is not None:
            self._check_or_move_aside(check)

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process kill
        conn.execute("PRAGMA busy_timeout=10000")
        # SQLite's default page cache is up to 2 MiB per connection; the daemon keeps several open for
        # weeks while history grows to tens of MiB. The pages it touches (the newest rows) fit in less.
        conn.execute("PRAGMA cache_size=-256")
        return conn

    def _check_or_move_aside(self, check: str) -> None:
        if not os.path.exists(self.path):
            return
        try:
            conn = sqlite3.connect(self.path, timeout=10.0)
            try:
                if check == FULL:
                    row = conn.execute("PRAGMA quick_check").fetchone()
                else:  # "file is not a database" and a damaged schema raise here
                    row = ("ok",) if conn.execute("SELECT count(*) FROM sqlite_master").fetchone() else None
            finally:
                conn.close()
            if row and row[0] == "ok":
                return
            reason = f"integrity check failed: {row[0] if row else 'no answer'}"
        except sqlite3.DatabaseError as exc:
            if is_disk_error(exc):
                return  # a full or read-only disk says nothing about the file: never move a good one aside
            reason = str(exc)
        aside = f"{self.path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}"
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(self.path + suffix):
                os.replace(self.path + suffix, aside + suffix)
        log.warning("state database %s is unusable (%s); moved it to %s and started a fresh one",
                    self.path, reason, aside)


def read_only(state_dir: str) -> sqlite3.Connection | None:
    """A read-only connection for `trainguard status`, or None when there is no database."""
    path = os.path.join(state_dir, DB_NAME)
    if not os.path.exists(path):
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")
        return conn
    except sqlite3.DatabaseError:
        return None
