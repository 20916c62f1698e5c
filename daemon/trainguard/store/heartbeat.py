"""Liveness for container health checks: the daemon stamps each completed cycle.

`trainguard health` (a Dockerfile HEALTHCHECK, a cron probe) reads the stamp from
the state db read-only and says whether the loop is alive: a daemon whose loop is
wedged stops stamping and turns unhealthy, like the systemd watchdog. Only the
daemon stamps (`run --once` does not), and the state directory's lock says whether
the stamping process still runs: a stopped daemon is never reported as alive.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from trainguard.store import lock, state

SCHEMA = """
CREATE TABLE IF NOT EXISTS heartbeat (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    ts REAL NOT NULL,      -- wall time the last cycle completed
    pid INTEGER NOT NULL,
    status TEXT NOT NULL   -- the STATUS line: "3 mounts, 2 GPUs, 1 firing"
);
"""


class Heartbeat:
    def __init__(self, conn: sqlite3.Connection, pid: int):
        self.conn = conn
        self.pid = pid
        conn.executescript(SCHEMA)

    def beat(self, ts: float, status: str) -> None:
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO heartbeat (id, ts, pid, status) VALUES (1, ?, ?, ?)",
                              (ts, self.pid, status))


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    message: str


@dataclass(frozen=True, slots=True)
class DaemonInfo:
    """What a reader can tell about the daemon of a state directory."""

    running: bool | None       # a process holds the state directory's lock now; None: we may not look
    pid: int | None            # the lock holder's, else the last stamping daemon's
    last_cycle: float | None   # wall time of the last completed daemon cycle
    status: str | None         # its STATUS line
    locked: bool               # the directory has a lock file (False: written by a version without one)


def read(state_dir: str, conn: sqlite3.Connection | None = None) -> DaemonInfo:
    """The daemon's state from the lock and the heartbeat; conn: an open read-only connection to reuse."""
    held = lock.holder(state_dir)
    own = conn is None
    if own:
        conn = state.read_only(state_dir)
    row = None
    if conn is not None:
        try:
            row = conn.execute("SELECT ts, pid, status FROM heartbeat WHERE id = 1").fetchone()
        except sqlite3.OperationalError:
            row = None
        finally:
            if own:
                conn.close()
    ts, pid, status = row if row else (None, None, None)
    return DaemonInfo(running=held.running, pid=held.pid if held.running or held.pid else pid, last_cycle=ts,
                      status=status, locked=held.pid is not None or bool(held.running))


def check(state_dir: str, now: float, max_age: float) -> Health:
    conn = state.read_only(state_dir)
    if conn is None:
        return Health(False, f"no state database in {state_dir}: the daemon has not completed a cycle")
    try:
        info = read(state_dir, conn)
    finally:
        conn.close()
    if info.last_cycle is None:
        return Health(False, f"no heartbeat in {state_dir}: the daemon has not completed a cycle")
    age = now - info.last_cycle
    if info.locked and not info.running:
        return Health(False, f"no daemon running on {state_dir}: PID {info.pid} stopped; "
                             f"its last cycle finished {age:.0f}s ago")
    if age > max_age:
        return Health(False, f"last cycle finished {age:.0f}s ago (limit {max_age:.0f}s), pid {info.pid}: "
                             "loop stuck or stopped")
    return Health(True, f"ok: last cycle {age:.0f}s ago, pid {info.pid}: {info.status}")
