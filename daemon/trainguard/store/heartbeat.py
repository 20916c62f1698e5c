"""Liveness for container health checks: the daemon stamps each completed cycle.

`trainguard health` (a Dockerfile HEALTHCHECK, a cron probe) reads the stamp from
the state db read-only and says whether the loop is alive: a daemon whose loop is
wedged stops stamping and turns unhealthy, like the systemd watchdog.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from trainguard.store import state

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


def check(state_dir: str, now: float, max_age: float) -> Health:
    conn = state.read_only(state_dir)
    if conn is None:
        return Health(False, f"no state database in {state_dir}: the daemon has not completed a cycle")
    try:
        row = conn.execute("SELECT ts, pid, status FROM heartbeat WHERE id = 1").fetchone()
    except sqlite3.OperationalError:
        row = None
    finally:
        conn.close()
    if row is None:
        return Health(False, f"no heartbeat in {state_dir}: the daemon has not completed a cycle")
    ts, pid, status = row
    age = now - ts
    if age > max_age:
        return Health(False, f"last cycle finished {age:.0f}s ago (limit {max_age:.0f}s), pid {pid}: loop stuck or stopped")
    return Health(True, f"ok: last cycle {age:.0f}s ago, pid {pid}: {status}")
