"""The cleanup audit log: every deletion (time, policy, path, bytes, reason) in SQLite.

Rows are written in batches inside one transaction per batch, so a run deleting a
million files does not pay a commit per file. Per-policy totals are kept in their
own table, so pruning old rows never changes "freed in total".
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Callable

SCHEMA = """
CREATE TABLE IF NOT EXISTS cleanup_audit (
    ts REAL NOT NULL,
    policy TEXT NOT NULL,
    mount TEXT NOT NULL,
    path TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    files INTEGER NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS cleanup_audit_ts ON cleanup_audit (ts);
CREATE INDEX IF NOT EXISTS cleanup_audit_policy_ts ON cleanup_audit (policy, ts);
CREATE TABLE IF NOT EXISTS cleanup_totals (
    policy TEXT PRIMARY KEY,
    files INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    last_run REAL
);
"""


@dataclass(frozen=True, slots=True)
class Freed:
    policy: str
    files_24h: int
    bytes_24h: int
    files_total: int
    bytes_total: int
    last_run: float | None


class AuditLog:
    """Use one instance per thread (sqlite3 connections are not shared across threads)."""

    def __init__(self, conn: sqlite3.Connection, *, retention: float = 90 * 86400.0,
                 clock: Callable[[], float] = time.time, batch: int = 2000):
        self.conn = conn
        self.retention = retention
        self.clock = clock
        self.batch = batch
        self._pending: list[tuple[float, str, str, str, int, int, str]] = []
        self._totals: dict[str, list[int]] = {}
        conn.executescript(SCHEMA)

    def record(self, policy: str, mount: str, path: str, nbytes: int, files: int, reason: str) -> None:
        self._pending.append((self.clock(), policy, mount, path, nbytes, files, reason))
        total = self._totals.setdefault(policy, [0, 0])
        total[0] += files
        total[1] += nbytes
        if len(self._pending) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if not self._pending and not self._totals:
            return
        rows, totals = self._pending, self._totals
        self._pending, self._totals = [], {}
        now = self.clock()
        with self.conn:
            self.conn.executemany("INSERT INTO cleanup_audit VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            for policy, (files, nbytes) in totals.items():
                self.conn.execute(
                    "INSERT INTO cleanup_totals (policy, files, bytes, last_run) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(policy) DO UPDATE SET files = files + excluded.files, "
                    "bytes = bytes + excluded.bytes, last_run = excluded.last_run",
                    (policy, files, nbytes, now),
                )

    def prune(self) -> None:
        with self.conn:
            self.conn.execute("DELETE FROM cleanup_audit WHERE ts < ?", (self.clock() - self.retention,))

    def freed(self, *, window: float = 86400.0) -> list[Freed]:
        """Freed files/bytes per policy: in the last `window` seconds and in total."""
        self.flush()
        since = self.clock() - window
        recent = {
            policy: (files, nbytes)
            for policy, files, nbytes in self.conn.execute(
                "SELECT policy, SUM(files), SUM(bytes) FROM cleanup_audit WHERE ts >= ? GROUP BY policy", (since,)
            )
        }
        out = []
        for policy, files, nbytes, last_run in self.conn.execute(
            "SELECT policy, files, bytes, last_run FROM cleanup_totals ORDER BY policy"
        ):
            f24, b24 = recent.get(policy, (0, 0))
            out.append(Freed(policy, f24 or 0, b24 or 0, files, nbytes, last_run))
        return out

    def freed_on(self, mount: str, since: float) -> list[tuple[str, int, int]]:
        """(policy, files, bytes) freed on one mount since a time: for "what trainguard already did"."""
        self.flush()
        return list(self.conn.execute(
            "SELECT policy, SUM(files), SUM(bytes) FROM cleanup_audit WHERE mount = ? AND ts >= ? "
            "GROUP BY policy ORDER BY policy", (mount, since),
        ))

    def entries(self, policy: str | None = None, limit: int = 100) -> list[tuple[float, str, str, int, str]]:
        self.flush()
        sql = "SELECT ts, policy, path, bytes, reason FROM cleanup_audit"
        args: tuple = ()
        if policy is not None:
            sql += " WHERE policy = ?"
            args = (policy,)
        sql += " ORDER BY ts DESC, rowid DESC LIMIT ?"
        return list(self.conn.execute(sql, args + (limit,)))
